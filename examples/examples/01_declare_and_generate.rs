//! Tutorial 1: declare variants with `attention!`, then plan them and generate their CUDA.
//! Needs no GPU and no NVRTC.
//!
//! ```sh
//! cargo run -p flash-examples --example 01_declare_and_generate
//! ```

use flash_dsl::eval::{ParamValue, ParamValues};
use flash_dsl::plan::{default_config_for, key_tile_classes, KernelFamily, TileClass, TileEnv};
use flash_dsl::VariantSpec;
use flash_runtime::Variant;

flash_macros::attention! {
    /// Gemma-2 local layers: a 256-key causal window with a runtime logit soft-cap.
    pub GemmaLocal {
        head_dim: 128,
        dtype: bf16,
        params: { cap: f32 },
        mask: window(256),
        score: softcap(s, cap),
    }
    /// Packed documents: causal attention that never crosses a document boundary.
    pub Document {
        head_dim: 128,
        dtype: bf16,
        params: { doc: [i32; seq] },
        mask: causal && doc[q] == doc[k],
    }
}

/// The macro keeps each declaration's tokens in `Variant::SOURCE`; the runtime (and this
/// example) re-parse them into the validated spec.
fn spec_of<V: Variant>() -> VariantSpec {
    flash_dsl::parse::parse_str(V::SOURCE)
        .expect("the macro validated this declaration")
        .into_iter()
        .find(|s| s.name == V::NAME)
        .expect("the source declares the variant")
}

/// One line per query tile: `#` full, `+` partial (mask evaluated per element), `.` skipped.
fn print_tile_map(plan: &flash_dsl::KernelPlan, params: &ParamValues, seq: usize) {
    let env = TileEnv::new(0, 0, seq, seq, params);
    for qt in 0..plan.query_tiles(seq) {
        let row: String = key_tile_classes(plan, &env, qt, seq, seq)
            .into_iter()
            .map(|c| match c {
                TileClass::Full => '#',
                TileClass::Partial => '+',
                TileClass::Empty => '.',
            })
            .collect();
        println!("    q tile {qt:>2}: {row}");
    }
}

fn main() {
    let seq = 1024;
    // Three documents of 300, 500 and 224 tokens (sorted ids, as packed batches have).
    let doc: Vec<i64> = (0..seq as i64)
        .map(|i| {
            if i < 300 {
                0
            } else if i < 800 {
                1
            } else {
                2
            }
        })
        .collect();
    let cases = [
        (
            spec_of::<GemmaLocal>(),
            ParamValues::new(vec![ParamValue::Float(30.0)]),
        ),
        (
            spec_of::<Document>(),
            ParamValues::new(vec![ParamValue::IntTensor(doc)]),
        ),
    ];

    for (spec, params) in &cases {
        println!("== {} ({})", spec.name, spec.doc.trim());
        for family in [KernelFamily::Sm90, KernelFamily::Sm80] {
            let cfg = default_config_for(spec, family);
            let plan = match flash_dsl::plan(spec, Some(cfg)) {
                Ok(p) => p,
                Err(e) => {
                    println!("  {family:?}: cannot plan: {e}");
                    continue;
                }
            };
            let src = flash_dsl::emit(&plan);
            println!(
                "  {family:?}: kernel {} — {} threads, {} bytes of dynamic shared memory, {} lines of CUDA, {} header file(s)",
                plan.kernel_name,
                plan.threads(),
                plan.smem_bytes(),
                src.source.lines().count(),
                src.headers.len(),
            );
            if family == KernelFamily::Sm90 {
                println!("  tile classes at seq {seq} (`#` full, `+` partial, `.` skipped):");
                print_tile_map(&plan, params, seq);
            }
        }
    }

    // The generated source of one kernel; `flash gen FILE` prints it for a `.flash` file.
    let plan = flash_dsl::plan(&cases[0].0, None).expect("plans");
    let src = flash_dsl::emit(&plan);
    println!("\n== the first lines of {}.cu", src.kernel_name);
    for line in src.source.lines().take(30) {
        println!("{line}");
    }
    println!("... ({} lines in all)", src.source.lines().count());
}
