//! `ftvm --version` (issue 32 item 7): the version and the git commit the
//! binary was built from (crates/ftvm/build.rs), "unknown" outside a git
//! checkout.

use std::path::Path;
use std::process::Command;

/// `ftvm --version`: the version and the commit the binary was built from.
#[test]
fn version_names_the_commit() {
    let out = Command::new(env!("CARGO_BIN_EXE_ftvm")).arg("--version").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let head = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8(o.stdout).unwrap().trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    assert_eq!(text, format!("ftvm {} (commit {head})\n", env!("CARGO_PKG_VERSION")));
}
