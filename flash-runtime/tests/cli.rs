//! The `flash` binary: exit codes, diagnostics, cache commands, and the example variants.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn flash(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flash"))
        .args(args)
        .output()
        .unwrap()
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/variants")
}

#[test]
fn parse_error_prints_line_col_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("bad.flash");
    std::fs::write(&f, "pub Bad {\n    head_dim: 100,\n    dtype: bf16,\n}\n").unwrap();
    for cmd in ["gen", "plan", "compile"] {
        let o = flash(&[cmd, f.to_str().unwrap()]);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{cmd}: {err}");
        assert!(
            err.contains("bad.flash:2:"),
            "{cmd}: diagnostics carry line:col:\n{err}"
        );
        assert!(
            err.contains("head_dim: 100"),
            "{cmd}: the offending line is shown:\n{err}"
        );
    }
}

#[test]
fn unknown_name_lists_the_declarations() {
    let o = flash(&[
        "gen",
        examples().join("causal.flash").to_str().unwrap(),
        "--name",
        "Nope",
    ]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err.contains("no declaration named `Nope`") && err.contains("Causal"),
        "{err}"
    );
}

#[test]
fn cache_dir_list_clear() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let o = flash(&["cache", "dir", "--cache-dir", root]);
    assert!(o.status.success());
    assert_eq!(text(&o).0.trim(), dir.path().join("v1").to_str().unwrap());
    let o = flash(&["cache", "list", "--cache-dir", root]);
    assert!(o.status.success());
    assert!(text(&o).0.contains("0 entries"));
    let o = flash(&["cache", "clear", "--cache-dir", root]);
    assert!(o.status.success());
    assert!(text(&o).0.contains("removed 0 entries"));
}

#[test]
fn info_never_panics() {
    let o = flash(&["info"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("gpu"), "{out}");
    let o = Command::new(env!("CARGO_BIN_EXE_flash"))
        .arg("info")
        .env("FLASH_NVRTC_PATH", "/nonexistent/libnvrtc.so.13")
        .env("FLASH_CUDA_LIB", "/nonexistent/libcuda.so.1")
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(
        out.contains("nvrtc:  not found") && out.contains("no GPU found"),
        "{out}"
    );
}

#[test]
fn examples_generate_and_compile_through_the_cache() {
    if !common::have_nvrtc("examples_generate_and_compile_through_the_cache") {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let cache_dir = cache.path().to_str().unwrap();
    let mut files: Vec<PathBuf> = std::fs::read_dir(examples())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "flash"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    for f in &files {
        let f = f.to_str().unwrap();
        let o = flash(&["gen", f]);
        let (out, err) = text(&o);
        assert!(o.status.success(), "gen {f}:\n{err}");
        assert!(out.contains("__global__"), "gen {f} prints CUDA:\n{out}");

        let o = flash(&[
            "compile",
            f,
            "--arch",
            "sm_80,sm_90a",
            "--cache-dir",
            cache_dir,
            "--json",
        ]);
        let (out, err) = text(&o);
        assert!(o.status.success(), "compile {f}:\n{out}\n{err}");
        for line in out.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["cache"], "miss", "{line}");
            assert!(v["registers"].as_u64().unwrap() > 0, "{line}");
        }
        // The second run loads every kernel from disk.
        let o = flash(&[
            "compile",
            f,
            "--arch",
            "sm_80,sm_90a",
            "--cache-dir",
            cache_dir,
            "--json",
        ]);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{err}");
        assert!(
            out.lines().all(|l| l.contains("\"cache\":\"disk-hit\"")),
            "{out}"
        );
    }
}

/// `flash plan F --json | head`: a reader that closes its end before `flash` writes must end
/// the program quietly with success, not with a "failed printing to stdout" panic.
#[test]
fn closed_stdout_pipe_exits_quietly() {
    use std::io::Read;
    use std::process::Stdio;
    let causal = examples().join("causal.flash");
    let causal = causal.to_str().unwrap();
    for args in [
        vec!["plan", causal, "--json"],
        vec!["plan", causal],
        vec!["gen", causal],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_flash"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Close the only read end at once: every write of `flash` meets a closed pipe.
        drop(child.stdout.take());
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let status = child.wait().unwrap();
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args:?}: {err}"
        );
        assert!(status.success(), "{args:?}: {status:?}\n{err}");
        assert!(err.is_empty(), "{args:?}: quiet, got:\n{err}");
    }
}
