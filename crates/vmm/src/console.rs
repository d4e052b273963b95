//! The host terminal: raw mode while a VM owns it, restored on every exit
//! path, and the QEMU-style escape (Ctrl-A x quits, Ctrl-A Ctrl-A sends a
//! literal Ctrl-A).

use std::io::Read;
use std::sync::mpsc;

pub struct RawTerminal {
    saved: Option<libc::termios>,
}

impl RawTerminal {
    /// Put stdin in raw mode if it is a terminal; otherwise do nothing.
    pub fn enter() -> RawTerminal {
        // SAFETY: termios calls on fd 0 with a valid, initialised struct.
        unsafe {
            if libc::isatty(0) != 1 {
                return RawTerminal { saved: None };
            }
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut t) != 0 {
                return RawTerminal { saved: None };
            }
            let saved = t;
            libc::cfmakeraw(&mut t);
            // Keep output post-processing so host-side messages stay readable.
            t.c_oflag |= libc::OPOST;
            libc::tcsetattr(0, libc::TCSANOW, &t);
            RawTerminal { saved: Some(saved) }
        }
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        if let Some(t) = self.saved {
            // SAFETY: restoring the attributes read in `enter`.
            unsafe {
                libc::tcsetattr(0, libc::TCSANOW, &t);
            }
        }
    }
}

pub enum Input {
    Bytes(Vec<u8>),
    Quit,
    Eof,
}

/// Read stdin on a thread, turning the escape sequence into `Quit` if
/// `escape` (an interactive console; `--exec`'s stdin is data, passed on
/// as it is). Each piece of input goes to `tx`, wrapped by `wrap`.
pub fn spawn_reader<T: Send + 'static>(tx: mpsc::Sender<T>, wrap: fn(Input) -> T, escape: bool) {
    let tx = Sender { tx, wrap };
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buf = [0u8; 4096];
        let with_escape = escape;
        let mut escape = false;
        loop {
            let n = match stdin.read(&mut buf) {
                Ok(0) | Err(_) => {
                    let _ = tx.send(Input::Eof);
                    return;
                }
                Ok(n) => n,
            };
            if !with_escape {
                if tx.send(Input::Bytes(buf[..n].to_vec())).is_err() {
                    return;
                }
                continue;
            }
            let mut out = Vec::with_capacity(n);
            for &b in &buf[..n] {
                if escape {
                    escape = false;
                    match b {
                        b'x' | b'X' => {
                            let _ = tx.send(Input::Bytes(std::mem::take(&mut out)));
                            let _ = tx.send(Input::Quit);
                            return;
                        }
                        0x01 => out.push(0x01),
                        _ => {}
                    }
                } else if b == 0x01 {
                    escape = true;
                } else {
                    out.push(b);
                }
            }
            if !out.is_empty() && tx.send(Input::Bytes(out)).is_err() {
                return;
            }
        }
    });
}

struct Sender<T> {
    tx: mpsc::Sender<T>,
    wrap: fn(Input) -> T,
}

impl<T> Sender<T> {
    fn send(&self, i: Input) -> Result<(), mpsc::SendError<T>> {
        self.tx.send((self.wrap)(i))
    }
}
