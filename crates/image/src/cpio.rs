//! A minimal writer for the `newc` cpio format the kernel unpacks as an
//! initramfs. Every entry is owned by root and has mtime 0 (reproducible).

use std::io::{self, Write};

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFCHR: u32 = 0o020000;

/// Streams a newc archive to `W`. Call [`CpioWriter::finish`] at the end.
pub struct CpioWriter<W: Write> {
    out: W,
    ino: u32,
    written: u64,
}

impl<W: Write> CpioWriter<W> {
    /// A writer with nothing written yet to `out`.
    pub fn new(out: W) -> Self {
        CpioWriter { out, ino: 1, written: 0 }
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    fn pad4(&mut self) -> io::Result<()> {
        let pad = (4 - (self.written % 4) as usize) % 4;
        self.put(&[0u8; 3][..pad])
    }

    #[allow(clippy::too_many_arguments)]
    fn entry(&mut self, name: &str, mode: u32, nlink: u32, rdev: (u32, u32), data: &[u8]) -> io::Result<()> {
        let name = name.trim_start_matches('/');
        let ino = if name == "TRAILER!!!" { 0 } else { self.ino };
        self.ino += 1;
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            ino,
            mode,
            0, // uid
            0, // gid
            nlink,
            0, // mtime
            data.len(),
            0,
            0,
            rdev.0,
            rdev.1,
            name.len() + 1,
            0
        );
        self.put(header.as_bytes())?;
        self.put(name.as_bytes())?;
        self.put(&[0])?;
        self.pad4()?;
        self.put(data)?;
        self.pad4()
    }

    /// A directory (`perm` like 0o755).
    pub fn dir(&mut self, path: &str, perm: u32) -> io::Result<()> {
        self.entry(path, S_IFDIR | (perm & 0o7777), 2, (0, 0), &[])
    }

    /// A regular file.
    pub fn file(&mut self, path: &str, perm: u32, data: &[u8]) -> io::Result<()> {
        self.entry(path, S_IFREG | (perm & 0o7777), 1, (0, 0), data)
    }

    /// A symbolic link to `target`.
    pub fn symlink(&mut self, path: &str, target: &str) -> io::Result<()> {
        self.entry(path, S_IFLNK | 0o777, 1, (0, 0), target.as_bytes())
    }

    /// A character device node.
    pub fn char_dev(&mut self, path: &str, perm: u32, major: u32, minor: u32) -> io::Result<()> {
        self.entry(path, S_IFCHR | (perm & 0o7777), 1, (major, minor), &[])
    }

    /// Write the trailer and return the inner writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.entry("TRAILER!!!", 0, 1, (0, 0), &[])?;
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(h: &[u8], i: usize) -> u32 {
        u32::from_str_radix(std::str::from_utf8(&h[6 + 8 * i..14 + 8 * i]).unwrap(), 16).unwrap()
    }

    #[test]
    fn layout_and_alignment() {
        let mut w = CpioWriter::new(Vec::new());
        w.dir("/bin", 0o755).unwrap();
        w.file("init", 0o755, b"#!/bin/sh\n").unwrap();
        w.symlink("bin/sh", "busybox").unwrap();
        w.char_dev("dev/console", 0o600, 5, 1).unwrap();
        let out = w.finish().unwrap();
        assert_eq!(out.len() % 4, 0);
        // walk the archive back
        let mut off = 0;
        let mut seen = Vec::new();
        loop {
            let h = &out[off..off + 110];
            assert_eq!(&h[..6], b"070701");
            let mode = field(h, 1);
            let size = field(h, 6) as usize;
            let namesize = field(h, 11) as usize;
            let name = std::str::from_utf8(&out[off + 110..off + 110 + namesize - 1]).unwrap().to_string();
            let data_off = (off + 110 + namesize + 3) & !3;
            let data = out[data_off..data_off + size].to_vec();
            off = (data_off + size + 3) & !3;
            if name == "TRAILER!!!" {
                break;
            }
            seen.push((name, mode, data, field(h, 9), field(h, 10)));
        }
        assert_eq!(off, out.len());
        assert_eq!(seen[0].0, "bin");
        assert_eq!(seen[0].1, 0o40755);
        assert_eq!(seen[1], ("init".into(), 0o100755, b"#!/bin/sh\n".to_vec(), 0, 0));
        assert_eq!(seen[2], ("bin/sh".into(), 0o120777, b"busybox".to_vec(), 0, 0));
        assert_eq!(seen[3], ("dev/console".into(), 0o20600, vec![], 5, 1));
    }
}
