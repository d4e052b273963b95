//! The guest knows the date (issue 32): Debian's kernel sets its clock at
//! boot from the board's Goldfish RTC, which shows the host's clock at the
//! VM's creation plus the virtual time since. Checked against the host's
//! clock in a booted guest (`ftvm run --exec 'date +%s'`), and in a guest
//! restored from a snapshot well over a minute after it was taken: the
//! restored RTC reads the host's clock, not the snapshot's, and the
//! guest's own clock (which Linux sets from the RTC at boot only) follows
//! it within seconds: the image's init steps it when the RTC jumps
//! (guest/ftvm-init, `follow_rtc`), with nothing typed in the guest.
//!
//! Needs the built image (`make image`). Every boot uses a temporary copy
//! of the root filesystem.

mod common;

use common::Scratch;
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const BOOT_TIMEOUT: Duration = Duration::from_secs(600);
/// How far the guest's date may be from the host's (the RTC counts whole
/// seconds; virtual time follows the host's only approximately).
const TOLERANCE: u64 = 60;
/// Between the snapshot and the restore: longer than the tolerance, so a
/// restored RTC that went on from the snapshot's date would be caught.
const GAP: Duration = Duration::from_secs(75);

fn host_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn rootfs_copy(s: &Scratch) -> String {
    let img = ftvm_image::locate()
        .unwrap_or_else(|e| panic!("the default guest image is not available ({e}): run `make image`"));
    let disk = s.path("root.ext4");
    ftvm_image::sparse_copy(&img.rootfs, &disk).expect("copying the root filesystem");
    common::path_str(&disk)
}

/// Asserts `guest` lies within [`TOLERANCE`] of the host's clock between
/// `before` and `after`.
fn assert_near(what: &str, guest: u64, before: u64, after: u64) {
    eprintln!("{what}: guest {guest}, host {before}..{after}");
    assert!(
        guest + TOLERANCE >= before && guest <= after + TOLERANCE,
        "{what}: the guest says {guest}, the host said {before}..{after} (more than {TOLERANCE} s apart)"
    );
}

#[test]
fn a_booted_guest_knows_the_date() {
    let s = Scratch::new("rtc", "boot");
    let disk = rootfs_copy(&s);
    let before = host_now();
    let mut c = Command::new(env!("CARGO_BIN_EXE_ftvm"));
    c.args(["run", "--mem", "512M", "--disk", &disk, "--exec", "date +%s"]);
    let run = common::run_with_timeout(c, BOOT_TIMEOUT);
    let after = host_now();
    assert_eq!(run.status.and_then(|s| s.code()), Some(0), "ftvm run: stdout {:?} stderr {:?}", run.stdout, run.stderr);
    let guest: u64 = run.stdout.trim().parse().unwrap_or_else(|_| panic!("date +%s printed {:?}", run.stdout));
    assert_near("booted guest's date", guest, before, after);
}

/// An interactive VM whose console output is collected as it comes.
struct Console {
    child: Child,
    seen: Arc<Mutex<String>>,
}

impl Console {
    fn start(args: &[&str]) -> Console {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ftvm"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting ftvm");
        let seen = Arc::new(Mutex::new(String::new()));
        let mut out = child.stdout.take().unwrap();
        let sink = seen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Console { child, seen }
    }

    fn wait_for(&self, needle: &str, limit: Duration) {
        let start = Instant::now();
        while !self.seen.lock().unwrap().contains(needle) {
            assert!(start.elapsed() < limit, "no {needle:?} on the console within {limit:?}; got:\n{}", self.text());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn text(&self) -> String {
        self.seen.lock().unwrap().clone()
    }

    fn type_line(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(format!("{line}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The number after the first `key` that is followed by a digit (the
/// tty's echo of the command shows `key$(`, never digits).
fn number_after(text: &str, key: &str) -> Option<u64> {
    text.match_indices(key).find_map(|(i, _)| {
        let digits: String = text[i + key.len()..].chars().take_while(|c| c.is_ascii_digit()).collect();
        digits.parse().ok()
    })
}

fn control(sock: &str, words: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ftvm")).arg("control").arg(sock).args(words).output().unwrap();
    assert!(out.status.success(), "ftvm control {words:?}: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn a_restored_guest_reads_the_hosts_date_from_its_rtc() {
    const PROMPT: &str = "root@ftvm-guest:~# ";
    let s = Scratch::new("rtc", "restore");
    let disk = rootfs_copy(&s);
    let sock = common::path_str(&s.path("vm.sock"));
    let snap = common::path_str(&s.path("vm.snap"));
    let mut vm = Console::start(&["run", "--mem", "512M", "--disk", &disk, "--control", &sock]);
    vm.wait_for(PROMPT, BOOT_TIMEOUT);
    let before = host_now();
    vm.type_line("echo booted=$(date +%s)");
    vm.wait_for("booted=1", Duration::from_secs(60));
    let booted = number_after(&vm.text(), "booted=").unwrap();
    assert_near("booted guest's date", booted, before, host_now());
    // Paused, the disk stays what the snapshot expects.
    assert_eq!(control(&sock, &["pause"]), "ok paused");
    let reply = control(&sock, &["snapshot", &snap]);
    assert!(reply.starts_with("ok snapshot"), "{reply}");
    drop(vm);
    let snapped = host_now();

    std::thread::sleep(GAP);
    let before = host_now();
    let mut vm = Console::start(&["run", "--restore", &snap]);
    // The shell waits at its prompt as it did when the snapshot was taken.
    // Its clock is stepped within the init's period (2 s of guest time)
    // after the restore; 5 s covers it, and the line shows both clocks.
    vm.type_line("sleep 5; echo rtc=$(cat /sys/class/rtc/rtc0/since_epoch) date=$(date +%s)");
    vm.wait_for("date=1", Duration::from_secs(120));
    let after = host_now();
    let text = vm.text();
    let rtc = number_after(&text, "rtc=").unwrap_or_else(|| panic!("no rtc= in {text:?}"));
    let date = number_after(&text, "date=").unwrap_or_else(|| panic!("no date= in {text:?}"));
    eprintln!(
        "restored guest: snapshot taken at {snapped}, restored at {before}; the guest's date {} s from the host's",
        date as i64 - before as i64
    );
    assert_near("restored guest's RTC", rtc, before, after);
    assert_near("restored guest's date", date, before, after);
    vm.type_line("poweroff");
    let t0 = Instant::now();
    while vm.child.try_wait().unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(60), "the restored VM did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }
}
