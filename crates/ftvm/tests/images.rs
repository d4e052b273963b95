//! End to end: an image a user shapes. `ftvm image build --packages
//! jq,sqlite3 --size ... --add DIR:/PATH --name NAME` fetches the
//! packages through apt (the mirror from the machine's apt configuration)
//! and shows its progress; the image is listed, located, booted with
//! `ftvm run --image NAME` (the software and the files are there, the
//! root disk has the size asked), and removed.
//!
//! Needs root and the Debian mirror (the packages beyond the default
//! image's are downloaded). The image goes into the cache under a name of
//! this test's own and is removed at the end, whatever happens.

mod common;

use common::{run_with_timeout, Run, Scratch};
use std::process::Command;
use std::time::Duration;

/// A build on a slow mirror, or a boot on a busy host; past this it hangs.
const TIMEOUT: Duration = Duration::from_secs(1200);

fn ftvm(args: &[&str]) -> Run {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ftvm"));
    c.args(args);
    run_with_timeout(c, TIMEOUT)
}

fn ok(run: &Run, what: &str) {
    assert_eq!(run.status.and_then(|s| s.code()), Some(0), "{what}: {}{}", run.stdout, run.stderr);
}

/// Removes the image at the end of the test, passed or not.
struct Removed(String);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = ftvm(&["image", "rm", &self.0]);
    }
}

#[test]
fn a_named_image_with_more_packages_and_files_is_built_listed_booted_and_removed() {
    let name = format!("ftvm-test-{}", std::process::id());
    let s = Scratch::new("images", "add");
    std::fs::create_dir_all(s.path("mine/conf")).unwrap();
    s.file("mine/conf/greeting", b"hello from the host\n");
    let add = format!("{}:/opt/mine", s.path("mine").display());
    let _cleanup = Removed(name.clone());

    // Small packages (not python3, which the README's example builds
    // and whose configuration compiles its library: minutes of CI).
    let build =
        ftvm(&["image", "build", "--name", &name, "--packages", "jq,sqlite3", "--size", "1536M", "--add", &add]);
    ok(&build, "ftvm image build");
    // Progress, as plain lines (stderr is not a terminal here): every
    // step, and the bytes of packages.
    for n in 1..=8 {
        assert!(build.stderr.contains(&format!("[{n}/8] ")), "no step {n} in the build's progress:\n{}", build.stderr);
    }
    assert!(build.stderr.contains("of packages at hand"), "no bytes in the build's progress:\n{}", build.stderr);
    let dir = build.stdout.trim().to_string();
    assert!(dir.ends_with(&name), "the build printed {dir:?}");

    let path = ftvm(&["image", "path", &name]);
    ok(&path, "ftvm image path NAME");
    assert_eq!(path.stdout.trim(), dir);
    let list = ftvm(&["image", "list"]);
    ok(&list, "ftvm image list");
    let line = list.stdout.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| {
        panic!("ftvm image list does not show {name}:\n{}", list.stdout);
    });
    assert!(line.contains("1536 MiB") && line.contains("jq,sqlite3"), "{line}");
    // Built as asked already: not built again.
    let again =
        ftvm(&["image", "build", "--name", &name, "--packages", "jq,sqlite3", "--size", "1536M", "--add", &add]);
    ok(&again, "the same build again");
    assert!(again.stderr.contains("up to date"), "{}", again.stderr);

    let cmd = "jq -M -n '6 * 7'; sqlite3 :memory: 'select 40 + 2;'; cat /opt/mine/conf/greeting; \
               df -m / | tail -1 | awk '{print \"root-mib\", $2}'";
    let run = ftvm(&["run", "--image", &name, "--exec", cmd]);
    ok(&run, "ftvm run --image NAME");
    let out = run.stdout.replace("\r\n", "\n");
    assert_eq!(out.lines().filter(|l| *l == "42").count(), 2, "jq and sqlite3 in the guest:\n{out}");
    assert!(out.lines().any(|l| l == "hello from the host"), "the added file:\n{out}");
    let root_mib: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("root-mib "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no root size in:\n{out}"));
    assert!((1300..=1536).contains(&root_mib), "the root is {root_mib} MiB, not about 1536");
    // The default image has neither.
    let plain = ftvm(&["run", "--exec", "command -v jq sqlite3; echo end"]);
    ok(&plain, "ftvm run");
    assert_eq!(plain.stdout.replace("\r\n", "\n").trim(), "end", "the default image changed");

    let rm = ftvm(&["image", "rm", &name]);
    ok(&rm, "ftvm image rm NAME");
    assert!(!std::path::Path::new(&dir).exists(), "{dir} is still there");
    let gone = ftvm(&["run", "--image", &name, "--exec", "true"]);
    assert_eq!(gone.status.and_then(|s| s.code()), Some(1));
    assert!(gone.stderr.contains(&format!("there is no image called {name}")), "{}", gone.stderr);
    assert_eq!(gone.stderr.lines().count(), 1, "{}", gone.stderr);
}
