//! Shared by the integration tests: run a command with a time limit and
//! capture what it printed; scratch directories.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

pub mod net;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub struct Run {
    /// `None` if it was still running at the deadline (then killed).
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
}

/// Run `cmd` with stdin closed and its output captured (read on threads,
/// so a chatty child cannot block on a full pipe), killing it after
/// `timeout`.
pub fn run_with_timeout(mut cmd: Command, timeout: Duration) -> Run {
    let mut child =
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("starting the command");
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = pipe.read_to_end(&mut v);
            v
        })
    };
    let out_reader = drain(Box::new(child.stdout.take().unwrap()));
    let err_reader = drain(Box::new(child.stderr.take().unwrap()));
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("waiting for the command") {
            break Some(s);
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Run {
        status,
        stdout: String::from_utf8_lossy(&out_reader.join().unwrap()).into_owned(),
        stderr: String::from_utf8_lossy(&err_reader.join().unwrap()).into_owned(),
    }
}

/// A scratch directory, removed when dropped.
pub struct Scratch {
    pub dir: PathBuf,
}

impl Scratch {
    /// `/tmp/ftvm-TEST-PID-TAG`: one per test binary, process and tag.
    pub fn new(test: &str, tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ftvm-{test}-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("creating a scratch directory");
        Scratch { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Writes a file and returns its path.
    pub fn file(&self, name: &str, data: &[u8]) -> String {
        let p = self.path(name);
        std::fs::write(&p, data).expect("writing a scratch file");
        path_str(&p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn path_str(p: &Path) -> String {
    p.to_str().expect("scratch paths are UTF-8").to_string()
}
