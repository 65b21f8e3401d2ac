//! Autotuning without a GPU: the search and pruning against fake compile and timing backends,
//! the tuning records (format compatibility, corruption, staleness, concurrent writers) and the
//! shape buckets.

use std::collections::HashSet;
use std::sync::Mutex;

use flash_dsl::eval::{ParamValue, ParamValues, Sizes};
use flash_dsl::plan::KernelFamily;
use flash_dsl::{TileConfig, VariantSpec};
use flash_runtime::launch::ProblemShape;
use flash_runtime::tune::*;
use flash_runtime::Resources;

fn spec(src: &str) -> VariantSpec {
    flash_dsl::parse::parse_str(src).unwrap().remove(0)
}

fn causal() -> VariantSpec {
    spec("pub Causal { head_dim: 128, dtype: bf16, mask: causal, }")
}

fn shape(b: usize, hq: usize, hkv: usize, sq: usize, sk: usize) -> ProblemShape {
    ProblemShape {
        batch: b,
        heads_q: hq,
        heads_kv: hkv,
        seq_q: sq,
        seq_k: sk,
    }
}

/// Spills for 256-row tiles, fails to compile 64x32 sm80 tiles, else a register count from the
/// tile size.
struct FakeCompiler {
    calls: Mutex<Vec<TileConfig>>,
}

impl Compiler for FakeCompiler {
    fn compile(&self, _spec: &VariantSpec, cfg: &TileConfig) -> Result<Resources, String> {
        self.calls.lock().unwrap().push(*cfg);
        if cfg.block_m == 64 && cfg.block_n == 32 && cfg.family == KernelFamily::Sm80 {
            return Err("nvrtc: fake failure".into());
        }
        let spill = if cfg.block_m == 256 { 64 } else { 0 };
        Ok(Resources {
            registers: 64 + cfg.block_n * cfg.block_m / (cfg.warps * 32),
            spill_stores: spill,
            spill_loads: spill,
            ..Resources::default()
        })
    }
}

/// Deterministic time: the fastest valid candidate is 128x128x4x1; `wrong` fails the check.
struct FakeTimer {
    timed: Vec<TileConfig>,
    checked: Vec<TileConfig>,
    wrong: Option<TileConfig>,
}

impl Timer for FakeTimer {
    fn time(&mut self, cfg: &TileConfig) -> Result<f64, String> {
        self.timed.push(*cfg);
        let mut ms = 1.0
            + (cfg.block_m as f64 - 128.0).abs() / 256.0
            + (cfg.block_n as f64 - 128.0).abs() / 512.0
            + cfg.stages as f64 * 0.01
            + cfg.warps as f64 * 0.001;
        if cfg.family == KernelFamily::Sm90 {
            ms -= 0.5;
        }
        Ok(ms)
    }
    fn check(&mut self, cfg: &TileConfig) -> Result<(), String> {
        self.checked.push(*cfg);
        if Some(*cfg) == self.wrong {
            Err("max |diff| 1.0".into())
        } else {
            Ok(())
        }
    }
}

fn cfg(m: u32, n: u32, w: u32, s: u32, family: KernelFamily) -> TileConfig {
    TileConfig {
        block_m: m,
        block_n: n,
        warps: w,
        stages: s,
        family,
    }
}

#[test]
fn search_prunes_before_timing_and_picks_the_fastest_correct() {
    let s = causal();
    let compiler = FakeCompiler {
        calls: Mutex::new(Vec::new()),
    };
    let fastest = cfg(128, 128, 4, 1, KernelFamily::Sm80);
    let mut timer = FakeTimer {
        timed: vec![],
        checked: vec![],
        wrong: Some(fastest),
    };
    let opts = TuneOptions {
        max_smem: 100 * 1024,
        threads: 4,
        family: None,
        seq_q: None,
        flops: 1e12,
        exclude: vec![],
        min_gain: 0.0,
    };
    let mut events = Vec::new();
    let r = tune(&s, "sm_80", &opts, &compiler, &mut timer, &mut |p| {
        events.push(format!("{p:?}"))
    })
    .unwrap();
    // sm_80 runs no sm90 kernel.
    assert!(r
        .candidates
        .iter()
        .all(|c| c.config.family == KernelFamily::Sm80));
    let by = |c: TileConfig| r.candidates.iter().find(|x| x.config == c).unwrap();
    // Layout: 96-row warps, 12 warps.
    assert!(
        matches!(&by(cfg(256, 64, 4, 1, KernelFamily::Sm80)).status, Status::Pruned(w) if w.contains("16 or 32 query rows"))
    );
    // Shared memory over the (fake) opt-in limit: 128x128x?x2 at d=128 is 2*(128*128+2*128*256).
    let big = by(cfg(128, 128, 4, 2, KernelFamily::Sm80));
    assert!(
        matches!(&big.status, Status::Pruned(w) if w.contains("shared memory") && w.contains("102400")),
        "{:?}",
        big.status
    );
    // Spills (found by compiling).
    let spilled = by(cfg(256, 64, 8, 1, KernelFamily::Sm80));
    assert!(
        matches!(&spilled.status, Status::Pruned(w) if w.contains("spills 64 B")),
        "{:?}",
        spilled.status
    );
    assert_eq!(spilled.resources.unwrap().spill_stores, 64);
    assert!(matches!(
        by(cfg(64, 32, 4, 1, KernelFamily::Sm80)).status,
        Status::CompileFailed(_)
    ));
    // Nothing pruned before compiling was compiled; nothing pruned was timed.
    let compiled: HashSet<TileConfig> = compiler.calls.lock().unwrap().iter().copied().collect();
    let timed: HashSet<TileConfig> = timer.timed.iter().copied().collect();
    for c in &r.candidates {
        match &c.status {
            Status::Pruned(w) if !w.starts_with("spills") => {
                assert!(!compiled.contains(&c.config), "{c:?}")
            }
            _ => {}
        }
        if matches!(c.status, Status::Pruned(_) | Status::CompileFailed(_)) {
            assert!(!timed.contains(&c.config), "{c:?}");
        }
    }
    // The default is timed first; every survivor exactly once.
    assert_eq!(timer.timed[0], r.default);
    assert_eq!(timed.len(), timer.timed.len());
    // The fastest failed its check; the next one won.
    assert_eq!(timer.checked[0], fastest);
    assert!(matches!(by(fastest).status, Status::Wrong(_)));
    assert_eq!(r.winner, timer.checked[1]);
    assert_eq!(by(r.winner).status, Status::Winner);
    assert!(r.winner_ms <= r.default_ms.unwrap());
    assert!((by(r.winner).tflops.unwrap() - 1.0 / (r.winner_ms * 1e-3)).abs() < 1e-9);
    // Progress reported compiles and timings.
    assert!(events.iter().any(|e| e.contains("Compiled")));
    assert!(events.iter().any(|e| e.contains("Timed")));
    assert!(events.iter().any(|e| e.contains("spills")));
}

#[test]
fn sm90a_searches_every_family_and_family_can_be_forced() {
    let s = causal();
    let compiler = FakeCompiler {
        calls: Mutex::new(Vec::new()),
    };
    let mut timer = FakeTimer {
        timed: vec![],
        checked: vec![],
        wrong: None,
    };
    let opts = TuneOptions {
        max_smem: 227 * 1024,
        threads: 2,
        family: None,
        seq_q: None,
        flops: 0.0,
        exclude: vec![],
        min_gain: 0.0,
    };
    let r = tune(&s, "sm_90a", &opts, &compiler, &mut timer, &mut |_| {}).unwrap();
    // The default on sm_90a is the warp-specialised family; the fake timer favours sm90.
    assert_eq!(r.default.family, KernelFamily::Sm90Ws);
    assert_eq!(r.winner.family, KernelFamily::Sm90);
    for family in [KernelFamily::Sm80, KernelFamily::Sm90, KernelFamily::Sm90Ws] {
        assert!(
            timer.timed.iter().any(|c| c.family == family),
            "{family:?} timed"
        );
    }
    // sm90 layout rules: warps = block_m / 16.
    let bad = r
        .candidates
        .iter()
        .find(|c| c.config == cfg(128, 64, 4, 1, KernelFamily::Sm90))
        .unwrap();
    assert!(matches!(&bad.status, Status::Pruned(w) if w.contains("warpgroup")));
    // A long launch is compared with its own default (192 × 128 tiles for a long causal launch
    // at d128), not the length-blind one.
    let long = TuneOptions {
        seq_q: Some(16384),
        ..opts.clone()
    };
    let r = tune(&s, "sm_90a", &long, &compiler, &mut timer, &mut |_| {}).unwrap();
    assert_eq!(
        (r.default.block_m, r.default.block_n, r.default.family),
        (192, 128, KernelFamily::Sm90Ws)
    );
    assert!(r.candidates.iter().any(|c| c.config == r.default));
    let only = TuneOptions {
        family: Some(KernelFamily::Sm80),
        ..opts
    };
    let r = tune(&s, "sm_90a", &only, &compiler, &mut timer, &mut |_| {}).unwrap();
    assert!(r
        .candidates
        .iter()
        .all(|c| c.config.family == KernelFamily::Sm80));
}

#[test]
fn no_survivor_is_an_error() {
    struct Never;
    impl Compiler for Never {
        fn compile(&self, _: &VariantSpec, _: &TileConfig) -> Result<Resources, String> {
            Err("no".into())
        }
    }
    let mut timer = FakeTimer {
        timed: vec![],
        checked: vec![],
        wrong: None,
    };
    let opts = TuneOptions {
        max_smem: 227 * 1024,
        threads: 1,
        family: None,
        seq_q: None,
        flops: 0.0,
        exclude: vec![],
        min_gain: 0.0,
    };
    let e = tune(&causal(), "sm_80", &opts, &Never, &mut timer, &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("no candidate"), "{e}");
    assert!(timer.timed.is_empty());
}

#[test]
fn buckets_round_up_to_powers_of_two() {
    assert_eq!(pow2_bucket(0), 1);
    assert_eq!(pow2_bucket(1), 1);
    assert_eq!(pow2_bucket(3), 4);
    assert_eq!(pow2_bucket(4096), 4096);
    assert_eq!(pow2_bucket(4097), 8192);
    let b = ShapeBucket::of(&shape(3, 12, 4, 1000, 1025));
    assert_eq!(
        b,
        ShapeBucket {
            seq_q: 1024,
            seq_k: 2048,
            batch_heads: 64,
            group: 4
        }
    );
    // Shapes in one bucket share a key; the next power of two does not.
    let s = causal();
    let k = |sh| TuneKey::new(&s, "NVIDIA H200", "sm_90a", (13, 0), &sh);
    assert_eq!(
        k(shape(4, 16, 16, 3000, 3000)),
        k(shape(4, 16, 16, 4096, 4096))
    );
    assert_ne!(
        k(shape(4, 16, 16, 4096, 4096)),
        k(shape(4, 16, 16, 4097, 4096))
    );
    assert_ne!(
        k(shape(4, 16, 16, 4096, 4096)),
        k(shape(4, 16, 2, 4096, 4096))
    );
}

#[test]
fn key_hashes_the_spec_not_the_config() {
    let s = causal();
    let mut d64 = s.clone();
    d64.head_dim_qk = 64;
    d64.head_dim_v = 64;
    assert_ne!(spec_hash(&s), spec_hash(&d64));
    assert_eq!(spec_hash(&s), spec_hash(&causal()));
    let sh = shape(4, 16, 16, 4096, 4096);
    let a = TuneKey::new(&s, "NVIDIA H200", "sm_90a", (13, 0), &sh);
    let mut b = a.clone();
    b.nvrtc = "13.1".into();
    assert_ne!(a.file_stem(), b.file_stem());
    assert_eq!(a.generator, flash_dsl::GENERATOR_VERSION);
    assert_eq!(a.file_stem().len(), 32);
}

fn record(key: TuneKey, ms: f64) -> TuneRecord {
    TuneRecord {
        format: RECORD_FORMAT,
        key,
        config: cfg(128, 128, 8, 2, KernelFamily::Sm90),
        variant: "Causal".into(),
        ms,
        default_config: None,
        default_ms: 2.0,
        shape: Some([4, 16, 16, 4096, 4096]),
        candidates: 10,
        timed: 5,
        tune_s: 12.5,
        created_unix: 1,
    }
}

fn key() -> TuneKey {
    TuneKey::new(
        &causal(),
        "NVIDIA H200",
        "sm_90a",
        (13, 0),
        &shape(4, 16, 16, 4096, 4096),
    )
}

#[test]
fn records_round_trip_and_bad_ones_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let store = TuneStore::new(dir.path().join("tune"));
    let k = key();
    assert!(store.load(&k).is_none());
    let path = store.store(&record(k.clone(), 1.5)).unwrap();
    assert_eq!(store.load(&k).unwrap(), record(k.clone(), 1.5));
    // Corrupt: ignored, not an error.
    std::fs::write(&path, b"{\"format\": 1, \"key\": {").unwrap();
    assert!(store.load(&k).is_none());
    // Stale: a record holding another key under this key's name.
    let mut other = k.clone();
    other.generator = "0.0.0+gen0".into();
    let stale = serde_json::to_vec(&record(other, 1.0)).unwrap();
    std::fs::write(&path, stale).unwrap();
    assert!(store.load(&k).is_none());
    // Newer format.
    let mut newer = record(k.clone(), 1.0);
    newer.format = RECORD_FORMAT + 1;
    std::fs::write(&path, serde_json::to_vec(&newer).unwrap()).unwrap();
    assert!(store.load(&k).is_none());
    // No temp files left behind.
    store.store(&record(k.clone(), 1.0)).unwrap();
    let names: Vec<String> = std::fs::read_dir(dir.path().join("tune"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, [format!("{}.json", k.file_stem())]);
}

#[test]
fn an_older_record_with_missing_fields_still_loads() {
    let dir = tempfile::tempdir().unwrap();
    let store = TuneStore::new(dir.path());
    let k = key();
    // No format, no timings, no shape; the config predates the kernel family field.
    let old = serde_json::json!({
        "key": serde_json::to_value(&k).unwrap(),
        "config": { "block_m": 128, "block_n": 64, "warps": 4, "stages": 2 },
    });
    std::fs::write(store.path(&k).unwrap(), serde_json::to_vec(&old).unwrap()).unwrap();
    let r = store.load(&k).expect("an older record loads");
    assert_eq!(r.config, cfg(128, 64, 4, 2, KernelFamily::Sm80));
    assert_eq!(r.format, RECORD_FORMAT);
    assert_eq!((r.ms, r.tune_s, r.shape), (0.0, 0.0, None));
    // A key that predates the group field reads group 0, which no new key has: ignored.
    let mut kv = serde_json::to_value(&k).unwrap();
    kv["bucket"].as_object_mut().unwrap().remove("group");
    let old = serde_json::json!({ "key": kv, "config": old["config"] });
    std::fs::write(store.path(&k).unwrap(), serde_json::to_vec(&old).unwrap()).unwrap();
    assert!(store.load(&k).is_none());
}

#[test]
fn concurrent_writers_always_leave_a_whole_record() {
    let dir = tempfile::tempdir().unwrap();
    let store = TuneStore::new(dir.path());
    let k = key();
    store.store(&record(k.clone(), 0.0)).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..6 {
            let (store, k) = (&store, &k);
            s.spawn(move || {
                for i in 0..40 {
                    store
                        .store(&record(k.clone(), (t * 100 + i) as f64))
                        .unwrap();
                }
            });
        }
        let reader = s.spawn(|| {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = store.load(&k).expect("always a whole, valid record");
                assert_eq!(r.key, k);
                n += 1;
            }
            n
        });
        // Other processes too: this test binary, re-run as a writer child.
        let exe = std::env::current_exe().unwrap();
        let children: Vec<_> = (0..3)
            .map(|_| {
                std::process::Command::new(&exe)
                    .args(["--exact", "writer_child", "--nocapture"])
                    .env("FLASH_TUNE_WRITER_DIR", dir.path())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for mut c in children {
            assert!(c.wait().unwrap().success());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
    });
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(names.len(), 1, "temp files left: {names:?}");
    assert!(store.load(&k).is_some());
}

/// The child half of the test above; does nothing unless started by it.
#[test]
fn writer_child() {
    let Some(dir) = std::env::var_os("FLASH_TUNE_WRITER_DIR") else {
        return;
    };
    let store = TuneStore::new(std::path::PathBuf::from(dir));
    for i in 0..40 {
        store.store(&record(key(), 1000.0 + i as f64)).unwrap();
    }
}

#[test]
fn plausible_params_and_density() {
    let doc = spec(
        "pub Document { head_dim: 128, dtype: bf16, params: { doc: [i32; seq] }, mask: causal && doc[q] == doc[k], }",
    );
    let sizes = Sizes {
        batch: 2,
        heads: 8,
        seq_q: 512,
        seq_k: 512,
    };
    let p = default_params(&doc, sizes, &[], 1);
    let ParamValue::IntTensor(ids) = &p.0[0] else {
        panic!("{p:?}")
    };
    assert_eq!(ids.len(), 512);
    assert!(ids.windows(2).all(|w| w[0] <= w[1]));
    assert!(ids.iter().all(|&i| (0..8).contains(&i)));
    let d = mask_density(&doc, &p, sizes);
    assert!(d > 0.0 && d < 0.5, "{d}");

    let alibi = spec(
        "pub Alibi { head_dim: 128, dtype: bf16, params: { slopes: [f32; heads] }, mask: causal, score: s + slopes[h] * (k - q), }",
    );
    let p = default_params(&alibi, sizes, &[], 1);
    let ParamValue::FloatTensor(sl) = &p.0[0] else {
        panic!()
    };
    assert_eq!(sl.len(), 8);
    assert!((sl[0] - 0.5).abs() < 1e-12 && (sl[7] - 2f64.powi(-8)).abs() < 1e-12);
    let d = mask_density(&alibi, &p, sizes);
    assert!((d - 0.5).abs() < 0.01, "{d}");

    let prefix = spec(
        "pub PrefixLm { head_dim: 128, dtype: bf16, params: { prefix: i32 }, mask: causal || k < prefix, }",
    );
    let given = [("prefix".to_string(), ParamValue::Int(7))];
    assert_eq!(
        default_params(&prefix, sizes, &given, 1),
        ParamValues(vec![ParamValue::Int(7)])
    );
    assert_eq!(
        mask_density(&causal(), &ParamValues::none(), sizes),
        0.5 + 0.5 / 256.0
    );
    let flops = forward_flops(&causal(), &shape(1, 1, 1, 10, 10), 0.5);
    assert_eq!(flops, 2.0 * 100.0 * 256.0 * 0.5);
}

#[test]
fn output_comparison() {
    let want = [0.5f32, -0.25, 0.125];
    assert!(compare_outputs(&want, &want, 1e-3).is_ok());
    let e = compare_outputs(&[0.5, -0.2, 0.125], &want, 1e-3).unwrap_err();
    assert!(e.contains("element 1"), "{e}");
    let e = compare_outputs(&[0.5, f32::NAN, 0.125], &want, 1e-3).unwrap_err();
    assert!(e.contains("1 elements"), "{e}");
    // fp8 configurations: the RMS of the difference relative to the output's.
    let near = [0.52f32, -0.24, 0.12];
    assert!(compare_outputs_rms(&near, &want, FP8_OUTPUT_REL_RMS).is_ok());
    let e = compare_outputs_rms(&[-0.5, 0.25, 0.125], &want, FP8_OUTPUT_REL_RMS).unwrap_err();
    assert!(e.contains("of the output's RMS"), "{e}");
    let e = compare_outputs_rms(&[0.5, f32::NAN, 0.125], &want, FP8_OUTPUT_REL_RMS).unwrap_err();
    assert!(e.contains("1 elements"), "{e}");
}

/// The real compile path (NVRTC, several threads) with a fake timer; needs NVRTC, no GPU.
/// Run with `cargo test --test tune -- --ignored` where NVRTC is on the library path.
#[test]
#[ignore]
fn real_compiles_in_parallel() {
    let dir = tempfile::tempdir().unwrap();
    let cache = flash_runtime::KernelCache::new(Some(dir.path().to_path_buf()));
    let compiler = CacheCompiler {
        cache: &cache,
        arch: "sm_90a".into(),
    };
    let mut timer = FakeTimer {
        timed: vec![],
        checked: vec![],
        wrong: None,
    };
    let opts = TuneOptions {
        max_smem: 227 * 1024,
        threads: 2,
        family: None,
        seq_q: None,
        flops: 0.0,
        exclude: vec![],
        min_gain: 0.0,
    };
    let r = tune(
        &causal(),
        "sm_90a",
        &opts,
        &compiler,
        &mut timer,
        &mut |p| eprintln!("{p:?}"),
    )
    .unwrap();
    for c in &r.candidates {
        if !matches!(&c.status, Status::Pruned(w) if w.starts_with("layout")) {
            eprintln!(
                "{} {:?} {}",
                config_label(&c.config),
                c.resources,
                c.status.short()
            );
        }
    }
}

/// A candidate that kills the context aborts the search naming it; excluding it lets the
/// search finish.
#[test]
fn a_faulting_candidate_aborts_and_can_be_excluded() {
    struct Faulty {
        bad: TileConfig,
        dead: bool,
    }
    impl Timer for Faulty {
        fn time(&mut self, cfg: &TileConfig) -> Result<f64, String> {
            if self.dead || *cfg == self.bad {
                self.dead = true;
                return Err("illegal address".into());
            }
            Ok(1.0 + cfg.block_n as f64 / 1000.0)
        }
        fn check(&mut self, _: &TileConfig) -> Result<(), String> {
            if self.dead {
                Err("dead".into())
            } else {
                Ok(())
            }
        }
        fn healthy(&mut self) -> Result<(), String> {
            if self.dead {
                Err("context destroyed".into())
            } else {
                Ok(())
            }
        }
    }
    let compiler = FakeCompiler {
        calls: Mutex::new(Vec::new()),
    };
    let bad = cfg(128, 32, 8, 2, KernelFamily::Sm80);
    let mut opts = TuneOptions {
        max_smem: 227 * 1024,
        threads: 2,
        family: None,
        seq_q: None,
        flops: 0.0,
        exclude: vec![],
        min_gain: 0.0,
    };
    let mut t = Faulty { bad, dead: false };
    let e = tune(&causal(), "sm_80", &opts, &compiler, &mut t, &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("{CONTEXT_LOST}{}: ", config_label(&bad))),
        "{e}"
    );
    opts.exclude.push(config_label(&bad));
    let mut t = Faulty { bad, dead: false };
    let r = tune(&causal(), "sm_80", &opts, &compiler, &mut t, &mut |_| {}).unwrap();
    let c = r.candidates.iter().find(|c| c.config == bad).unwrap();
    assert!(matches!(&c.status, Status::Pruned(w) if w.starts_with("excluded")));
}

/// Within the noise margin the default stays; beyond it the faster configuration wins.
#[test]
fn the_default_stays_unless_beaten_by_the_margin() {
    struct Close(f64);
    impl Timer for Close {
        fn time(&mut self, cfg: &TileConfig) -> Result<f64, String> {
            let d = flash_dsl::plan::default_config_for(&causal(), KernelFamily::Sm80);
            Ok(if *cfg == d {
                1.0
            } else {
                self.0 + cfg.block_n as f64 * 1e-6
            })
        }
        fn check(&mut self, _: &TileConfig) -> Result<(), String> {
            Ok(())
        }
    }
    let compiler = FakeCompiler {
        calls: Mutex::new(Vec::new()),
    };
    let opts = TuneOptions {
        max_smem: 227 * 1024,
        threads: 2,
        family: None,
        seq_q: None,
        flops: 0.0,
        exclude: vec![],
        min_gain: 0.02,
    };
    // 1% faster: noise, the default stays.
    let r = tune(
        &causal(),
        "sm_80",
        &opts,
        &compiler,
        &mut Close(0.99),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(r.winner, r.default);
    assert_eq!(r.count(|s| *s == Status::Winner), 1);
    // 5% faster: it wins.
    let r = tune(
        &causal(),
        "sm_80",
        &opts,
        &compiler,
        &mut Close(0.95),
        &mut |_| {},
    )
    .unwrap();
    assert_ne!(r.winner, r.default);
    assert!(r.winner_ms < 0.96);
}
