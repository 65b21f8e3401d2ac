//! Snapshots of `plan(spec, None)` for every example variant in `examples/variants`, so a change
//! in tile defaults, argument layout or mask analysis shows up as a reviewable diff.
//!
//! To accept changes: `INSTA_UPDATE=always cargo test -p flash-tests --test plan_snapshots`,
//! then review the `.snap` files under `tests/snapshots/`.

use std::path::Path;

use flash_dsl::plan::plan;

#[test]
fn example_plans() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/variants");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("examples/variants")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "flash"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 9,
        "expected the example variants in {}",
        dir.display()
    );
    for path in files {
        let src = std::fs::read_to_string(&path).unwrap();
        let specs = flash_dsl::parse::parse_str(&src)
            .unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
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
