//! The control socket against careless and hostile clients (issue 26):
//! a snapshot never replaces one of the VM's disks or an existing file
//! unless asked, a relative path means the client's directory, a huge
//! line does not grow the VM, and a client does not wait forever for a
//! VM that does not answer.
//!
//! The VM is a hart waiting for interrupts (`wfi`) with a small disk: no
//! guest image is needed, and it stays up until told to quit.

use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::Scratch;

/// `wfi` then a jump back to it.
const WFI_LOOP: [u8; 8] = [0x73, 0x00, 0x50, 0x10, 0x6f, 0xf0, 0xdf, 0xff];

struct Vm {
    child: Child,
    sock: PathBuf,
}

impl Vm {
    fn start(s: &Scratch, disk: &str) -> Vm {
        let kernel = s.file("wfi.bin", &WFI_LOOP);
        let sock = s.path("vm.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_ftvm"))
            .args(["run", "--bios", "none", "--kernel", &kernel, "--disk", disk, "--control"])
            .arg(&sock)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        while UnixStream::connect(&sock).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(60), "the VM's control socket never came");
            std::thread::sleep(Duration::from_millis(20));
        }
        Vm { child, sock }
    }

    /// `ftvm control SOCK words...` from `dir`: (exit status, stdout, stderr).
    fn control(&self, dir: &Path, words: &[&str]) -> (i32, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_ftvm"))
            .current_dir(dir)
            .arg("control")
            .arg(&self.sock)
            .args(words)
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
        (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
    }

    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_snapshot_never_replaces_a_disk_or_a_file_it_was_not_asked_to() {
    let s = Scratch::new("control-socket", "snapshot");
    let disk = s.file("disk.img", &[0x5a; 8192]);
    let vm = Vm::start(&s, &disk);
    // Onto the VM's own disk, even asked to overwrite: refused, disk intact.
    for words in [&["snapshot", disk.as_str()][..], &["snapshot", "--overwrite", disk.as_str()]] {
        let (rc, out, _) = vm.control(&s.dir, words);
        assert_ne!(rc, 0, "{out}");
        assert!(out.contains("is one of the VM's disks"), "{out}");
    }
    assert_eq!(std::fs::read(&disk).unwrap(), vec![0x5a; 8192], "the disk changed");
    // A relative path is the client's: here, the scratch directory.
    let (rc, out, err) = vm.control(&s.dir, &["snapshot", "vm.snap"]);
    assert_eq!(rc, 0, "{out} {err}");
    assert!(s.dir.join("vm.snap").is_file(), "{out}");
    // Again: the file exists, and is kept unless overwriting is asked for.
    let before = std::fs::read(s.dir.join("vm.snap")).unwrap();
    let (rc, out, _) = vm.control(&s.dir, &["pause"]);
    assert_eq!(rc, 0, "{out}");
    let (rc, out, _) = vm.control(&s.dir, &["snapshot", "vm.snap"]);
    assert_ne!(rc, 0, "{out}");
    assert!(out.contains("exists"), "{out}");
    assert_eq!(std::fs::read(s.dir.join("vm.snap")).unwrap(), before);
    let (rc, out, _) = vm.control(&s.dir, &["snapshot", "--overwrite", "vm.snap"]);
    assert_eq!(rc, 0, "{out}");
    // A client that sends a relative path itself is refused, not resolved
    // in the VM's directory.
    let mut raw = UnixStream::connect(&vm.sock).unwrap();
    writeln!(raw, r#"{{"request":"snapshot","path":"elsewhere.snap"}}"#).unwrap();
    let mut reply = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(raw), &mut reply).unwrap();
    assert!(reply.contains("relative_path"), "{reply}");
}

#[test]
fn a_huge_line_leaves_the_vm_as_it_was() {
    let s = Scratch::new("control-socket", "huge-line");
    let disk = s.file("disk.img", &[0; 4096]);
    let vm = Vm::start(&s, &disk);
    let before = vm.rss_kib();
    let mut sent = 0usize;
    for _ in 0..4 {
        let mut c = UnixStream::connect(&vm.sock).unwrap();
        c.set_write_timeout(Some(Duration::from_secs(15))).unwrap();
        let chunk = vec![b'x'; 1 << 20];
        // 125 MiB a connection, 500 MiB in all, unless the VM hangs up.
        for _ in 0..125 {
            if c.write_all(&chunk).is_err() {
                break;
            }
            sent += chunk.len();
        }
    }
    let after = vm.rss_kib();
    let (rc, out, _) = vm.control(&s.dir, &["status"]);
    assert_eq!(rc, 0, "the VM stopped answering: {out}");
    assert!(after < before + 8 * 1024, "the VM grew from {before} KiB to {after} KiB ({sent} bytes sent)");
}

#[test]
fn a_client_gives_up_on_a_vm_that_does_not_answer() {
    let s = Scratch::new("control-socket", "mute");
    let sock = s.path("mute.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let _held = std::thread::spawn(move || {
        let conns: Vec<_> = listener.incoming().take(1).collect();
        std::thread::sleep(Duration::from_secs(30));
        drop(conns);
    });
    let t0 = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_ftvm"))
        .args(["control", "--timeout", "1"])
        .arg(&sock)
        .arg("status")
        .output()
        .unwrap();
    let took = t0.elapsed();
    assert_ne!(out.status.code(), Some(0));
    assert!(took < Duration::from_secs(20), "the client waited {took:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("ftvm: control socket") && err.lines().count() == 1, "{err}");
}
