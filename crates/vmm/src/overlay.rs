//! A run's own root disk: a copy of an image's `rootfs.ext4` (a reflink
//! where the filesystem has them, else a sparse copy of the blocks in use:
//! `ftvm_image::copy`) that the guest writes instead of the image, and
//! that goes when the run ends. So the cached image stays as it was built
//! (QEMU's `-snapshot`, Firecracker's and libvirt's read-only bases).
//!
//! A copy is kept when something names it for later: a snapshot taken of
//! the VM (`--restore` opens the disks it names) and a recording (`replay
//! --then-run` goes live on its disk). A kept copy has a `.kept` file
//! beside it saying why, so that a later run's sweep of copies left by
//! runs that were killed leaves it alone.

use crate::error::{file, VmmError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A copy of an image's root disk for one run; removed when dropped
/// unless kept.
#[derive(Debug)]
pub struct Overlay {
    path: PathBuf,
    kept: Keeper,
}

/// Marks an [`Overlay`] as kept, from wherever the reason arises (the live
/// loop, taking a snapshot).
#[derive(Debug, Clone)]
pub struct Keeper {
    path: PathBuf,
    why: Arc<Mutex<Option<String>>>,
}

impl Keeper {
    /// Keep the copy when the run ends, because `why` (e.g. "the snapshot
    /// /x/vm.snap uses it"). Written down at once: a run killed after this
    /// leaves its copy in place too.
    pub fn keep(&self, why: String) {
        let _ = std::fs::write(kept_marker(&self.path), format!("{why}\n"));
        *self.why.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
    }
}

fn kept_marker(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".kept");
    PathBuf::from(p)
}

/// Where runs' copies live: beside the images (`<cache>/overlays`), on
/// the same filesystem, where a reflink can share their blocks.
pub fn overlay_dir() -> PathBuf {
    ftvm_image::cache_dir().join("overlays")
}

impl Overlay {
    /// A copy of `image`'s root disk for this process's run. The image is
    /// read under a shared lock, so a copy is never taken while a
    /// `--persist` run writes it.
    pub fn create(image: &ftvm_image::GuestImage, name: &str) -> Result<Overlay, VmmError> {
        let dir = overlay_dir();
        std::fs::create_dir_all(&dir).map_err(file("cannot create", &dir))?;
        sweep(&dir);
        let path = dir.join(format!("{name}-{}.ext4", std::process::id()));
        let base = ftvm_host::disk::DiskImage::open(&image.rootfs, true).map_err(crate::host_io::HostIoError::from)?;
        let copied = ftvm_image::copy::clone_disk(&image.rootfs, &path);
        drop(base);
        if let Err(e) = copied {
            let _ = std::fs::remove_file(&path);
            return Err(file("cannot copy the image's root disk to", &path)(e));
        }
        Ok(Overlay { kept: Keeper { path: path.clone(), why: Arc::new(Mutex::new(None)) }, path })
    }

    /// The copy's path, for the VM's disk.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A handle that keeps the copy.
    pub fn keeper(&self) -> Keeper {
        self.kept.clone()
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        match self.kept.why.lock().unwrap_or_else(|e| e.into_inner()).take() {
            None => {
                let _ = std::fs::remove_file(&self.path);
            }
            Some(why) => eprintln!(
                "ftvm: the run's copy of the root disk is kept at {} ({why}); remove it and {} when done",
                self.path.display(),
                kept_marker(&self.path).display()
            ),
        }
    }
}

/// Remove the copies of runs that ended without removing theirs (killed),
/// unless kept. A copy's name ends in its run's process id.
fn sweep(dir: &Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = e.path();
        let Some(stem) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".ext4")) else {
            continue;
        };
        let Some(pid) = stem.rsplit('-').next().filter(|p| p.parse::<u32>().is_ok()) else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() && !kept_marker(&path).exists() {
            let _ = std::fs::remove_file(&path);
        }
    }
}
