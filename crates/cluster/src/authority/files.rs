//! The authority's files (its certificate and key, a host's, the API's
//! token, a VM's pair key): made new with the mode asked for and synced,
//! never written over; a secret one used only if nobody but its owner may
//! read it.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read {}: {source}", .path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot write {}: {source}", .path.display())]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{} may be read by others: chmod 600 it", .path.display())]
    Shared { path: PathBuf },
}

/// Refuses a secret file that others may read.
pub fn private(path: &Path) -> Result<(), FileError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|source| FileError::Read { path: path.into(), source })?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(FileError::Shared { path: path.into() });
    }
    Ok(())
}

/// Writes `contents` to a new file `path` (never over one), with `mode`,
/// and syncs it.
pub fn create(path: &Path, contents: &[u8], mode: u32) -> Result<(), FileError> {
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(path)?;
        f.write_all(contents)?;
        f.sync_all()
    };
    write().map_err(|source| FileError::Write { path: path.into(), source })
}
