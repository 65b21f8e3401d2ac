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

#[test]
fn plan_prints_the_score_derivative_and_backward_kernels() {
    let softcap = examples().join("softcap.flash");
    let o = flash(&["plan", softcap.to_str().unwrap()]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains("d score / d s = 1.0 - tanh(s / cap) * tanh(s / cap)"),
        "{out}"
    );
    assert!(out.contains("d score / d cap = "), "{out}");
    assert!(
        out.contains("backward kernels: flash_bwdpre_softcap"),
        "{out}"
    );
    let alibi = examples().join("alibi.flash");
    let o = flash(&["plan", alibi.to_str().unwrap()]);
    let (out, _) = text(&o);
    assert!(out.contains("d score / d slopes[h] = k - q"), "{out}");
    // Above 128 the backward is the mma.sync kernel's, 64 keys per block at 256.
    let o = flash(&["plan", alibi.to_str().unwrap(), "--head-dim", "256"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains("backward kernels: flash_bwdpre_alibi_bf16_d256x256_m64n64w4s1"),
        "{out}"
    );
    // A variant without a backward: the plan still prints, with the reason.
    let fp8 = examples().join("../fp8/check.flash");
    let o = flash(&["plan", fp8.to_str().unwrap(), "--family", "sm90ws"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("backward: not available"), "{out}");
    // `--json` stays one JSON document.
    let o = flash(&["plan", softcap.to_str().unwrap(), "--json"]);
    let (out, _) = text(&o);
    assert!(!out.contains("d score"), "{out}");
    serde_json::from_str::<serde_json::Value>(&out).unwrap();
}

/// `.npy` inputs for `flash run` argument checks (zeros: never launched, every case below fails
/// before the GPU is touched), and a variant whose `f32` param `t` only steers a condition.
fn run_inputs() -> tempfile::TempDir {
    use flash_runtime::npy::{NpyArray, NpyData};
    let dir = tempfile::tempdir().unwrap();
    let f32s = |shape: Vec<usize>| {
        let n = shape.iter().product();
        NpyArray::new(shape, NpyData::F32(vec![0.0; n])).unwrap()
    };
    f32s(vec![1, 8, 2, 128])
        .write(&dir.path().join("q.npy"))
        .unwrap();
    f32s(vec![1, 8, 2, 128])
        .write(&dir.path().join("do.npy"))
        .unwrap();
    f32s(vec![1, 8, 2, 64])
        .write(&dir.path().join("do_bad.npy"))
        .unwrap();
    f32s(vec![2]).write(&dir.path().join("slopes.npy")).unwrap();
    NpyArray::new(vec![8], NpyData::I32(vec![0; 8]))
        .unwrap()
        .write(&dir.path().join("doc.npy"))
        .unwrap();
    std::fs::write(
        dir.path().join("thr.flash"),
        "pub Thr {\n    head_dim: 128,\n    dtype: bf16,\n    params: { t: f32 },\n    \
         mask: causal,\n    score: if s > t { s } else { s - 1.0 },\n}\n",
    )
    .unwrap();
    dir
}

/// `flash run FILE --q/--k/--v <zeros> --out ..` plus `extra`, in `dir`; returns (status, stderr).
fn run_in(dir: &Path, file: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let mut args = vec![
        "run".to_string(),
        file.to_str().unwrap().to_string(),
        "--out".into(),
        "o.npy".into(),
    ];
    for t in ["q", "k", "v"] {
        args.push(format!("--{t}"));
        args.push("q.npy".into());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let o = Command::new(env!("CARGO_BIN_EXE_flash"))
        .args(&args)
        .current_dir(dir)
        .output()
        .unwrap();
    (o.status.code(), text(&o).1)
}

#[test]
fn run_gradient_flags_need_do() {
    let dir = run_inputs();
    let d = dir.path();
    let alibi = examples().join("alibi.flash");
    let slopes = ["--param", "slopes=slopes.npy"];
    let cases: [(&[&str], &str); 3] = [
        (&["--dq", "dq.npy"], "--dq needs --do dO.npy"),
        (
            &["--dk", "dk.npy", "--dparam", "slopes=ds.npy"],
            "--dk, --dparam need --do dO.npy",
        ),
        (&["--do", "do.npy"], "no gradient is asked for"),
    ];
    for (extra, want) in cases {
        let (code, err) = run_in(d, &alibi, &[&slopes[..], extra].concat());
        assert_eq!(code, Some(1), "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: want `{want}` in:\n{err}");
        assert!(
            !err.contains("cuda"),
            "{extra:?}: fails before the GPU:\n{err}"
        );
    }
    assert!(!d.join("o.npy").exists(), "nothing ran");
}

#[test]
fn run_dparam_must_name_a_differentiable_f32_param() {
    let dir = run_inputs();
    let d = dir.path();
    let alibi = examples().join("alibi.flash");
    let document = examples().join("document.flash");
    let thr = d.join("thr.flash");
    let cases: [(&Path, &[&str], &str); 6] = [
        (
            &alibi,
            &["--param", "slopes=slopes.npy", "--dparam", "nope=x.npy"],
            "`Alibi` has no param `nope`; it declares: slopes",
        ),
        (
            &document,
            &["--param", "doc=doc.npy", "--dparam", "doc=x.npy"],
            "param `doc` is an i32 tensor; only f32 params have gradients",
        ),
        (
            &thr,
            &["--param", "t=0.5", "--dparam", "t=x.npy"],
            "the score of `Thr` does not depend on `t`; it has no gradient",
        ),
        (
            &alibi,
            &[
                "--param",
                "slopes=slopes.npy",
                "--dparam",
                "slopes=a.npy",
                "--dparam",
                "slopes=b.npy",
            ],
            "`slopes` is given twice",
        ),
        (
            &alibi,
            &["--param", "slopes=slopes.npy", "--dparam", "slopes"],
            "--dparam takes NAME=FILE.npy; got `slopes`",
        ),
        (
            &alibi,
            &[
                "--param",
                "slopes=slopes.npy",
                "--dq",
                "dq.npy",
                "--do",
                "do_bad.npy",
            ],
            "--do must have O's shape [1, 8, 2, 128]",
        ),
    ];
    for (file, extra, want) in cases {
        let mut args = extra.to_vec();
        if !args.contains(&"--do") {
            args.extend(["--do", "do.npy"]);
        }
        let (code, err) = run_in(d, file, &args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: want `{want}` in:\n{err}");
        assert!(
            !err.contains("cuda"),
            "{args:?}: fails before the GPU:\n{err}"
        );
    }
}

#[test]
fn run_backward_past_the_skeleton_fails_before_the_gpu() {
    let dir = run_inputs();
    let d = dir.path();
    let alibi = examples().join("alibi.flash");
    let (code, err) = run_in(
        d,
        &alibi,
        &[
            "--head-dim",
            "256",
            "--param",
            "slopes=slopes.npy",
            "--do",
            "do.npy",
            "--dq",
            "dq.npy",
        ],
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no backward pass"), "{err}");
}

#[test]
fn run_seed_flags_need_a_dropout_variant() {
    let dir = run_inputs();
    let d = dir.path();
    let causal = examples().join("causal.flash");
    for extra in [
        &["--seed", "7"][..],
        &["--offset", "3"],
        &["--dropout-mask", "m.npy"],
    ] {
        let (code, err) = run_in(d, &causal, extra);
        assert_eq!(code, Some(1), "{extra:?}: {err}");
        assert!(
            err.contains("apply to variants with dropout; `Causal` declares none"),
            "{extra:?}: {err}"
        );
        assert!(
            !err.contains("cuda"),
            "{extra:?}: fails before the GPU:\n{err}"
        );
    }
    assert!(!d.join("o.npy").exists() && !d.join("m.npy").exists());
}

/// `FLASH_FAMILY` picks the family where `--family` does not, for the CLI as for the runtime;
/// `--family` wins; a bad value is an error naming it.
#[test]
fn flash_family_env_picks_the_family() {
    let f = examples().join("causal.flash");
    let plan = |env: Option<&str>, extra: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_flash"));
        c.arg("plan").arg(&f).args(extra).env_remove("FLASH_FAMILY");
        if let Some(v) = env {
            c.env("FLASH_FAMILY", v);
        }
        c.output().unwrap()
    };
    let (out, _) = text(&plan(Some("sm90ws"), &[]));
    assert!(out.contains("_sm90ws\""), "{out}");
    let (out, _) = text(&plan(Some("sm90ws"), &["--family", "sm80"]));
    assert!(!out.contains("_sm90"), "{out}");
    let (out, _) = text(&plan(None, &[]));
    assert!(
        !out.contains("_sm90"),
        "the CLI's default without the variable is sm80: {out}"
    );
    let o = plan(Some("hopper"), &[]);
    let (_, err) = text(&o);
    assert_ne!(o.status.code(), Some(0));
    assert!(
        err.contains("FLASH_FAMILY must be sm80, sm90 or sm90ws; got `hopper`"),
        "{err}"
    );
}

/// `plan --json` prints JSON Lines: one plan object per line and declaration (issue 14: several
/// declarations printed pretty one after another were not valid JSON), with no colours.
#[test]
fn plan_json_is_one_object_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("two.flash");
    std::fs::write(
        &f,
        "A { head_dim: 64, dtype: bf16, mask: causal }\nB { head_dim: 128, dtype: f16 }\n",
    )
    .unwrap();
    let o = flash(&["plan", f.to_str().unwrap(), "--json"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let names: Vec<String> = out
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["spec"]["name"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(names, ["A", "B"], "{out}");
    assert!(!out.contains('\u{1b}') && !err.contains('\u{1b}'));
}

/// The paged-cache flags are checked before the GPU: the table and the lengths come together,
/// with the batch's shapes, and not with the backward pass.
/// Each `flash run` (with `extra` flags) fails with a message containing `want`, before the GPU
/// is touched, and writes no output.
fn fails_before_the_gpu(d: &Path, file: &Path, cases: &[(&[&str], &str)]) {
    for (extra, want) in cases {
        let (code, err) = run_in(d, file, extra);
        assert_ne!(code, Some(0), "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: want `{want}` in:\n{err}");
        assert!(
            !err.contains("cuda"),
            "{extra:?}: fails before the GPU:\n{err}"
        );
    }
    assert!(!d.join("o.npy").exists(), "nothing ran");
}

#[test]
fn run_packed_flags_are_checked_before_the_gpu() {
    use flash_runtime::npy::{NpyArray, NpyData};
    let dir = run_inputs();
    let d = dir.path();
    let causal = examples().join("causal.flash");
    let ints = |shape: Vec<usize>, v: Vec<i32>, name: &str| {
        NpyArray::new(shape, NpyData::I32(v))
            .unwrap()
            .write(&d.join(name))
            .unwrap();
    };
    // q.npy, k.npy, v.npy are [1, 8, 2, 128]: 8 packed tokens.
    ints(vec![3], vec![0, 3, 8], "cu.npy");
    ints(vec![2], vec![0, 8], "cu2.npy");
    ints(vec![3], vec![0, 5, 4], "cu_down.npy");
    ints(vec![3], vec![0, 3, 7], "cu_short.npy");
    ints(vec![1, 3], vec![0, 3, 8], "cu_2d.npy");
    let cases: [(&[&str], &str); 8] = [
        (
            &[
                "--cu-seqlens-k",
                "cu.npy",
                "--cu-seqlens-q",
                "cu.npy",
                "--page-table",
                "cu.npy",
            ],
            "cannot be used with",
        ),
        (
            &[
                "--cu-seqlens-q",
                "cu.npy",
                "--cu-seqlens-k",
                "cu.npy",
                "--splits",
                "2",
            ],
            "--splits does not apply to a packed batch",
        ),
        (
            &["--cu-seqlens-q", "cu.npy"],
            "--cu-seqlens-q needs --cu-seqlens-k (packed K and V) or --page-table",
        ),
        (
            &["--cu-seqlens-q", "cu_down.npy", "--cu-seqlens-k", "cu.npy"],
            "--cu-seqlens-q[2] is 4 but --cu-seqlens-q[1] is 5; the offsets must not decrease",
        ),
        (
            &["--cu-seqlens-q", "cu.npy", "--cu-seqlens-k", "cu_short.npy"],
            "--cu-seqlens-k[2] is 7; it must equal the packed tensors' 8 tokens",
        ),
        (
            &["--cu-seqlens-q", "cu.npy", "--cu-seqlens-k", "cu2.npy"],
            "--cu-seqlens-q has 3 entries and --cu-seqlens-k 2",
        ),
        (
            &["--cu-seqlens-q", "cu_2d.npy", "--cu-seqlens-k", "cu.npy"],
            "--cu-seqlens-q must be 1-d, [batch + 1]; got shape [1, 3]",
        ),
        (
            &[
                "--cu-seqlens-q",
                "cu.npy",
                "--cu-seqlens-k",
                "cu.npy",
                "--do",
                "do.npy",
            ],
            "--do does not apply to a packed batch",
        ),
    ];
    fails_before_the_gpu(d, &causal, &cases);
}

#[test]
fn run_paged_flags_are_checked_before_the_gpu() {
    use flash_runtime::npy::{NpyArray, NpyData};
    let dir = run_inputs();
    let d = dir.path();
    let causal = examples().join("causal.flash");
    let ints = |shape: Vec<usize>, name: &str| {
        let n = shape.iter().product();
        NpyArray::new(shape, NpyData::I32(vec![0; n]))
            .unwrap()
            .write(&d.join(name))
            .unwrap();
    };
    ints(vec![1, 4], "table.npy");
    ints(vec![2, 4], "table_b2.npy");
    ints(vec![1], "lens.npy");
    ints(vec![3], "lens3.npy");
    let cases: [(&[&str], &str); 4] = [
        (&["--page-table", "table.npy"], "--seqlens-k <SEQLENS_K>"),
        (
            &["--page-table", "table_b2.npy", "--seqlens-k", "lens.npy"],
            "--page-table must be [batch, max_pages] with batch 1; got shape [2, 4]",
        ),
        (
            &["--page-table", "table.npy", "--seqlens-k", "lens3.npy"],
            "--seqlens-k must be [batch] = [1]; got shape [3]",
        ),
        (
            &[
                "--page-table",
                "table.npy",
                "--seqlens-k",
                "lens.npy",
                "--do",
                "do.npy",
                "--dq",
                "dq.npy",
            ],
            "--page-table is for inference",
        ),
    ];
    fails_before_the_gpu(d, &causal, &cases);
}

#[test]
fn quantize_arguments_are_checked_before_the_gpu() {
    use flash_runtime::npy::{NpyArray, NpyData};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let zeros = |shape: Vec<usize>, name: &str| {
        let n = shape.iter().product();
        NpyArray::new(shape, NpyData::F32(vec![0.0; n]))
            .unwrap()
            .write(&d.join(name))
            .unwrap();
    };
    zeros(vec![1, 10, 2, 64], "x.npy");
    zeros(vec![1, 10, 2, 96], "x96.npy");
    zeros(vec![10, 2, 64], "x3.npy");
    let cases: [(&[&str], &str); 6] = [
        (
            &["--x", "x.npy", "--smooth", "--transpose"],
            "V (the transposed layout) is never smoothed",
        ),
        (
            &["--x", "x.npy", "--block-rows", "96"],
            "a scale block is 64 or 128 positions; got 96",
        ),
        (
            &["--x", "x96.npy", "--hadamard-seed", "1"],
            "the Hadamard rotation needs a power-of-two head dim (64, 128, 256); got 96",
        ),
        (
            &["--x", "x3.npy"],
            "--x must be a 4-d array [batch, seq, heads, head_dim]; got shape [10, 2, 64]",
        ),
        (
            &["--x", "x.npy", "--dtype", "e4m3"],
            "--dtype is bf16 or f16 (the type the input is read as); got `e4m3`",
        ),
        (
            &["--x", "x.npy", "--format", "int4"],
            "--format is e4m3 or int8 (the codes written); got `int4`",
        ),
    ];
    for (extra, want) in cases {
        let o = Command::new(env!("CARGO_BIN_EXE_flash"))
            .args(["quantize", "--codes", "c.npy", "--scales", "s.npy"])
            .args(extra)
            .current_dir(d)
            .output()
            .unwrap();
        let err = text(&o).1;
        assert_ne!(o.status.code(), Some(0), "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: want `{want}` in:\n{err}");
        assert!(
            !err.contains("cuda"),
            "{extra:?}: fails before the GPU:\n{err}"
        );
    }
    assert!(!d.join("c.npy").exists(), "nothing ran");
}

/// `flash run` of an fp8 variant refuses what fp8 does not have (packed batches, paged caches,
/// split-KV, the backward, a dropout mask) before the GPU, and `--hadamard-seed` on a variant
/// that is not fp8.
#[test]
fn run_fp8_flags_are_checked_before_the_gpu() {
    let dir = run_inputs();
    let d = dir.path();
    let fp8 = examples().join("../fp8/check.flash");
    let only = "is not available for fp8 variants (`Fp8Causal` declares `dtype: e4m3`)";
    fails_before_the_gpu(
        d,
        &fp8,
        &[
            (&["--name", "Fp8Causal", "--do", "do.npy"], only),
            (&["--name", "Fp8Causal", "--splits", "4"], only),
            (
                &[
                    "--name",
                    "Fp8Causal",
                    "--page-table",
                    "doc.npy",
                    "--seqlens-k",
                    "doc.npy",
                ],
                only,
            ),
            (
                &["--name", "Fp8Causal", "--cu-seqlens-q", "doc.npy"],
                "--cu-seqlens-q",
            ),
        ],
    );
    fails_before_the_gpu(
        d,
        &examples().join("causal.flash"),
        &[(
            &["--hadamard-seed", "3"],
            "--hadamard-seed rotates the inputs of an fp8 variant",
        )],
    );
    // `flash tune --backward`: an fp8 variant has no backward kernel, refused before the GPU.
    let o = flash(&[
        "tune",
        fp8.to_str().unwrap(),
        "--name",
        "Fp8Causal",
        "--shape",
        "1,2,2,256,256",
        "--backward",
    ]);
    let err = text(&o).1;
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains(
            "`flash tune --backward` has nothing to time for `Fp8Causal`: an fp8 (`dtype: e4m3`) variant has only the forward kernel"
        ),
        "{err}"
    );
    assert!(!err.contains("cuda"), "fails before the GPU:\n{err}");
}
