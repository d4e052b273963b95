//! Shared by the machine's integration tests that boot the default guest
//! in-process: the image, a private copy of its root disk, and that disk
//! served the way a host with instant I/O would serve it.

use ftvm_devices::virtio::blk::BlockBackend;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub fn image() -> ftvm_image::GuestImage {
    ftvm_image::locate().unwrap_or_else(|e| panic!("the default guest image is not available ({e}): run `make image`"))
}

/// A private copy of the root filesystem (the guest writes to its disk),
/// removed when dropped. Copied sparsely: the image is 1 GiB, mostly holes.
pub struct TempDisk(pub PathBuf);

impl TempDisk {
    pub fn copy_of(src: &Path, tag: &str) -> TempDisk {
        let dst = std::env::temp_dir().join(format!("ftvm-machine-test-{}-{tag}.ext4", std::process::id()));
        ftvm_image::sparse_copy(src, &dst)
            .unwrap_or_else(|e| panic!("copying {} to {}: {e}", src.display(), dst.display()));
        TempDisk(dst)
    }

    pub fn size(&self) -> u64 {
        std::fs::metadata(&self.0).unwrap().len()
    }

    /// The copy opened for the test to serve the guest's requests.
    pub fn open(&self) -> Disk {
        Disk(std::fs::OpenOptions::new().read(true).write(true).open(&self.0).unwrap())
    }
}

impl Drop for TempDisk {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Instant disk I/O over a file: a request completes at the instruction
/// boundary where the machine issued it, so the run stays a function of
/// the start state.
pub struct Disk(std::fs::File);

impl BlockBackend for Disk {
    fn size(&self) -> u64 {
        self.0.metadata().map(|m| m.len()).unwrap_or(0)
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.0.read_exact_at(buf, offset)
    }
    fn write_at(&mut self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.0.write_all_at(data, offset)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
