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

/// A 64-bit RISC-V ELF header with one PT_LOAD program header of `filesz`
/// bytes at file offset 120, and only `data` after the headers.
pub fn riscv_elf(filesz: u64, data: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 120];
    b[..4].copy_from_slice(b"\x7fELF");
    b[4] = 2; // 64-bit
    b[5] = 1; // little-endian
    b[6] = 1; // version
    b[16] = 2; // ET_EXEC
    b[18..20].copy_from_slice(&243u16.to_le_bytes()); // EM_RISCV
    b[20] = 1;
    b[24..32].copy_from_slice(&0x8000_0000u64.to_le_bytes()); // entry
    b[32..40].copy_from_slice(&64u64.to_le_bytes()); // phoff
    b[52..54].copy_from_slice(&64u16.to_le_bytes()); // ehsize
    b[54..56].copy_from_slice(&56u16.to_le_bytes()); // phentsize
    b[56..58].copy_from_slice(&1u16.to_le_bytes()); // phnum
    let ph = 64;
    b[ph..ph + 4].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    b[ph + 4..ph + 8].copy_from_slice(&5u32.to_le_bytes()); // R X
    b[ph + 8..ph + 16].copy_from_slice(&120u64.to_le_bytes()); // offset
    b[ph + 16..ph + 24].copy_from_slice(&0x8000_0000u64.to_le_bytes()); // vaddr
    b[ph + 24..ph + 32].copy_from_slice(&0x8000_0000u64.to_le_bytes()); // paddr
    b[ph + 32..ph + 40].copy_from_slice(&filesz.to_le_bytes());
    b[ph + 40..ph + 48].copy_from_slice(&filesz.to_le_bytes());
    b.extend_from_slice(data);
    b
}
