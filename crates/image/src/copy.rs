//! Copies of disk images that cost only what differs: a run's root disk
//! and a pair's shared disk are copies of an image's `rootfs.ext4`, which
//! stays as built.
//!
//! A reflink (FICLONE) where the filesystem shares blocks between files
//! (btrfs, XFS, bcachefs): instant, and no block is written until the
//! guest writes it. Elsewhere (ext4, tmpfs) a sparse copy of the data
//! extents only (SEEK_DATA/SEEK_HOLE), each copied in the kernel with
//! copy_file_range(2) (which itself shares blocks on filesystems that can,
//! NFS 4.2 servers included); the holes of a 1 GiB image that holds
//! 200 MiB stay holes.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// How [`clone_disk`] made its copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    /// The copy shares every block with the original until written.
    Reflink,
    /// The data extents were copied; holes stayed holes.
    Sparse,
}

/// Copy the disk image `src` to `dst` (created or truncated): a reflink if
/// the filesystem has them, else a sparse copy. The bytes read back are
/// the same either way.
pub fn clone_disk(src: &Path, dst: &Path) -> io::Result<CopyKind> {
    let input = File::open(src)?;
    let output = File::create(dst)?;
    // SAFETY: FICLONE takes the source descriptor as its argument and
    // touches no memory of ours; both descriptors are open.
    let cloned = unsafe { libc::ioctl(output.as_raw_fd(), libc::FICLONE, input.as_raw_fd()) } == 0;
    if cloned {
        return Ok(CopyKind::Reflink);
    }
    let len = input.metadata()?.len();
    // set_len first: the holes at the end are part of the copy.
    output.set_len(len)?;
    let mut pos = 0u64;
    while pos < len {
        let Some(data) = seek(&input, pos, libc::SEEK_DATA)? else {
            break; // nothing but a hole from here
        };
        let end = seek(&input, data, libc::SEEK_HOLE)?.unwrap_or(len).min(len);
        copy_range(&input, &output, data, end)?;
        pos = end;
    }
    Ok(CopyKind::Sparse)
}

/// lseek(2) with SEEK_DATA or SEEK_HOLE; `None` where there is no more
/// data (ENXIO). A filesystem without either treats the whole file as data.
fn seek(file: &File, from: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    // SAFETY: lseek on an open descriptor touches no memory.
    let r = unsafe { libc::lseek(file.as_raw_fd(), from as libc::off_t, whence) };
    if r >= 0 {
        return Ok(Some(r as u64));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENXIO) => Ok(None),
        Some(libc::EINVAL) if whence == libc::SEEK_DATA => Ok(Some(from)),
        Some(libc::EINVAL) => Ok(None),
        _ => Err(e),
    }
}

/// Copy bytes `[from, to)` of `input` to the same place in `output`:
/// copy_file_range, or plain reads and writes where the kernel refuses it
/// (across filesystems on old kernels, some FUSE and special files).
fn copy_range(input: &File, output: &File, from: u64, to: u64) -> io::Result<()> {
    let mut pos = from;
    while pos < to {
        let mut off_in = pos as libc::loff_t;
        let mut off_out = pos as libc::loff_t;
        let want = (to - pos).min(1 << 30) as usize;
        // SAFETY: both descriptors are open; the offsets are ours and the
        // kernel only updates them.
        let n =
            unsafe { libc::copy_file_range(input.as_raw_fd(), &mut off_in, output.as_raw_fd(), &mut off_out, want, 0) };
        if n > 0 {
            pos += n as u64;
            continue;
        }
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the source image shrank while copied"));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EXDEV | libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => {
                return copy_by_hand(input, output, pos, to)
            }
            Some(libc::EINTR) => continue,
            _ => return Err(e),
        }
    }
    Ok(())
}

fn copy_by_hand(input: &File, output: &File, mut pos: u64, to: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 1 << 20];
    while pos < to {
        let want = (to - pos).min(buf.len() as u64) as usize;
        let n = input.read_at(&mut buf[..want], pos)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the source image shrank while copied"));
        }
        // Zeros stay holes, as a sparse copy should.
        if buf[..n].iter().any(|&b| b != 0) {
            output.write_all_at(&buf[..n], pos)?;
        }
        pos += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileExt, MetadataExt};

    #[test]
    fn a_copy_reads_the_same_and_keeps_holes() {
        let dir = std::env::temp_dir().join(format!("ftvm-clone-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (src, dst) = (dir.join("src.img"), dir.join("dst.img"));
        let f = File::create(&src).unwrap();
        // data at the start, a 64 MiB hole, data, and a hole at the end
        f.set_len(200 << 20).unwrap();
        f.write_all_at(b"head", 0).unwrap();
        f.write_all_at(&vec![7u8; 3 << 20], 64 << 20).unwrap();
        drop(f);
        std::fs::write(&dst, b"old contents, longer than nothing").unwrap();
        let kind = clone_disk(&src, &dst).unwrap();
        assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&dst).unwrap());
        let used = std::fs::metadata(&dst).unwrap().blocks() * 512;
        assert!(used < 16 << 20, "{kind:?} copy uses {used} bytes: holes were filled");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
