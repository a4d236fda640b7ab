//! Keeps ARCHITECTURE.md true: every workspace member has a section in the code map.

use std::path::Path;

#[test]
fn every_workspace_crate_is_in_the_code_map() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let architecture = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let members: Vec<&str> = manifest
        .lines()
        .map(str::trim)
        .filter_map(|line| line.strip_prefix("\"crates/"))
        .filter_map(|rest| rest.strip_suffix("\","))
        .collect();
    assert!(
        members.len() >= 5,
        "could not read the members list: {members:?}"
    );
    let missing: Vec<&&str> = members
        .iter()
        .filter(|crate_dir| !architecture.contains(&format!("### `crates/{crate_dir}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "crates missing from ARCHITECTURE.md: {missing:?}"
    );
}
