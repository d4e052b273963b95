//! The host side of `ftvm run --exec`: how the command reaches the guest
//! (kernel command line) and how its output is picked out of the console.
//!
//! Guest side (guest/init in the image): it decodes `ftvm.exec=` (standard
//! base64), prints a line `ftvm-exec-begin`, runs the command with
//! `/bin/sh -c`, prints `ftvm-exec-status=N`, and powers off through the
//! SiFive test device with N as the exit status.

use base64::Engine;

pub const BEGIN_MARKER: &[u8] = b"ftvm-exec-begin";
pub const STATUS_PREFIX: &[u8] = b"ftvm-exec-status=";

pub fn add_to_cmdline(cmdline: &mut String, cmd: &str, verbose: bool) {
    let encoded = base64::engine::general_purpose::STANDARD.encode(cmd.as_bytes());
    if !cmdline.is_empty() {
        cmdline.push(' ');
    }
    if !verbose {
        cmdline.push_str("quiet ");
    }
    cmdline.push_str("ftvm.exec=");
    cmdline.push_str(&encoded);
}

/// Filters console output: hides everything up to and including the begin
/// marker line, and the status line; with `show_boot`, hides nothing.
pub struct OutputFilter {
    show_boot: bool,
    started: bool,
    /// The command's status line went by: it finished.
    finished: bool,
    /// Bytes of the current, not yet complete line.
    line: Vec<u8>,
}

impl OutputFilter {
    pub fn new(show_boot: bool) -> OutputFilter {
        OutputFilter { show_boot, started: false, finished: false, line: Vec::new() }
    }

    /// Whether the command finished (its status line went by): a guest
    /// that powered off before then was stopped with its command.
    pub fn command_finished(&self) -> bool {
        self.finished
    }

    /// Feed console bytes; returns what should be shown now. Output is
    /// passed through a line at a time so markers can be recognised.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for &b in bytes {
            self.line.push(b);
            if b == b'\n' {
                self.finish_line(&mut out);
            }
        }
        // Showing boot messages means showing the console as it is (the
        // lines are still read, for the markers).
        if self.show_boot {
            return bytes.to_vec();
        }
        // Show partial lines once the command runs (prompts, progress),
        // unless they could still turn into the status marker.
        if self.started
            && !self.line.is_empty()
            && !STATUS_PREFIX.starts_with(trim(&self.line))
            && !trim(&self.line).starts_with(STATUS_PREFIX)
        {
            out.append(&mut self.line);
        }
        out
    }

    fn finish_line(&mut self, out: &mut Vec<u8>) {
        let line = std::mem::take(&mut self.line);
        let t = trim(&line);
        if !self.started {
            if t == BEGIN_MARKER {
                self.started = true;
            }
        } else if t.starts_with(STATUS_PREFIX) {
            self.finished = true;
        } else {
            out.extend_from_slice(&line);
        }
    }
}

fn trim(line: &[u8]) -> &[u8] {
    let mut l = line;
    while let Some((&last, rest)) = l.split_last() {
        if last == b'\n' || last == b'\r' {
            l = rest;
        } else {
            break;
        }
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hides_boot_and_status_lines() {
        let mut f = OutputFilter::new(false);
        let mut shown = f.feed(b"[    0.1] booting\r\nftvm-exec-");
        shown.extend(f.feed(b"begin\r\nriscv64\r\nhel"));
        shown.extend(f.feed(b"lo\r\nftvm-exec-status=0\r\n"));
        assert_eq!(String::from_utf8(shown).unwrap(), "riscv64\r\nhello\r\n");
    }

    #[test]
    fn verbose_shows_the_console_as_it_is() {
        let mut f = OutputFilter::new(true);
        let raw = b"boot\r\nftvm-exec-begin\r\nx\r\nftvm-exec-status=0\r\n";
        assert_eq!(f.feed(raw), raw.to_vec());
    }

    #[test]
    fn cmdline_carries_the_command_in_base64() {
        let mut c = String::from("console=ttyS0");
        add_to_cmdline(&mut c, "echo 'a b'", false);
        assert_eq!(c, "console=ttyS0 quiet ftvm.exec=ZWNobyAnYSBiJw==");
    }
}
