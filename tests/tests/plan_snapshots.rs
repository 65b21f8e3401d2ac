//! Snapshots of `plan(spec, None)` for every example variant in `examples/variants`, so a change
//! in tile defaults, argument layout or mask analysis shows up as a reviewable diff.
//!
//! To accept changes: `INSTA_UPDATE=always cargo test -p flash-tests --test plan_snapshots`,
//! then review the `.snap` files under `tests/snapshots/`.

use std::path::Path;

use flash_dsl::files::load_flash_dir;
use flash_dsl::plan::plan;

#[test]
fn example_plans() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/variants");
    let files = load_flash_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        files.len() >= 9,
        "expected the example variants in {}",
        dir.display()
    );
    for (path, specs) in files {
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        for spec in specs {
            let plan = plan(&spec, None).unwrap_or_else(|e| panic!("{stem}: {e}"));
            insta::with_settings!({
                description => format!("plan(spec, None) of examples/variants/{stem}.flash"),
                omit_expression => true,
            }, {
                insta::assert_yaml_snapshot!(stem.clone(), plan);
            });
        }
    }
}
