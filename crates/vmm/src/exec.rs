//! The host side of `ftvm run --exec`: the exec session. It owns the
//! protocol with the guest's init (guest/ftvm-init, `exec_console`; the
//! protocol is in guest/README.md): what is sent to the guest (a nonce,
//! the command, the host's stdin and its end) and how the console's bytes
//! are split into the command's stdout, its stderr and the protocol's own
//! frames.
//!
//! Why the console, after boot, and not the kernel command line or a new
//! device: the command line holds 1 KiB, and is readable by the command
//! (`/proc/cmdline`); a new virtio device (virtio-console's multiport
//! would give separate streams) needs a device model, its driver in the
//! initramfs and its own input events for replay. The console is already
//! a machine input (`Event::ConsoleInput`, logged and replayed, the same
//! on a backup) and output, so the session needs nothing new below it:
//! everything it sends goes through the live loop's `inject`.
//!
//! On the console, the command's stdout goes as it is (the guest's tty is
//! raw, so `\n` stays `\n`); everything else the guest says after the
//! handshake is a frame, a line `\x01NONCE TYPE [PAYLOAD]`: `a`
//! acknowledges a chunk sent, `b` the command begins, `e LINE` / `E LINE`
//! a line of its stderr (with / without its newline), `s N` its exit
//! status. The nonce is chosen here for each run and sent after boot (it
//! is in no file or environment of the guest's): output of the command
//! that looks like a frame is shown as output. What the host sends is in
//! chunks, `LEN\n` and LEN bytes, each sent once the one before was
//! acknowledged, so the guest's console buffers never overflow whatever
//! the command reads at: first the command, then a chunk of length 0,
//! then stdin, and a chunk of length 0 at its end.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};

/// The guest's line saying its console is ready for the nonce.
pub const READY_LINE: &[u8] = b"ftvm-exec-ready";
/// Lines the guest's init prints when it cannot start the command (no
/// root disk, ...): before the handshake, so no command printed them.
const SETUP_ERRORS: [&[u8]; 2] = [b"ftvm-initrd: error: ", b"ftvm-init: error: "];
/// The largest chunk sent: under the guest tty's 4 KiB line buffer.
const CHUNK: usize = 2048;
/// A frame longer than this (a stderr line of megabytes) is cut: the rest
/// of the line comes as a further frame's worth of stdout. Bounds memory.
const MAX_FRAME: usize = 1 << 20;

/// Whether a console line is the guest's ready line: the line itself, or
/// the line after terminal control sequences. systemd resets the console
/// as it boots (ESC [!p, ESC ]104 BEL, ESC [?7h) with no newline after,
/// so the guest's first line may begin with them. Nothing else can: no
/// command has started yet.
fn is_ready_line(line: &[u8]) -> bool {
    line.strip_suffix(READY_LINE).is_some_and(|before| before.is_empty() || before[0] == 0x1b)
}

/// Adds exec mode (and `quiet`, unless the boot is shown) to the kernel
/// command line; the command itself goes over the console.
pub fn add_to_cmdline(cmdline: &mut String, verbose: bool) {
    if !cmdline.is_empty() {
        cmdline.push(' ');
    }
    if !verbose {
        cmdline.push_str("quiet ");
    }
    cmdline.push_str("ftvm.exec-console");
}

/// What the console showed, split.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Shown {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The command began in what was fed.
    pub began: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Booting: waiting for the ready line.
    Boot,
    /// Nonce and command sent; the command has not begun.
    Handshake,
    Running,
    /// Its status came.
    Done,
}

pub struct ExecSession {
    show_boot: bool,
    command: Vec<u8>,
    /// `\x01NONCE `: how every frame begins.
    marker: Vec<u8>,
    phase: Phase,
    /// The current boot line (before the handshake).
    line: Vec<u8>,
    /// Bytes that may be a frame's start, or a frame being received.
    pending: Vec<u8>,
    /// The command's chunks not yet sent.
    outbox: VecDeque<Vec<u8>>,
    awaiting_ack: bool,
    stdin: VecDeque<u8>,
    stdin_ended: bool,
    /// The chunk of length 0 ending stdin went.
    stdin_closed: bool,
    /// Bytes for the guest's console, in order.
    to_guest: Vec<u8>,
    setup_error: Option<String>,
    status: Option<u8>,
}

impl ExecSession {
    pub fn new(command: &str, show_boot: bool) -> ExecSession {
        let mut s = ExecSession {
            show_boot,
            command: command.as_bytes().to_vec(),
            marker: Vec::new(),
            phase: Phase::Boot,
            line: Vec::new(),
            pending: Vec::new(),
            outbox: VecDeque::new(),
            awaiting_ack: false,
            stdin: VecDeque::new(),
            stdin_ended: false,
            stdin_closed: false,
            to_guest: Vec::new(),
            setup_error: None,
            status: None,
        };
        s.restart();
        s
    }

    /// The guest rebooted: a new handshake, a new nonce, the command again;
    /// stdin goes on from where it was (its end again, if it had ended).
    pub fn restart(&mut self) {
        self.marker = format!("\x01{} ", nonce()).into_bytes();
        self.phase = Phase::Boot;
        self.line.clear();
        self.pending.clear();
        self.awaiting_ack = false;
        self.stdin_closed = false;
        self.to_guest.clear();
        self.status = None;
    }

    /// Whether the command finished (its status came): a guest that
    /// powered off before then was stopped with its command.
    pub fn command_finished(&self) -> bool {
        self.status.is_some()
    }

    /// What the guest's init said when it could not start the command.
    pub fn setup_error(&self) -> Option<&str> {
        (self.phase == Phase::Boot).then_some(self.setup_error.as_deref()).flatten()
    }

    /// More of the host's stdin.
    pub fn input(&mut self, bytes: &[u8]) {
        self.stdin.extend(bytes);
        self.pump();
    }

    /// The host's stdin ended (or there is none to pass on).
    pub fn input_end(&mut self) {
        self.stdin_ended = true;
        self.pump();
    }

    /// Bytes to type on the guest's console now.
    pub fn take_to_guest(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.to_guest)
    }

    /// Console bytes from the guest: what to show where.
    pub fn feed(&mut self, bytes: &[u8]) -> Shown {
        let mut shown = Shown::default();
        for &b in bytes {
            if self.phase == Phase::Boot {
                self.boot_byte(b, &mut shown);
            } else {
                self.byte(b, &mut shown);
            }
        }
        // A possible frame start waits for more bytes; stdout before it
        // has gone already, so prompts and progress show at once.
        shown
    }

    fn boot_byte(&mut self, b: u8, shown: &mut Shown) {
        if self.show_boot {
            shown.stdout.push(b);
        }
        if b != b'\n' {
            if self.line.len() < MAX_FRAME {
                self.line.push(b);
            }
            return;
        }
        let line = std::mem::take(&mut self.line);
        let line = line.strip_suffix(b"\r").unwrap_or(&line);
        if is_ready_line(line) {
            tracing::debug!(
                command_bytes = self.command.len(),
                "exec: the guest is ready; sending the nonce and the command"
            );
            self.phase = Phase::Handshake;
            self.to_guest.extend_from_slice(&self.marker[1..self.marker.len() - 1]);
            self.to_guest.push(b'\n');
            self.outbox = self.command.chunks(CHUNK).map(chunk).collect();
            self.outbox.push_back(chunk(&[]));
            self.pump();
        } else if let Some(why) = SETUP_ERRORS.iter().find_map(|p| line.strip_prefix(*p)) {
            self.setup_error.get_or_insert_with(|| String::from_utf8_lossy(why).into_owned());
        }
    }

    fn byte(&mut self, b: u8, shown: &mut Shown) {
        let m = self.marker.len();
        if self.pending.len() >= m {
            // Inside a frame, up to its newline.
            if b == b'\n' || self.pending.len() >= MAX_FRAME {
                let frame = std::mem::take(&mut self.pending);
                self.frame(&frame[m..], shown);
                if b == b'\n' {
                    return;
                }
            } else {
                self.pending.push(b);
                return;
            }
        }
        if !self.pending.is_empty() {
            if self.marker[self.pending.len()] == b {
                self.pending.push(b);
                return;
            }
            // Not a frame after all: output, and this byte looked at afresh.
            let not = std::mem::take(&mut self.pending);
            self.output(&not, shown);
        }
        if b == self.marker[0] {
            self.pending.push(b);
        } else {
            self.output(&[b], shown);
        }
    }

    /// The guest's own bytes: the command's stdout while it runs; boot
    /// noise before, power-off messages after (shown with --verbose).
    fn output(&self, bytes: &[u8], shown: &mut Shown) {
        if self.phase == Phase::Running || self.show_boot {
            shown.stdout.extend_from_slice(bytes);
        }
    }

    fn frame(&mut self, frame: &[u8], shown: &mut Shown) {
        // A command that set its tty back to cooked mode adds `\r`.
        let frame = frame.strip_suffix(b"\r").unwrap_or(frame);
        let (kind, payload) = match frame.split_first() {
            Some((&k, rest)) => (k, rest.strip_prefix(b" ").unwrap_or(rest)),
            None => return,
        };
        match kind {
            b'a' => {
                self.awaiting_ack = false;
                self.pump();
            }
            b'b' if self.phase == Phase::Handshake => {
                self.phase = Phase::Running;
                shown.began = true;
                tracing::debug!("exec: the command began");
            }
            b'e' | b'E' if self.phase == Phase::Running => {
                shown.stderr.extend_from_slice(payload);
                if kind == b'e' {
                    shown.stderr.push(b'\n');
                }
            }
            b's' => {
                self.status = std::str::from_utf8(payload).ok().and_then(|s| s.trim().parse().ok()).or(Some(255));
                self.phase = Phase::Done;
                tracing::debug!(status = ?self.status, "exec: the command finished");
            }
            // Unknown: a newer guest's; nothing to show.
            _ => {}
        }
    }

    /// Sends the next chunk if the last was acknowledged.
    fn pump(&mut self) {
        if self.phase == Phase::Boot || self.awaiting_ack {
            return;
        }
        let next = if let Some(c) = self.outbox.pop_front() {
            c
        } else if self.stdin_closed {
            return;
        } else if !self.stdin.is_empty() {
            let n = self.stdin.len().min(CHUNK);
            let bytes: Vec<u8> = self.stdin.drain(..n).collect();
            chunk(&bytes)
        } else if self.stdin_ended {
            self.stdin_closed = true;
            chunk(&[])
        } else {
            return;
        };
        self.awaiting_ack = true;
        self.to_guest.extend_from_slice(&next);
    }
}

/// `LEN\n` then the bytes.
fn chunk(bytes: &[u8]) -> Vec<u8> {
    let mut c = format!("{}\n", bytes.len()).into_bytes();
    c.extend_from_slice(bytes);
    c
}

/// 64 random bits in hex. From getrandom(2); std's `RandomState`, seeded
/// from the OS's randomness too, should that fail (a nonce only has to be
/// unknown to the guest).
fn nonce() -> String {
    let mut b = [0u8; 8];
    let n = match ftvm_host::entropy::fill(&mut b) {
        Ok(()) => u64::from_le_bytes(b),
        Err(_) => std::collections::hash_map::RandomState::new().build_hasher().finish(),
    };
    format!("{n:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ready line as systemd's console leaves it (seen on a Debian
    /// guest under systemd 257, booted quiet): after its terminal reset.
    #[test]
    fn the_ready_line_after_a_terminal_reset() {
        let mut s = ExecSession::new("true", false);
        s.feed(b"Boot HART MEDELEG : 0xb109\r\n\x1b[!p\x1b]104\x07\x1b[?7hftvm-exec-ready\n");
        assert!(s.take_to_guest().starts_with(&s.marker[1..17]), "the nonce is sent");
        let mut s = ExecSession::new("true", false);
        s.feed(b"not ftvm-exec-ready\n");
        assert!(s.take_to_guest().is_empty(), "text before it is not a reset");
    }

    /// A session past its handshake, and its frame marker.
    fn running(cmd: &str) -> (ExecSession, Vec<u8>) {
        let mut s = ExecSession::new(cmd, false);
        let shown = s.feed(b"[ 0.1] boot\r\nftvm-exec-ready\r\n");
        assert_eq!(shown, Shown::default());
        let sent = s.take_to_guest();
        let nonce = &s.marker[1..17];
        assert_eq!(sent, [nonce, b"\n", format!("{}\n{cmd}", cmd.len()).as_bytes()].concat());
        let m = s.marker.clone();
        let ack = [&m[..], b"a\n"].concat();
        assert!(s.feed(&ack).stdout.is_empty());
        assert_eq!(s.take_to_guest(), b"0\n");
        s.feed(&ack);
        assert!(s.feed(&[&m[..], b"b\n"].concat()).began);
        (s, m)
    }

    #[test]
    fn splits_stdout_stderr_and_frames_and_keeps_lookalikes_as_output() {
        let (mut s, m) = running("x");
        let mut out = s.feed(b"out\nftvm-exec-status=5\n\x01 not\n\x01");
        let more = s.feed(&[&m[1..3], b"x"].concat());
        out.stdout.extend(more.stdout);
        out.stdout.extend(s.feed(b"\n").stdout);
        let e = s.feed(&[b"par", &m[..], b"e err line\n", b"tial", &m[..], b"E last"].concat());
        assert_eq!(e.stderr, b"err line\n");
        let e2 = s.feed(b"\n");
        assert_eq!(e2.stderr, b"last");
        assert_eq!(e.stdout, b"partial");
        let st = s.feed(&[&m[..], b"s 3\nftvm-exec-status=3\n"].concat());
        assert!(st.stdout.is_empty() && s.command_finished() && s.status == Some(3));
        let want = [b"out\nftvm-exec-status=5\n\x01 not\n", &m[..3], b"x\n"].concat();
        assert_eq!(out.stdout, want);
    }

    #[test]
    fn stdin_goes_in_acknowledged_chunks_then_its_end() {
        let (mut s, m) = running("cat");
        let ack = [&m[..], b"a\n"].concat();
        s.input(&vec![b'y'; CHUNK + 10]);
        s.input_end();
        let first = s.take_to_guest();
        assert_eq!(first.len(), 5 + CHUNK);
        assert!(s.take_to_guest().is_empty(), "waits for the acknowledgement");
        s.feed(&ack);
        assert_eq!(s.take_to_guest(), [b"10\n", &[b'y'; 10][..]].concat());
        s.feed(&ack);
        assert_eq!(s.take_to_guest(), b"0\n");
        s.feed(&ack);
        assert!(s.take_to_guest().is_empty());
    }

    #[test]
    fn a_setup_error_before_the_handshake_is_kept() {
        let mut s = ExecSession::new("true", false);
        s.feed(b"ftvm-initrd: error: cannot mount the root disk /dev/vda as ext4: Invalid argument\r\nftvm-exec-status=255\r\n");
        assert_eq!(s.setup_error(), Some("cannot mount the root disk /dev/vda as ext4: Invalid argument"));
    }

    #[test]
    fn cmdline_says_exec_mode_only() {
        let mut c = String::from("console=ttyS0");
        add_to_cmdline(&mut c, false);
        assert_eq!(c, "console=ttyS0 quiet ftvm.exec-console");
    }
}
