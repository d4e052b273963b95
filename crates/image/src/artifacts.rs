//! Pure helpers for the build: kernel image format detection, busybox applet
//! list extraction, kernel config queries, `.deb` file names.

/// What the kernel file from `/boot` turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelFormat {
    /// A raw RISC-V `Image` (Debian's `vmlinux-*` for riscv64 is this: the
    /// uncompressed Image with its EFI-stub PE header, magic `RSC\x05` at 0x38).
    Raw,
    /// A whole-file compressed Image (`vmlinuz-*`, `Image.gz`-style).
    Compressed(&'static str),
    /// An EFI zboot image: a PE wrapper with a compressed payload.
    ZBoot {
        /// Byte offset of the payload in the file.
        offset: usize,
        /// Length of the payload in bytes.
        size: usize,
        /// The payload's compression as the header names it, e.g. `gzip`.
        method: String,
    },
    /// None of these; the build cannot use it.
    Unknown,
}

/// Whether `data` starts with a RISC-V Linux Image header.
pub fn is_riscv_image(data: &[u8]) -> bool {
    data.len() >= 0x40 && (&data[0x38..0x3c] == b"RSC\x05" || &data[0x30..0x38] == b"RISCV\0\0\0")
}

/// Detect the format of a kernel file.
pub fn kernel_format(data: &[u8]) -> KernelFormat {
    if data.len() >= 0x40 && &data[0..2] == b"MZ" && &data[4..8] == b"zimg" {
        let u32_at = |o: usize| u32::from_le_bytes(data[o..o + 4].try_into().unwrap()) as usize;
        let method: String = data[0x18..0x38].iter().take_while(|&&b| b != 0).map(|&b| b as char).collect();
        return KernelFormat::ZBoot { offset: u32_at(8), size: u32_at(12), method };
    }
    if is_riscv_image(data) {
        return KernelFormat::Raw;
    }
    match data {
        [0x1f, 0x8b, ..] => KernelFormat::Compressed("gzip"),
        [0x28, 0xb5, 0x2f, 0xfd, ..] => KernelFormat::Compressed("zstd"),
        [0xfd, b'7', b'z', b'X', b'Z', 0, ..] => KernelFormat::Compressed("xz"),
        _ => KernelFormat::Unknown,
    }
}

/// Applet names compiled into a busybox binary of any architecture: busybox
/// keeps them as one sorted, NUL-separated string table starting with `[` and
/// `[[`. Returns the longest plausible table found.
pub fn busybox_applets(binary: &[u8]) -> Result<Vec<String>, NoAppletTable> {
    let needle = b"[\0[[\0";
    let mut best: Vec<String> = Vec::new();
    let mut from = 0;
    while let Some(i) = find(&binary[from..], needle) {
        let start = from + i;
        let mut names = Vec::new();
        let mut pos = start;
        loop {
            let len = binary[pos..].iter().position(|&b| b == 0).unwrap_or(binary.len() - pos);
            if len == 0 || len > 32 {
                break;
            }
            let name = &binary[pos..pos + len];
            if !name.iter().all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"[]_-.".contains(&b)) {
                break;
            }
            names.push(String::from_utf8_lossy(name).into_owned());
            pos += len + 1;
            if pos >= binary.len() {
                break;
            }
        }
        let sorted = names.windows(2).all(|w| w[0] < w[1]);
        if sorted && names.len() > best.len() {
            best = names;
        }
        from = start + 1;
    }
    if best.len() < 20 || !best.iter().any(|n| n == "sh") {
        return Err(NoAppletTable { best_guess: best.len() });
    }
    Ok(best)
}

/// A binary without a plausible busybox applet table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no applet table found in the busybox binary (best guess had {best_guess} names)")]
pub struct NoAppletTable {
    /// Names in the longest table-like run found.
    pub best_guess: usize,
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Value of `CONFIG_<name>` in a kernel `.config` (`"y"`, `"m"`, a string...);
/// `None` when unset.
pub fn kconfig<'a>(config: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("CONFIG_{name}=");
    config.lines().find_map(|l| l.strip_prefix(key.as_str()))
}

/// `(package, version)` from a `.deb` file name `name_version_arch.deb`
/// (`%3a` in the version is an epoch colon).
pub fn deb_name_version(file: &str) -> Option<(String, String)> {
    let stem = file.strip_suffix(".deb")?;
    let mut it = stem.splitn(3, '_');
    let (name, version, _arch) = (it.next()?, it.next()?, it.next()?);
    Some((name.to_string(), version.replace("%3a", ":").replace("%3A", ":")))
}

/// 64-bit FNV-1a, for the recipe fingerprint.
pub fn fnv1a(data: &[u8], mut h: u64) -> u64 {
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}
/// Starting value of an FNV-1a hash (the 64-bit offset basis).
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_formats() {
        let mut raw = vec![0u8; 0x40];
        raw[0..2].copy_from_slice(b"MZ");
        raw[0x38..0x3c].copy_from_slice(b"RSC\x05");
        assert_eq!(kernel_format(&raw), KernelFormat::Raw);
        assert_eq!(kernel_format(&[0x1f, 0x8b, 8, 0]), KernelFormat::Compressed("gzip"));
        assert_eq!(kernel_format(&[0x28, 0xb5, 0x2f, 0xfd, 0]), KernelFormat::Compressed("zstd"));
        let mut z = vec![0u8; 0x40];
        z[0..2].copy_from_slice(b"MZ");
        z[4..8].copy_from_slice(b"zimg");
        z[8..12].copy_from_slice(&0x1000u32.to_le_bytes());
        z[12..16].copy_from_slice(&0x2345u32.to_le_bytes());
        z[0x18..0x1c].copy_from_slice(b"gzip");
        assert_eq!(kernel_format(&z), KernelFormat::ZBoot { offset: 0x1000, size: 0x2345, method: "gzip".into() });
        assert_eq!(kernel_format(b"\x7fELF...."), KernelFormat::Unknown);
    }

    #[test]
    fn applet_table() {
        let mut bin = b"\x7fELF junk [\0[[\0not sorted\0".to_vec();
        bin.extend_from_slice(b"xx[\0[[\0");
        let names = ["acpid", "ash", "base64", "cat", "devmem", "insmod", "ip", "ls", "mount", "sh", "switch_root"];
        let mut more: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        for i in 0..20 {
            more.push(format!("zz{i:02}"));
        }
        for n in &more {
            bin.extend_from_slice(n.as_bytes());
            bin.push(0);
        }
        bin.extend_from_slice(b"\0\x01\x02trailing");
        let got = busybox_applets(&bin).unwrap();
        assert_eq!(got.len(), 2 + more.len());
        assert_eq!(&got[..3], ["[", "[[", "acpid"]);
        assert!(busybox_applets(b"nothing here").is_err());
    }

    #[test]
    fn config_and_debs() {
        let cfg = "# CONFIG_FOO is not set\nCONFIG_EXT4_FS=m\nCONFIG_RD_ZSTD=y\nCONFIG_LOCALVERSION=\"\"\n";
        assert_eq!(kconfig(cfg, "EXT4_FS"), Some("m"));
        assert_eq!(kconfig(cfg, "RD_ZSTD"), Some("y"));
        assert_eq!(kconfig(cfg, "FOO"), None);
        assert_eq!(
            deb_name_version("linux-image-6.12.107+deb13-riscv64_6.12.107-1_riscv64.deb"),
            Some(("linux-image-6.12.107+deb13-riscv64".into(), "6.12.107-1".into()))
        );
        assert_eq!(deb_name_version("busybox-static_1%3a1.37.0-6+b3_riscv64.deb").unwrap().1, "1:1.37.0-6+b3");
        assert_eq!(deb_name_version("lock"), None);
    }
}
