//! Stamps the binary with the git commit it was built from, for
//! `ftvm --version`: `FTVM_GIT_COMMIT`, the short hash of HEAD, or
//! "unknown" outside a git checkout (a source tarball, a vendored copy)
//! or without git. Uncommitted changes are not marked: nothing would
//! build the binary again when only the working tree changed.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    let stamp = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=FTVM_GIT_COMMIT={stamp}");
    // Built again when HEAD moves: HEAD itself (a checkout), the branch it
    // points to (a commit; in a worktree these live in different places,
    // which `--git-path` resolves), and packed refs.
    for file in ["HEAD", "packed-refs"] {
        if let Some(p) = git(&["rev-parse", "--git-path", file]) {
            println!("cargo:rerun-if-changed={}", PathBuf::from(p).display());
        }
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        if let Some(p) = git(&["rev-parse", "--git-path", &branch]) {
            println!("cargo:rerun-if-changed={}", PathBuf::from(p).display());
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
