//! The small things people reach for (issue 32 item 7), as a user sees
//! them: `ftvm list` (the VMs of this host with their control sockets,
//! roles and states; it does not wait on a socket that does not answer,
//! and forgets VMs that are gone), `--log-level` / `RUST_LOG` (diagnostics
//! through `tracing`, on stderr), shell completions and the man page.
//!
//! The VMs here need no guest image: a bare-metal hart that waits for
//! interrupts (`wfi`) for ever.

mod common;

use std::os::unix::net::UnixListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `wfi` then a jump back to it.
const WFI_LOOP: [u8; 8] = [0x73, 0x00, 0x50, 0x10, 0x6f, 0xf0, 0xdf, 0xff];

fn ftvm(run_dir: &std::path::Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ftvm"));
    c.env("FTVM_RUN_DIR", run_dir).env_remove("RUST_LOG");
    c
}

/// `ftvm [PRE...] run --bios none --kernel WFI --control SOCK`, once its
/// socket answers.
fn start_vm(s: &common::Scratch, run_dir: &std::path::Path, pre: &[&str], tag: &str) -> (Child, std::path::PathBuf) {
    let kernel = s.file("wfi.bin", &WFI_LOOP);
    let sock = s.path(&format!("{tag}.sock"));
    let child = ftvm(run_dir)
        .args(pre)
        .args(["run", "--bios", "none", "--kernel", &kernel, "--control", &common::path_str(&sock)])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(60), "the VM's control socket never came");
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, sock)
}

fn quit(run_dir: &std::path::Path, sock: &std::path::Path, child: Child) -> String {
    let q = ftvm(run_dir).arg("control").arg(sock).arg("quit").output().unwrap();
    assert!(q.status.success(), "quit: {}", String::from_utf8_lossy(&q.stderr));
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A running VM is listed with its socket, role and state; a process
/// gone without cleaning up is not (and its file is removed); a socket
/// that takes connections but never answers is listed as not answering,
/// within seconds; a VM that ended is gone from the list.
#[test]
fn list_shows_the_vms_and_never_hangs() {
    let s = common::Scratch::new("small", "list");
    let run_dir = s.path("run");
    let (child, sock) = start_vm(&s, &run_dir, &[], "vm");
    let pid = child.id();

    // A VM killed without cleaning up: its registration names a process
    // that is gone.
    let mut gone = Command::new("true").spawn().unwrap();
    gone.wait().unwrap();
    let stale = run_dir.join(format!("{}.json", gone.id()));
    let entry =
        |pid: u32, sock: &std::path::Path| format!(r#"{{"pid":{pid},"socket":"{}","command":"run"}}"#, sock.display());
    std::fs::write(&stale, entry(gone.id(), &sock)).unwrap();
    // A wedged VM: its socket takes connections and never answers (this
    // test's own process holds it).
    let wedged = s.path("wedged.sock");
    let _listener = UnixListener::bind(&wedged).unwrap();
    std::fs::write(run_dir.join(format!("{}.json", std::process::id())), entry(std::process::id(), &wedged)).unwrap();

    let t0 = Instant::now();
    let out = ftvm(&run_dir).arg("list").output().unwrap();
    let took = t0.elapsed();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "ftvm list: {}", String::from_utf8_lossy(&out.stderr));
    assert!(took < Duration::from_secs(10), "ftvm list took {took:?}");
    let line_of =
        |pid: u32| text.lines().find(|l| l.split_whitespace().next() == Some(&pid.to_string())).map(str::to_string);
    let vm = line_of(pid).unwrap_or_else(|| panic!("the VM (pid {pid}) is not listed:\n{text}"));
    let words: Vec<&str> = vm.split_whitespace().collect();
    assert_eq!(words[1..], ["run", "alone", &common::path_str(&sock), "running"], "the VM's line:\n{text}");
    let w = line_of(std::process::id()).unwrap_or_else(|| panic!("the wedged socket is not listed:\n{text}"));
    assert!(w.contains("not answering"), "the wedged socket's line: {w}");
    assert!(line_of(gone.id()).is_none() && !stale.exists(), "a process that is gone is listed:\n{text}");

    let json = ftvm(&run_dir).args(["list", "--json"]).output().unwrap();
    let first: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&json.stdout).lines().next().expect("a JSON line")).unwrap();
    assert!(first["pid"].as_u64().is_some() && first["socket"].as_str().is_some(), "{first}");

    quit(&run_dir, &sock, child);
    let _ = std::fs::remove_file(run_dir.join(format!("{}.json", std::process::id())));
    let out = ftvm(&run_dir).arg("list").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 1, "only the header once the VM ended:\n{text}");
}

/// `--log-level debug` (or `RUST_LOG=debug`) shows the host library's
/// diagnostics on stderr; by default they are not shown; a level that is
/// not one is refused in one line.
#[test]
fn log_level_shows_diagnostics() {
    let s = common::Scratch::new("small", "log");
    let run_dir = s.path("run");
    let (child, sock) = start_vm(&s, &run_dir, &["--log-level", "debug"], "debug");
    let stderr = quit(&run_dir, &sock, child);
    assert!(stderr.contains("DEBUG") && stderr.contains("control socket listening"), "--log-level debug: {stderr:?}");

    let (child, sock) = start_vm(&s, &run_dir, &[], "quiet");
    let stderr = quit(&run_dir, &sock, child);
    assert!(!stderr.contains("DEBUG"), "no --log-level: {stderr:?}");

    let kernel = s.file("wfi.bin", &WFI_LOOP);
    let out = ftvm(&run_dir)
        .args(["run", "--bios", "none", "--kernel", &kernel])
        .env("RUST_LOG", "nonsense")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "RUST_LOG=nonsense: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.starts_with("ftvm: RUST_LOG \"nonsense\" is not a level"), "{stderr}");
}

/// Completions for bash load in bash and complete `ftvm`; the man page is
/// roff for ftvm(1) naming the commands; `--dir` writes one a command.
#[test]
fn completions_and_man_pages_come_from_the_cli() {
    let s = common::Scratch::new("small", "man");
    let out = Command::new(env!("CARGO_BIN_EXE_ftvm")).args(["completions", "bash"]).output().unwrap();
    assert!(out.status.success());
    let script = s.file("ftvm.bash", &out.stdout);
    let check = Command::new("bash").args(["-c", &format!("source {script} && complete -p ftvm")]).output().unwrap();
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success() && said.contains("ftvm"), "bash: {said} {}", String::from_utf8_lossy(&check.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("list") && text.contains("--exec"), "the bash completions know the commands and options");

    let out = Command::new(env!("CARGO_BIN_EXE_ftvm")).arg("man").output().unwrap();
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ftvm man: {}", String::from_utf8_lossy(&out.stderr));
    assert!(page.contains(".TH ftvm 1") && page.contains("list") && page.contains("completions"), "man: {page}");

    let dir = s.path("man");
    let out = Command::new(env!("CARGO_BIN_EXE_ftvm")).arg("man").arg("--dir").arg(&dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for page in ["ftvm.1", "ftvm-run.1", "ftvm-list.1", "ftvm-ft-primary.1"] {
        assert!(dir.join(page).exists(), "{page} not written");
    }
}
