//! Growing a VM's copy of an image's root disk to the size the VM asks
//! for (a cluster VM's `--disk-size`): the file made longer (sparse: the
//! new space costs nothing until written) and its ext4 filesystem grown
//! into it, on the host, before the VM first boots.
//!
//! Offline on the host rather than in the guest: the guest then sees its
//! full disk from its first boot on with no agent of ours inside it, and
//! a backup, which receives the primary's disk block by block, needs no
//! step of its own.

use crate::build::{run, run_accepting, tool};
use crate::ImageError;
use std::path::Path;
use std::process::Command;

/// Makes the ext4 disk image `disk` `bytes` long and grows its
/// filesystem to fill it. A disk already that long or longer is left as
/// it is (a filesystem is never shrunk here).
pub fn grow_disk(disk: &Path, bytes: u64) -> Result<(), ImageError> {
    let step = "growing the VM's root disk";
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(disk)
        .map_err(|e| ImageError::new(step, format!("{}: {e}", disk.display())))?;
    let len = file.metadata().map_err(|e| ImageError::new(step, format!("{}: {e}", disk.display())))?.len();
    if len >= bytes {
        return Ok(());
    }
    file.set_len(bytes).map_err(|e| ImageError::new(step, format!("{}: {e}", disk.display())))?;
    drop(file);
    // resize2fs grows only a filesystem checked since its last mount (it
    // says so and stops otherwise). An image fresh from its build is
    // clean; e2fsck may still shorten an extent tree (e2image's compaction
    // leaves some longer than need be): its exit status 1 says it changed
    // something and the filesystem is sound, 4 and up that it is not.
    let changed_or_clean = |status: std::process::ExitStatus| matches!(status.code(), Some(0 | 1));
    run_accepting(step, Command::new(tool("e2fsck")?).args(["-f", "-y"]).arg(disk), None, changed_or_clean)?;
    run(step, Command::new(tool("resize2fs")?).arg(disk), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 64 MiB ext4 image grown to 128 MiB: the filesystem's block
    /// count doubles (dumpe2fs says so), and growing it to a smaller size
    /// changes nothing.
    #[test]
    fn a_disk_and_its_filesystem_grow_and_never_shrink() {
        let mke2fs = tool("mke2fs").expect("mke2fs (e2fsprogs; scripts/install-deps.sh installs it)");
        let dir = tempdir();
        let disk = dir.join("disk.img");
        std::fs::File::create(&disk).unwrap().set_len(64 << 20).unwrap();
        let out = Command::new(mke2fs).args(["-q", "-F", "-t", "ext4", "-b", "4096"]).arg(&disk).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(blocks(&disk), 16384);
        grow_disk(&disk, 128 << 20).unwrap();
        assert_eq!(std::fs::metadata(&disk).unwrap().len(), 128 << 20);
        assert_eq!(blocks(&disk), 32768);
        grow_disk(&disk, 32 << 20).unwrap();
        assert_eq!(std::fs::metadata(&disk).unwrap().len(), 128 << 20);
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn blocks(disk: &Path) -> u64 {
        let out = Command::new("dumpe2fs").arg("-h").arg(disk).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().find(|l| l.starts_with("Block count:")).expect("dumpe2fs shows the block count");
        line.split(':').nth(1).unwrap().trim().parse().unwrap()
    }

    fn tempdir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("ftvm-grow-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
