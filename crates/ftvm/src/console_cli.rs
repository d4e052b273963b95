//! `ftvm console SOCK`: this terminal on a running VM's serial console,
//! through its control socket (`vmm::control::attach_console`); and the
//! same terminal for `ftvm cluster vm console NAME`, whose console comes
//! through an agent's API (`ftvm_cluster::console`). The terminal is raw
//! while attached (restored on every way out); Ctrl-] detaches, as
//! telnet's and virsh's consoles do (the VM runs on); the VM's end of the
//! console closing (it stopped, or handed over) ends the session too.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::Path;

use ftvm_vmm::console::RawTerminal;

/// The detach key: Ctrl-] (0x1d).
const DETACH: u8 = 0x1d;

/// Attaches, copies bytes both ways until detached or the VM goes, and
/// returns the exit status (0 either way: detaching is not a failure).
pub fn console(socket: &Path, read_only: bool) -> Result<u32, Box<dyn std::error::Error>> {
    let (conn, typing) = ftvm_vmm::control::attach_console(socket, read_only)?;
    session(conn, typing, &format!("the console of {}", socket.display()))
}

/// This terminal on an attached console `conn` (`what`: the console, in
/// words) until detached or the VM goes: its bytes both ways; shutting
/// down `conn`'s writing side detaches, and the other end closing it
/// (once it has let go of this client) ends the session.
pub fn session(conn: UnixStream, typing: bool, what: &str) -> Result<u32, Box<dyn std::error::Error>> {
    let how = if typing { "attached to" } else { "watching" };
    eprintln!("ftvm: {how} {what} (Ctrl-] detaches)\r");
    let terminal = RawTerminal::enter();
    let mut from_vm = conn.try_clone()?;
    let shown = std::thread::spawn(move || {
        let mut out = std::io::stdout();
        let mut buf = [0u8; 4096];
        loop {
            match from_vm.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if out.write_all(&buf[..n]).and_then(|()| out.flush()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    // What is typed, on a thread of its own: it may block in a read of
    // the terminal after the VM went.
    let mut to_vm = conn.try_clone()?;
    let (detached_tx, detached_rx) = std::sync::mpsc::channel::<bool>();
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buf = [0u8; 1024];
        loop {
            let n = match stdin.read(&mut buf) {
                Ok(0) | Err(_) => {
                    let _ = detached_tx.send(false);
                    return;
                }
                Ok(n) => n,
            };
            let keys = &buf[..n];
            let (typed, detach) = match keys.iter().position(|&b| b == DETACH) {
                Some(at) => (&keys[..at], true),
                None => (keys, false),
            };
            if (!typed.is_empty() && to_vm.write_all(typed).is_err()) || detach {
                let _ = detached_tx.send(detach);
                return;
            }
        }
    });
    // Ends when the VM's side closes (shown ends) or the user detaches
    // (or the terminal's input ends: a watcher reading from a pipe watches
    // on until the VM goes).
    let watcher_only = !typing;
    loop {
        if shown.is_finished() {
            drop(terminal);
            eprintln!("\r\nftvm: the VM's console closed");
            return Ok(0);
        }
        match detached_rx.recv_timeout(std::time::Duration::from_millis(100)) {
            Ok(true) => break,
            Ok(false) if !watcher_only => break,
            _ => {}
        }
    }
    // Our end of the keys closes; the VM's side frees our place and then
    // closes its end, which ends `shown`: detaching is done once the VM
    // has let us go, so attaching again at once is not refused.
    let _ = conn.shutdown(Shutdown::Write);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !shown.is_finished() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let _ = conn.shutdown(Shutdown::Both);
    drop(terminal);
    eprintln!("\r\nftvm: detached from the console");
    Ok(0)
}
