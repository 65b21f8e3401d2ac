//! Loading `.flash` files from disk: one file, or every `*.flash` file of a folder (as the
//! example variants in `examples/variants` are read by the tests, the GPU check and the CLI).

use std::path::{Path, PathBuf};

use crate::spec::VariantSpec;

/// Reads, parses and validates one `.flash` file. On error, the rendered diagnostics, each
/// pointing at `file:line:col` (or the read error, naming the file).
pub fn load_flash_file(path: &Path) -> Result<Vec<VariantSpec>, String> {
    crate::parse::parse_file(path)
}

/// The `*.flash` files directly inside `dir`, sorted by file name.
pub fn flash_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| format!("error: cannot read {}: {e}\n", dir.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|e| format!("error: cannot read {}: {e}\n", dir.display()))?
            .path();
        if path.extension().is_some_and(|x| x == "flash") {
            files.push(path);
        }
    }
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(files)
}

/// Every `*.flash` file directly inside `dir`, sorted by file name, with its declarations in
/// file order. Stops at the first file that does not load (see [`load_flash_file`]).
pub fn load_flash_dir(dir: &Path) -> Result<Vec<(PathBuf, Vec<VariantSpec>)>, String> {
    flash_files(dir)?
        .into_iter()
        .map(|path| {
            let specs = load_flash_file(&path)?;
            Ok((path, specs))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn examples_load_sorted_by_file_name() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/variants");
        let loaded = load_flash_dir(&dir).unwrap();
        assert!(loaded.len() >= 9, "found only {} files", loaded.len());
        let names: Vec<_> = loaded.iter().map(|(p, _)| p.file_name().unwrap()).collect();
        assert!(names.windows(2).all(|w| w[0] < w[1]), "{names:?}");
        assert!(loaded.iter().all(|(_, specs)| !specs.is_empty()));
    }

    #[test]
    fn errors_name_the_file() {
        let dir = std::env::temp_dir().join(format!("flash-files-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.flash"), "A { head_dim: 64, dtype: f16 }").unwrap();
        std::fs::write(dir.join("b.flash"), "B { head_dim: 12, dtype: f16 }").unwrap();
        std::fs::write(dir.join("notes.txt"), "not a variant").unwrap();
        let err = load_flash_dir(&dir).unwrap_err();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(err.contains("b.flash:1:"), "{err}");
        let err = load_flash_dir(&dir.join("missing")).unwrap_err();
        assert!(
            err.contains("cannot read") && err.contains("missing"),
            "{err}"
        );
    }
}
