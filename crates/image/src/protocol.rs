//! The host/guest protocol of the default guest image (see also
//! `guest/README.md`).
//!
//! * `ftvm.exec=<base64>`: run `/bin/sh -c "$CMD"` as root in `/` with
//!   `HOME=/root`, a standard `PATH` and stdin from `/dev/null`, stdout and
//!   stderr on the console. The command is base64 with the **standard**
//!   alphabet and `=` padding ([`crate::base64::encode`]); the guest also
//!   accepts the URL-safe alphabet and missing padding.
//! * Before the command the guest prints one line [`EXEC_BEGIN_MARKER`];
//!   afterwards one line `ftvm-exec-status=N` ([`EXEC_STATUS_PREFIX`]), then it
//!   syncs, remounts the root read-only and powers off by a 32-bit write to the
//!   SiFive test device at [`SIFIVE_TEST_BASE`]: `0x5555` for status 0,
//!   `0x3333 | status << 16` otherwise (QEMU `virt` exits with that status).
//! * `ftvm.ip=ADDR/PREFIX[,GW]`: static address for `eth0` (virtio-net).
//! * `ftvm.dns=ADDR`: nameserver for `/etc/resolv.conf`.
//! * `ftvm.root=DEV` (default `/dev/vda`), `ftvm.rootro`, `ftvm.init=PATH`,
//!   `ftvm.debug`: initramfs knobs.
//! * Status 255 with no begin marker means the guest failed before the command
//!   (root disk missing, bad base64, ...).

use crate::ImageError;

/// Line printed by the guest right before the exec command starts.
pub const EXEC_BEGIN_MARKER: &str = "ftvm-exec-begin";
/// Prefix of the line printed after the command: `ftvm-exec-status=N`.
pub const EXEC_STATUS_PREFIX: &str = "ftvm-exec-status=";
/// Physical address of the SiFive test (finisher) device used for power-off.
pub const SIFIVE_TEST_BASE: u64 = 0x10_0000;
/// Value written for a successful power-off.
pub const FINISHER_PASS: u32 = 0x5555;
/// Low half of the value written for a failing power-off (`| status << 16`).
pub const FINISHER_FAIL: u32 = 0x3333;
/// RISC-V Linux `COMMAND_LINE_SIZE` (including the terminating NUL).
pub const KERNEL_CMDLINE_MAX: usize = 1024;
/// Parameters always passed to the default guest.
pub const BASE_CMDLINE: &str = "console=ttyS0";

/// The value the guest writes to the test device for `status`.
pub fn finisher_value(status: u8) -> u32 {
    if status == 0 {
        FINISHER_PASS
    } else {
        FINISHER_FAIL | (u32::from(status) << 16)
    }
}

/// `ftvm.exec=<base64 of cmd>` (standard alphabet, padded).
pub fn exec_param(cmd: &str) -> String {
    format!("ftvm.exec={}", crate::base64::encode(cmd.as_bytes()))
}

/// Kernel command line for the default guest: [`BASE_CMDLINE`], then `quiet`
/// and `ftvm.exec=` when `exec` is given, `ftvm.ip=` when `ip` is given
/// (`ADDR/PREFIX[,GW]`), then `extra` verbatim. Fails when the result does
/// not fit the kernel's 1024-byte command line.
pub fn kernel_cmdline(exec: Option<&str>, ip: Option<&str>, extra: &str) -> Result<String, ImageError> {
    let mut parts = vec![BASE_CMDLINE.to_string()];
    if let Some(cmd) = exec {
        parts.push("quiet".into());
        parts.push(exec_param(cmd));
    }
    if let Some(ip) = ip {
        if ip.is_empty() || ip.contains(char::is_whitespace) {
            return Err(ImageError::new("kernel command line", format!("invalid ftvm.ip value {ip:?}")));
        }
        parts.push(format!("ftvm.ip={ip}"));
    }
    let extra = extra.trim();
    if !extra.is_empty() {
        parts.push(extra.to_string());
    }
    let line = parts.join(" ");
    if line.len() + 1 > KERNEL_CMDLINE_MAX {
        return Err(ImageError::new(
            "kernel command line",
            format!(
                "{} bytes is over the kernel's limit of {} (the exec command is base64-encoded: keep it under ~700 bytes, or put a script on the disk)",
                line.len(),
                KERNEL_CMDLINE_MAX - 1
            ),
        ));
    }
    Ok(line)
}

/// Parse a `ftvm-exec-status=N` console line (trailing `\r` tolerated).
pub fn parse_status_line(line: &str) -> Option<u8> {
    line.trim_end_matches(['\r', '\n']).strip_prefix(EXEC_STATUS_PREFIX)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdline_with_exec() {
        let line = kernel_cmdline(Some("exit 3"), None, "").unwrap();
        assert_eq!(line, "console=ttyS0 quiet ftvm.exec=ZXhpdCAz");
        let line = kernel_cmdline(Some("true"), Some("10.0.2.15/24,10.0.2.2"), "ftvm.debug").unwrap();
        assert_eq!(line, "console=ttyS0 quiet ftvm.exec=dHJ1ZQ== ftvm.ip=10.0.2.15/24,10.0.2.2 ftvm.debug");
        assert_eq!(kernel_cmdline(None, None, "  ").unwrap(), "console=ttyS0");
    }

    #[test]
    fn cmdline_too_long() {
        let cmd = "x".repeat(800);
        let err = kernel_cmdline(Some(&cmd), None, "").unwrap_err();
        assert!(err.to_string().starts_with("kernel command line: "));
        assert!(kernel_cmdline(None, Some("1.2.3.4/24 x"), "").is_err());
    }

    #[test]
    fn finisher_values_and_status_line() {
        assert_eq!(finisher_value(0), 0x5555);
        assert_eq!(finisher_value(3), 0x3_3333);
        assert_eq!(finisher_value(255), 0xff_3333);
        assert_eq!(parse_status_line("ftvm-exec-status=3\r"), Some(3));
        assert_eq!(parse_status_line("ftvm-exec-status=x"), None);
        assert_eq!(parse_status_line("foo"), None);
    }
}
