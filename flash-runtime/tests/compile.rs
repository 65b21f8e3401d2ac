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
    assert_eq!(major, 13, "cudarc is built for CUDA 13; got nvrtc {major}.{minor}");
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
        assert!(k.log.contains("registers"), "{arch}: ptxas -v output in the log:\n{}", k.log);
        assert!(k.resources.registers > 0, "{arch}: {:?}\n{}", k.resources, k.log);
        assert_eq!(k.resources.smem_static, 512, "{arch}: 128 floats of static smem\n{}", k.log);
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
            assert!(log.contains("undefined_name"), "log names the culprit:\n{log}");
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
        .args(["dump_dir_receives_source_headers_and_log", "--exact", "--nocapture"])
        .env("FLASH_TEST_DUMP_CHILD", "1")
        .env("FLASH_DUMP_DIR", dir.path())
        .status()
        .unwrap();
    assert!(status.success());
    for f in ["flash_test_axpy.cu", "flash_test_prelude.cuh", "flash_test_axpy.sm_80.log"] {
        let p = dir.path().join(f);
        assert!(p.is_file(), "{} missing", p.display());
    }
    let log = std::fs::read_to_string(dir.path().join("flash_test_axpy.sm_80.log")).unwrap();
    assert!(log.contains("registers"), "{log}");
}
