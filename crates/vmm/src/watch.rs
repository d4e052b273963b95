//! Host policy on what the guest prints: the live loop reads the console
//! anyway (to show it), so it also watches it for the two lines it must
//! act on. The machine and its devices know nothing of this. (`--exec`'s
//! protocol, which the console also carries, is exec.rs's.)
//!
//! - A kernel panic: Linux prints `Kernel panic - not syncing: REASON` at
//!   the start of a console line (after the printk timestamp, if any), a
//!   stack trace, then `---[ end Kernel panic - not syncing: REASON ]---`,
//!   and spins for ever (or reboots, with `panic=N`). A command that
//!   printed the same text at the start of a line would be taken for a
//!   panic too; nothing else in the guest's output is.

const PANIC: &[u8] = b"Kernel panic - not syncing";
const PANIC_END: &[u8] = b"---[ end Kernel panic";
/// Longest line kept whole; the kernel's are under 1 KiB. Beyond it the
/// start of the line is dropped (a guest printing with no newline must
/// not grow the host's memory).
const MAX_LINE: usize = 4096;

/// What the console showed that matters to the host.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The first panic line, without its timestamp.
    pub panic: Option<String>,
    /// The kernel finished reporting its panic.
    pub panic_ended: bool,
}

/// Scans console output a line at a time.
#[derive(Default)]
pub struct ConsoleWatch {
    line: Vec<u8>,
}

impl ConsoleWatch {
    pub fn new() -> ConsoleWatch {
        ConsoleWatch::default()
    }

    /// Looks at more console bytes; what was seen in the lines they end.
    pub fn feed(&mut self, bytes: &[u8]) -> Seen {
        let mut seen = Seen::default();
        for &b in bytes {
            if b == b'\n' {
                let line = std::mem::take(&mut self.line);
                look_at(trim(&line), &mut seen);
            } else {
                if self.line.len() >= MAX_LINE {
                    self.line.drain(..MAX_LINE / 2);
                }
                self.line.push(b);
            }
        }
        seen
    }
}

fn look_at(line: &[u8], seen: &mut Seen) {
    let text = without_timestamp(line);
    if text.starts_with(PANIC) && seen.panic.is_none() {
        seen.panic = Some(String::from_utf8_lossy(text).into_owned());
    }
    if text.starts_with(PANIC_END) {
        seen.panic_ended = true;
    }
}

/// The line without a leading printk timestamp (`[   12.345678] `).
fn without_timestamp(line: &[u8]) -> &[u8] {
    if let Some(rest) = line.strip_prefix(b"[") {
        if let Some(end) = rest.iter().position(|&b| b == b']') {
            let stamp = &rest[..end];
            if !stamp.is_empty() && stamp.iter().all(|b| b.is_ascii_digit() || matches!(b, b' ' | b'.')) {
                return rest[end + 1..].strip_prefix(b" ").unwrap_or(&rest[end + 1..]);
            }
        }
    }
    line
}

fn trim(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sees_a_panic_across_chunks_without_its_timestamp() {
        let mut w = ConsoleWatch::new();
        assert_eq!(w.feed(b"[   31.501][  T1] sysrq: Trigger a crash\r\n[   31.502] Kernel pan"), Seen::default());
        let seen = w.feed(b"ic - not syncing: sysrq triggered crash\r\n[   31.503] CPU: 0 PID: 1\r\n");
        assert_eq!(seen.panic.as_deref(), Some("Kernel panic - not syncing: sysrq triggered crash"));
        assert!(!seen.panic_ended);
        let seen = w.feed(b"[   31.600] ---[ end Kernel panic - not syncing: sysrq triggered crash ]---\r\n");
        assert!(seen.panic_ended && seen.panic.is_none());
    }

    #[test]
    fn ignores_panic_text_inside_a_line() {
        let mut w = ConsoleWatch::new();
        let seen = w.feed(b"boot\r\nftvm-exec-begin\r\necho Kernel panic - not syncing: no\r\n");
        assert_eq!(seen, Seen { panic: None, panic_ended: false });
        assert!(w.feed(b"Kernel panic - not syncing: VFS: Unable to mount root fs\n").panic.is_some());
    }

    #[test]
    fn a_line_with_no_end_stays_bounded() {
        let mut w = ConsoleWatch::new();
        for _ in 0..100 {
            w.feed(&[b'x'; 1000]);
        }
        assert!(w.line.len() <= MAX_LINE);
    }
}
