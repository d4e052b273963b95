//! End to end: a run on an image's root disk leaves the image as it was.
//!
//! `ftvm run` with no `--disk` boots the image's root on a copy-on-write
//! copy of its own: a file a guest writes is gone in the next run, and the
//! cached `rootfs.ext4` hashes the same before and after. `--persist`
//! writes through (the next run sees the file, the image's hash changes).
//! A snapshot names the run's copy, which is then kept for `--restore`.
//!
//! Runs in a cache of its own (`FTVM_CACHE_DIR` = a scratch directory
//! holding a copy of the default image), so a failure, or `--persist`,
//! never changes the image other tests boot.

mod common;

use common::{run_with_timeout, Scratch};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(600);

/// Prints whether the guest saw the marker of an earlier run, then leaves one.
const TOUCH: &str =
    "if [ -e /root/ftvm-marker ]; then echo marker-seen; else echo marker-absent; fi; echo x > /root/ftvm-marker; sync";

/// A cache directory holding a copy of the default image (the small files
/// hard-linked, the root disk a sparse copy: it is the one a run could
/// change).
fn private_cache(s: &Scratch) -> std::path::PathBuf {
    let img = ftvm_image::locate().unwrap_or_else(|e| panic!("the default guest image is not available ({e})"));
    let src = img.rootfs.parent().unwrap();
    let cache = s.path("cache");
    let dst = cache.join("images").join(src.file_name().unwrap());
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let to = dst.join(e.file_name());
        if e.file_name() == "rootfs.ext4" {
            ftvm_image::sparse_copy(&e.path(), &to).unwrap();
        } else if std::fs::hard_link(e.path(), &to).is_err() {
            std::fs::copy(e.path(), &to).unwrap();
        }
    }
    cache
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().expect("running sha256sum");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap().to_string()
}

/// `ftvm run --exec TOUCH [extra]` in `cache`: what the guest printed.
fn touch_run(cache: &Path, extra: &[&str]) -> String {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ftvm"));
    c.env("FTVM_CACHE_DIR", cache).args(["run", "--mem", "512M", "--exec", TOUCH]).args(extra);
    let run = run_with_timeout(c, TIMEOUT);
    assert_eq!(run.status.and_then(|s| s.code()), Some(0), "ftvm run {extra:?}: {}{}", run.stdout, run.stderr);
    run.stdout.replace("\r\n", "\n")
}

/// Nothing of a run stays in the cache but the images themselves.
fn leftovers(cache: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut dirs = vec![cache.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if !p.starts_with(cache.join("images")) {
                found.push(p.display().to_string());
            }
        }
    }
    found
}

#[test]
fn a_run_on_the_image_leaves_it_pristine_and_persist_writes_through() {
    let s = Scratch::new("pristine", "root");
    let cache = private_cache(&s);
    let rootfs = cache.join("images").join(ftvm_image::IMAGE_NAME).join("rootfs.ext4");
    let before = sha256(&rootfs);

    let first = touch_run(&cache, &[]);
    assert!(first.lines().any(|l| l == "marker-absent"), "first run: {first}");
    let second = touch_run(&cache, &[]);
    assert!(second.lines().any(|l| l == "marker-absent"), "a file written in the first run is in the second: {second}");
    assert_eq!(sha256(&rootfs), before, "two runs changed the cached image");
    assert_eq!(leftovers(&cache), Vec::<String>::new(), "a run left files in the cache");

    // --persist: the guest's writes go into the image itself.
    let third = touch_run(&cache, &["--persist"]);
    assert!(third.lines().any(|l| l == "marker-absent"), "first --persist run: {third}");
    let fourth = touch_run(&cache, &[]);
    assert!(fourth.lines().any(|l| l == "marker-seen"), "--persist did not write through: {fourth}");
    assert_ne!(sha256(&rootfs), before, "--persist left the image as it was");
}

fn control(sock: &Path, words: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ftvm")).arg("control").arg(sock).args(words).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Starts `ftvm run ARGS` in `cache` (its console on a pipe held open) and
/// waits for its control socket.
fn start_with_socket(cache: &Path, args: &[&str], sock: &Path, log: &Path) -> std::process::Child {
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_ftvm"))
        .env("FTVM_CACHE_DIR", cache)
        .args(["run", "--mem", "512M", "--control"])
        .arg(sock)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while !sock.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("ftvm run {args:?} ended ({status}): {}", std::fs::read_to_string(log).unwrap_or_default());
        }
        assert!(t0.elapsed() < TIMEOUT, "no control socket");
        std::thread::sleep(Duration::from_millis(100));
    }
    child
}

fn wait_exit(child: &mut std::process::Child) -> Option<i32> {
    let t0 = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        if t0.elapsed() > TIMEOUT {
            let _ = child.kill();
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A snapshot names the VM's disks: the run's copy of the root disk is
/// kept when one was taken (the run says where), and the snapshot
/// restores on it; the image is still as it was.
#[test]
fn a_snapshot_keeps_the_runs_copy_of_the_root_disk() {
    let s = Scratch::new("pristine", "snapshot");
    let cache = private_cache(&s);
    let rootfs = cache.join("images").join(ftvm_image::IMAGE_NAME).join("rootfs.ext4");
    let before = sha256(&rootfs);
    let (sock, snap, log) = (s.path("vm.sock"), s.path("vm.snap"), s.path("first.log"));

    let mut vm = start_with_socket(&cache, &[], &sock, &log);
    std::thread::sleep(Duration::from_secs(3)); // the guest under way
    assert_eq!(control(&sock, &["pause"]), "ok paused");
    let reply = control(&sock, &["snapshot", snap.to_str().unwrap()]);
    assert!(reply.starts_with("ok snapshot"), "{reply}");
    assert_eq!(control(&sock, &["quit"]), "ok quitting");
    assert_eq!(wait_exit(&mut vm), Some(0), "{}", std::fs::read_to_string(&log).unwrap_or_default());
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("copy of the root disk is kept at") && said.contains("vm.snap"), "{said}");
    let kept: Vec<String> = leftovers(&cache).into_iter().filter(|p| p.ends_with(".ext4")).collect();
    assert_eq!(kept.len(), 1, "the run's copy: {kept:?}");

    // The snapshot restores on the kept copy; ending it removes nothing.
    let sock2 = s.path("restored.sock");
    let mut vm = start_with_socket(&cache, &["--restore", snap.to_str().unwrap()], &sock2, &s.path("second.log"));
    let status = control(&sock2, &["status"]);
    assert!(status.contains("icount="), "the restored VM's status: {status}");
    assert_eq!(control(&sock2, &["quit"]), "ok quitting");
    assert_eq!(wait_exit(&mut vm), Some(0), "{}", std::fs::read_to_string(s.path("second.log")).unwrap_or_default());
    assert!(Path::new(&kept[0]).exists(), "the kept copy went");
    assert_eq!(sha256(&rootfs), before, "the runs changed the cached image");
}
