//! `ftvm console SOCK` (issue 63): a terminal attached to a running VM's
//! serial console through its control socket, as a user in another shell
//! would use it. The console's recent output comes first; what the one
//! typing client types reaches the guest; a second client that wants to
//! type is refused in one line while any number watch; Ctrl-] detaches
//! and frees the typist's place; the VM's end closing ends every client.
//!
//! The guest is a bare-metal program (no image needed): it prints a
//! prompt, then echoes what it reads from the UART, letters upper-cased,
//! so what a client sees proves the bytes went through the guest.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;
use common::Scratch;

/// The echo program (16550 UART at 0x1000_0000, as on QEMU's `virt`).
const ECHO_S: &str = r#"
    .globl _start
_start:
    li   s0, 0x10000000
    la   s1, banner
1:  lbu  a0, 0(s1)
    beqz a0, 3f
    jal  putc
    addi s1, s1, 1
    j    1b
3:  lbu  t0, 5(s0)
    andi t0, t0, 1
    beqz t0, 3b
    lbu  a0, 0(s0)
    li   t1, 'a'
    blt  a0, t1, 4f
    li   t1, 'z'
    bgt  a0, t1, 4f
    addi a0, a0, -32
4:  jal  putc
    j    3b
putc:
    lbu  t0, 5(s0)
    andi t0, t0, 0x20
    beqz t0, putc
    sb   a0, 0(s0)
    ret
banner:
    .asciz "echo> "
"#;

/// Generous: the host is shared and noisy.
const WAIT: Duration = Duration::from_secs(60);

fn echo_program(s: &Scratch) -> String {
    let src = s.path("echo.S");
    std::fs::write(&src, ECHO_S).unwrap();
    let elf = s.path("echo.elf");
    let cc = Command::new("riscv64-linux-gnu-gcc")
        .args([
            "-nostdlib",
            "-static",
            "-march=rv64gc",
            "-mabi=lp64d",
            "-Wl,-Ttext=0x80000000,--build-id=none,-N",
            "-o",
        ])
        .arg(&elf)
        .arg(&src)
        .status()
        .expect("riscv64-linux-gnu-gcc (scripts/install-deps.sh installs it)");
    assert!(cc.success());
    elf.to_string_lossy().into_owned()
}

struct Vm {
    child: Child,
    sock: PathBuf,
}

impl Vm {
    fn start(s: &Scratch) -> Vm {
        let kernel = echo_program(s);
        let sock = s.path("vm.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_ftvm"))
            .args(["run", "--bios", "none", "--kernel", &kernel, "--control"])
            .arg(&sock)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        while UnixStream::connect(&sock).is_err() {
            assert!(t0.elapsed() < WAIT, "the VM's control socket never came");
            std::thread::sleep(Duration::from_millis(20));
        }
        Vm { child, sock }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running `ftvm console`: its stdin, and its stdout (the console) and
/// stderr (its own lines) as they come, apart.
struct Client {
    child: Child,
    out: mpsc::Receiver<(usize, u8)>,
    seen: [Vec<u8>; 2],
}

impl Client {
    fn attach(sock: &Path, extra: &[&str]) -> Client {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ftvm"))
            .arg("console")
            .args(extra)
            .arg(sock)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, out) = mpsc::channel();
        let pipes =
            [Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>, Box::new(child.stderr.take().unwrap())];
        for (n, pipe) in pipes.into_iter().enumerate() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for b in pipe.bytes().map_while(Result::ok) {
                    if tx.send((n, b)).is_err() {
                        return;
                    }
                }
            });
        }
        Client { child, out, seen: [Vec::new(), Vec::new()] }
    }

    /// What it showed: the console's bytes, then its own lines.
    fn text(&self) -> String {
        format!("{}\n{}", String::from_utf8_lossy(&self.seen[0]), String::from_utf8_lossy(&self.seen[1]))
    }

    /// Waits until what the client printed holds `want`.
    fn expect(&mut self, want: &str) {
        let t0 = Instant::now();
        while !self.text().contains(want) {
            let left = WAIT.saturating_sub(t0.elapsed());
            match self.out.recv_timeout(left.max(Duration::from_millis(1))) {
                Ok((n, b)) => self.seen[n].push(b),
                Err(_) => panic!("the console never showed {want:?}; it showed {:?}", self.text()),
            }
        }
    }

    fn type_keys(&mut self, keys: &[u8]) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(keys).unwrap();
        stdin.flush().unwrap();
    }

    /// Waits for the client's end: its exit status and all it printed.
    fn end(mut self) -> (i32, String) {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                while let Ok((n, b)) = self.out.recv_timeout(Duration::from_millis(200)) {
                    self.seen[n].push(b);
                }
                return (st.code().unwrap_or(-1), self.text());
            }
            assert!(t0.elapsed() < WAIT, "the console client did not end; it showed {:?}", self.text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn clients_watch_one_types_and_ctrl_bracket_detaches() {
    let s = Scratch::new("console", "attach");
    let vm = Vm::start(&s);

    let mut typist = Client::attach(&vm.sock, &[]);
    typist.expect("attached to the console");
    // the prompt the guest printed before anyone attached
    typist.expect("echo> ");
    typist.type_keys(b"hello ftvm");
    typist.expect("HELLO FTVM");

    let (code, said) = Client::attach(&vm.sock, &[]).end();
    assert_eq!(code, 1, "a second typist: {said:?}");
    assert!(said.contains("another client types on this console"), "{said:?}");
    assert_eq!(said.trim().lines().count(), 1, "refused in one line, on stderr: {said:?}");

    let mut watcher = Client::attach(&vm.sock, &["--read-only"]);
    watcher.expect("watching the console");
    watcher.expect("echo> HELLO FTVM");
    // what a watcher sends reaches nobody
    watcher.type_keys(b"zzz");
    typist.type_keys(b"!");
    typist.expect("HELLO FTVM!");
    watcher.expect("HELLO FTVM!");
    assert!(!typist.text().contains("ZZZ"), "a watcher typed: {:?}", typist.text());

    // Ctrl-] detaches; the VM runs on, and the typist's place is free
    typist.type_keys(&[0x1d]);
    let (code, said) = typist.end();
    assert_eq!(code, 0, "{said:?}");
    assert!(said.contains("detached from the console"), "{said:?}");
    let mut next = Client::attach(&vm.sock, &[]);
    next.expect("attached to the console");
    next.type_keys(b"again");
    next.expect("AGAIN");
    watcher.expect("AGAIN");

    // the VM ends: every client ends, saying so
    let quit = Command::new(env!("CARGO_BIN_EXE_ftvm")).arg("control").arg(&vm.sock).arg("quit").output().unwrap();
    assert!(quit.status.success());
    for client in [next, watcher] {
        let (code, said) = client.end();
        assert_eq!(code, 0, "{said:?}");
        assert!(said.contains("the VM's console closed"), "{said:?}");
    }
}
