//! Snapshots of the CUDA source emitted for every example variant, for every kernel family
//! (`sm80`: mma.sync; `sm90`: wgmma; `sm90ws`: wgmma with a TMA producer warpgroup), with each
//! family's default tile configuration. A change to
//! a template or to the expression translation shows up as a reviewable diff of real kernels.
//!
//! To accept changes: `INSTA_UPDATE=always cargo test -p flash-tests --test cuda_snapshots`,
//! then review the `.snap` files under `tests/snapshots/`.

use std::path::Path;

use flash_dsl::files::load_flash_dir;
use flash_dsl::plan::{default_config_for, plan, KernelFamily};

fn examples() -> Vec<(String, flash_dsl::VariantSpec)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/variants");
    let mut out = vec![];
    for (path, specs) in load_flash_dir(&dir).unwrap_or_else(|e| panic!("{e}")) {
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        for spec in specs {
            out.push((stem.clone(), spec));
        }
    }
    assert!(out.len() >= 9, "expected the nine example variants");
    out
}

#[test]
fn example_kernels() {
    for (stem, spec) in examples() {
        for (family, tag) in [
            (KernelFamily::Sm80, "sm80"),
            (KernelFamily::Sm90, "sm90"),
            (KernelFamily::Sm90Ws, "sm90ws"),
        ] {
            let p = plan(&spec, Some(default_config_for(&spec, family))).unwrap();
            let src = flash_dsl::emit(&p);
            assert_eq!(src.kernel_name, p.kernel_name);
            assert!(src.source.contains(&format!(
                "{}(const __grid_constant__ Args args)",
                p.kernel_name
            )));
            assert!(
                !src.source.contains("#include <"),
                "kernels include no toolkit header"
            );
            insta::with_settings!({
                description => format!("emit(plan) of examples/variants/{stem}.flash, {tag} defaults"),
                omit_expression => true,
            }, {
                insta::assert_snapshot!(format!("{stem}_{tag}"), src.source);
            });
        }
    }
}

/// Equal plans give byte-identical source (the compile cache relies on it), and a change of a
/// runtime value never reaches the source: params live in the argument struct.
#[test]
fn emission_is_a_pure_function_of_the_plan() {
    for (_, spec) in examples() {
        let a = flash_dsl::emit(&plan(&spec, None).unwrap());
        let b = flash_dsl::emit(&plan(&spec.clone(), None).unwrap());
        assert_eq!(a, b);
    }
}

/// The backward kernels of every example (the main kernel per variant and family, which
/// carries the variant's hooks and score derivative; the pre-processing and dQ conversion
/// kernels once, as they only depend on dtype and head dims).
#[test]
fn example_backward_kernels() {
    use flash_dsl::plan::backward::plan_backward_main;
    use flash_dsl::plan::{
        backward_pipeline, default_backward_config, default_backward_config_for, KernelFamily,
    };
    for (i, (stem, spec)) in examples().into_iter().enumerate() {
        let pipe = backward_pipeline(&spec, default_backward_config()).unwrap();
        for (j, p) in pipe.kernels.iter().enumerate() {
            if j != 1 && i != 0 {
                continue;
            }
            let src = flash_dsl::emit(p);
            assert!(!src.source.contains("#include <"));
            insta::with_settings!({
                description => format!("emit of the {} kernel of examples/variants/{stem}.flash", p.kind.name()),
                omit_expression => true,
            }, {
                insta::assert_snapshot!(format!("{stem}_{}", p.kind.name()), src.source);
            });
        }
        // The wgmma main kernel of the Hopper devices.
        let cfg = default_backward_config_for(&spec, KernelFamily::Sm90Ws);
        assert_eq!(cfg.family, KernelFamily::Sm90);
        let src = flash_dsl::emit(&plan_backward_main(&spec, cfg).unwrap());
        insta::with_settings!({
            description => format!("emit of the sm90 backward main kernel of examples/variants/{stem}.flash"),
            omit_expression => true,
        }, {
            insta::assert_snapshot!(format!("{stem}_backward_main_sm90"), src.source);
        });
    }
}

/// The block-map build kernels of every example whose mask reads tensors: the forward's map at
/// the sm90ws forward tiles, the backward's transposed map at the sm90 backward tiles.
#[test]
fn example_block_map_builders() {
    use flash_dsl::plan::{default_backward_config_for, plan_block_map, BlockMapPlan};
    let mut n = 0;
    for (stem, spec) in examples() {
        let f = default_config_for(&spec, KernelFamily::Sm90Ws);
        let b = default_backward_config_for(&spec, KernelFamily::Sm90);
        for (m, tag) in [
            (
                BlockMapPlan::for_spec(&spec, f.block_m, f.block_n, false),
                "block_map",
            ),
            (
                BlockMapPlan::for_spec(&spec, b.block_m, b.block_n, true),
                "block_map_keys",
            ),
        ] {
            let Some(m) = m else { continue };
            n += 1;
            let src = flash_dsl::emit(&plan_block_map(&spec, m).unwrap());
            assert!(!src.source.contains("#include <"));
            insta::with_settings!({
                description => format!("emit of the {tag} build kernel of examples/variants/{stem}.flash"),
                omit_expression => true,
            }, {
                insta::assert_snapshot!(format!("{stem}_{tag}"), src.source);
            });
        }
    }
    assert_eq!(n, 4, "the Document and BigBird examples' two maps each");
}
