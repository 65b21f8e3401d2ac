//! The one error type of the runtime.
//!
//! Every failure a user can cause or meet (a missing library, a kernel NVRTC rejects, an
//! unreadable cache) is a value of [`FlashError`]; the runtime never panics on them. Messages are
//! lower case and say what was looked for and where, so that they can be acted on without a
//! debugger.

use std::fmt::Write as _;
use std::path::PathBuf;

/// Errors of the flash runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FlashError {
    /// A CUDA library (`nvrtc`, `cuda`) could not be found or loaded.
    #[error("{}", render_not_found(lib, searched, hint))]
    LibraryNotFound {
        /// The library's short name (`nvrtc`, `cuda`).
        lib: String,
        /// Every path that was tried, in order (bare names for the dynamic loader's own search).
        searched: Vec<PathBuf>,
        /// What to do about it.
        hint: String,
    },

    /// NVRTC rejected a kernel; `log` is NVRTC's whole log.
    #[error("nvrtc failed to compile kernel `{kernel}`:\n{log}")]
    Compile {
        /// The kernel's name (`CudaSource::kernel_name`).
        kernel: String,
        /// NVRTC's program log, verbatim (errors and warnings with line numbers).
        log: String,
    },

    /// An NVRTC call other than the compilation itself failed.
    #[error("nvrtc: {0}")]
    Nvrtc(String),

    /// A CUDA driver call failed.
    #[error("cuda driver: {0}")]
    Driver(String),

    /// A file system operation failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done, as a verb (`reading`, `writing`, `creating`, ...); the
        /// message reads `{op} {path}: {source}`.
        op: &'static str,
        /// The file or directory it was done to.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// A `.flash` file or declaration did not parse or validate; the message holds the rendered
    /// diagnostics.
    #[error("{0}")]
    Parse(String),

    /// The planner rejected a variant/configuration pair.
    #[error("cannot plan `{variant}`: {message}")]
    Plan {
        /// The variant's name.
        variant: String,
        /// Why the planner refused it (e.g. a tile that does not fit shared memory).
        message: String,
    },

    /// A caller passed something the runtime cannot use.
    #[error("{0}")]
    Invalid(String),
}

impl FlashError {
    /// The planner's refusal of `variant` (any of `flash_dsl`'s planning errors).
    pub(crate) fn plan(variant: &str, e: impl std::fmt::Display) -> Self {
        FlashError::Plan {
            variant: variant.to_string(),
            message: e.to_string(),
        }
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        FlashError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

fn render_not_found(lib: &str, searched: &[PathBuf], hint: &str) -> String {
    let mut s = format!("could not find the `{lib}` library; looked for:");
    for p in searched {
        let _ = write!(s, "\n  {}", p.display());
    }
    if !hint.is_empty() {
        let _ = write!(s, "\n{hint}");
    }
    s
}

/// Result alias of the runtime.
pub type Result<T, E = FlashError> = std::result::Result<T, E>;
