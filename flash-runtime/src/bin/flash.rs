//! The `flash` command: see `flash --help` and `flash_runtime::cli`.

#![deny(unsafe_code)]

fn main() -> std::process::ExitCode {
    flash_runtime::cli::main()
}
