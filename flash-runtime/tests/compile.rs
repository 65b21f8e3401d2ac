//! NVRTC compilation: CUBIN out, resources parsed, errors keep the log, dump folder.

mod common;

use common::{broken_kernel, have_nvrtc, tiny_kernel};
use flash_runtime::compile::{compile, nvrtc_version, CompileOptions};
use flash_runtime::FlashError;

#[test]
fn nvrtc_is_13_0() {
    if !have_nvrtc("nvrtc_is_13_0") {
        return;
    }
    let (major, minor) = nvrtc_version().unwrap();
    assert_eq!(
        major, 13,
        "cudarc is built for CUDA 13; got nvrtc {major}.{minor}"
    );
}

#[test]
fn compiles_cubin_for_sm80_and_sm90a() {
    if !have_nvrtc("compiles_cubin_for_sm80_and_sm90a") {
        return;
    }
    for arch in ["sm_80", "sm_90", "sm_90a"] {
        let k = compile(&tiny_kernel("arch"), &CompileOptions::new(arch)).unwrap();
        assert_eq!(&k.cubin[..4], b"\x7fELF", "{arch}: CUBIN is an ELF image");
        assert_eq!(k.arch, arch);
        assert!(
            k.log.contains("registers"),
            "{arch}: ptxas -v output in the log:\n{}",
            k.log
        );
        assert!(
            k.resources.registers > 0,
            "{arch}: {:?}\n{}",
            k.resources,
            k.log
        );
        assert_eq!(
            k.resources.smem_static, 512,
            "{arch}: 128 floats of static smem\n{}",
            k.log
        );
        assert!(!k.resources.spills());
        eprintln!("{arch}: {:?}, {:.1} ms", k.resources, k.compile_ms);
    }
}

#[test]
fn compile_error_keeps_the_whole_log() {
    if !have_nvrtc("compile_error_keeps_the_whole_log") {
        return;
    }
    match compile(&broken_kernel(), &CompileOptions::new("sm_80")) {
        Err(FlashError::Compile { kernel, log }) => {
            assert_eq!(kernel, "flash_test_broken");
            assert!(
                log.contains("undefined_name"),
                "log names the culprit:\n{log}"
            );
            assert!(log.contains("error"), "{log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn bad_arch_is_an_error_not_a_panic() {
    let e = compile(&tiny_kernel("bad-arch"), &CompileOptions::new("compute_90")).unwrap_err();
    assert!(e.to_string().contains("sm_80"), "{e}");
}

#[test]
fn dump_dir_receives_source_headers_and_log() {
    if !have_nvrtc("dump_dir_receives_source_headers_and_log") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // FLASH_DUMP_DIR is read per compile; run the compile in a child process so that the
    // variable does not leak into tests running in parallel threads.
    if std::env::var_os("FLASH_TEST_DUMP_CHILD").is_some() {
        compile(&tiny_kernel("dump"), &CompileOptions::new("sm_80")).unwrap();
        return;
    }
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "dump_dir_receives_source_headers_and_log",
            "--exact",
            "--nocapture",
        ])
        .env("FLASH_TEST_DUMP_CHILD", "1")
        .env("FLASH_DUMP_DIR", dir.path())
        .status()
        .unwrap();
    assert!(status.success());
    for f in [
        "flash_test_axpy.cu",
        "flash_test_prelude.cuh",
        "flash_test_axpy.sm_80.log",
    ] {
        let p = dir.path().join(f);
        assert!(p.is_file(), "{} missing", p.display());
    }
    let log = std::fs::read_to_string(dir.path().join("flash_test_axpy.sm_80.log")).unwrap();
    assert!(log.contains("registers"), "{log}");
}

/// Runs this test binary's test `name` in a child process with extra environment.
fn child(name: &str, env: &[(&str, &str)]) -> std::process::Output {
    let mut c = std::process::Command::new(std::env::current_exe().unwrap());
    c.args([name, "--exact", "--nocapture"])
        .env_remove("LD_LIBRARY_PATH");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// Child side: compile with whatever NVRTC the environment points at, print the outcome.
#[test]
fn child_compile_report() {
    if std::env::var_os("FLASH_TEST_REPORT_CHILD").is_none() {
        return;
    }
    match compile(&tiny_kernel("report"), &CompileOptions::new("sm_80")) {
        Ok(_) => println!("RESULT=ok"),
        Err(e @ FlashError::LibraryNotFound { .. }) => println!("RESULT=not-found\n{e}"),
        Err(e) => println!("RESULT=error\n{e}"),
    }
}

#[test]
fn missing_nvrtc_is_an_error_listing_the_search() {
    // Needs no NVRTC: the explicit setting points nowhere.
    let out = child(
        "child_compile_report",
        &[
            ("FLASH_TEST_REPORT_CHILD", "1"),
            ("FLASH_NVRTC_PATH", "/nonexistent/dir/libnvrtc.so.13"),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "no panic, no abort:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("RESULT=not-found"), "{stdout}");
    assert!(
        stdout.contains("/nonexistent/dir/libnvrtc.so.13"),
        "names what was looked for:\n{stdout}"
    );
    assert!(
        stdout.contains("setup-nvrtc.sh"),
        "says how to fix it:\n{stdout}"
    );
}

#[test]
fn wheel_nvrtc_works_without_ld_library_path_thanks_to_builtins_preload() {
    if !have_nvrtc("wheel_nvrtc_works_without_ld_library_path_thanks_to_builtins_preload") {
        return;
    }
    let lib = flash_runtime::libs::ensure_nvrtc().unwrap();
    let Some(builtins) = lib.builtins.clone() else {
        eprintln!(
            "nvrtc at {} comes with no builtins beside it; nothing to check",
            lib.path.display()
        );
        return;
    };
    // Through the real folder: the runtime preloads the builtins and compiles (LD_LIBRARY_PATH
    // is removed in the child).
    let real = lib.path.to_str().unwrap();
    let out = child(
        "child_compile_report",
        &[("FLASH_TEST_REPORT_CHILD", "1"), ("FLASH_NVRTC_PATH", real)],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("RESULT=ok"), "{stdout}");

    // Through a link in a folder without the builtins, a wheel NVRTC (no RPATH) cannot find
    // them: this is the failure the preload exists to prevent.
    let is_wheel = builtins.to_string_lossy().contains("nvidia/cu13/lib");
    if is_wheel {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("libnvrtc.so.13");
        std::os::unix::fs::symlink(&lib.path, &link).unwrap();
        let out = child(
            "child_compile_report",
            &[
                ("FLASH_TEST_REPORT_CHILD", "1"),
                ("FLASH_NVRTC_PATH", link.to_str().unwrap()),
            ],
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("RESULT=error") && stdout.contains("builtins"),
            "{stdout}"
        );
    }
}
