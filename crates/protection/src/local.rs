//! What the backup's own host gives the pair it follows: its paths of the
//! VM's disks, and the files a VM may start from. The primary's header
//! says what must match (hashes, sizes, the names it used); every path a
//! backup opens, creates or reads comes from here, that is from its own
//! command line and shared storage, never from the wire. A header naming
//! `/etc/passwd` as its disk or kernel finds nothing here to touch.

use crate::error::ProtectionError;
use crate::pair::{DiskSharing, PairHeader, SlotDisks};
use ftvm_replay::replayer::{FileFinder, HeaderError};
use std::path::{Path, PathBuf};

/// Largest file taken as a firmware, kernel, initrd or snapshot: a
/// snapshot holds a VM's RAM (at most 64 GiB, compressed), the others are
/// far smaller. Larger candidates are not read to be hashed.
const MAX_IMAGE: u64 = 64 << 30;

/// This host's side of a pair's files.
#[derive(Debug, Clone, Default)]
pub struct LocalFiles {
    /// This host's path of each disk, in slot order, as its command line
    /// gave them (`--disk`).
    pub disks: Vec<PathBuf>,
    /// The shared storage (`--shared`; none for a pair on etcd): a shared
    /// disk or a file the command line does not name is looked for here,
    /// by the file name the primary used (its name only, never its
    /// directory).
    pub shared: Option<PathBuf>,
    /// Files a VM may start from (firmware, kernel, initrd, snapshot):
    /// this host's default guest image and any given with `--start-file`,
    /// each taken only if its hash is the one recorded.
    pub start_files: Vec<PathBuf>,
}

impl LocalFiles {
    /// The pair's disks at this host's paths: those given, in order, and
    /// for the rest of a pair with shared disks the file of the same name
    /// on the shared storage. Copies of separate disks are this host's
    /// own: each must be given.
    pub fn disk_paths(&self, pair: &PairHeader) -> Result<SlotDisks, ProtectionError> {
        if self.disks.len() > pair.disks.len() {
            return Err(ProtectionError::DiskCount { given: self.disks.len(), disks: pair.disks.len() });
        }
        let mut out = Vec::new();
        for (i, disk) in pair.disks.iter().enumerate() {
            let path = match self.disks.get(i) {
                Some(mine) => mine.clone(),
                None if pair.disk_policy.sharing == DiskSharing::Separate => {
                    return Err(ProtectionError::DiskNotGiven { slot: disk.slot, name: name_of(&disk.path) });
                }
                None => self
                    .in_shared(&disk.path)
                    .ok_or_else(|| ProtectionError::DiskNotGiven { slot: disk.slot, name: name_of(&disk.path) })?,
            };
            out.push((disk.slot, path));
        }
        Ok(out)
    }

    /// The file on the shared storage with the name `recorded` has.
    fn in_shared(&self, recorded: &Path) -> Option<PathBuf> {
        let name = recorded.file_name()?;
        // A file name is one component: no directory, no `..`.
        let shared = self.shared.as_ref()?;
        (Path::new(name).components().count() == 1 && name != "..").then(|| shared.join(name))
    }
}

fn name_of(path: &Path) -> String {
    path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned())
}

impl FileFinder for LocalFiles {
    /// The first of this host's files whose hash is `hash`: the one of
    /// the same name on the shared storage first, then the start files.
    fn find(&self, key: &'static str, hash: &str, recorded: &Path) -> Result<Vec<u8>, HeaderError> {
        let candidates = self.in_shared(recorded).into_iter().chain(self.start_files.iter().cloned());
        for path in candidates {
            let small_enough = std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() <= MAX_IMAGE);
            if !small_enough {
                continue;
            }
            let Ok(bytes) = std::fs::read(&path) else { continue };
            if blake3::hash(&bytes).to_hex().as_str() == hash {
                return Ok(bytes);
            }
        }
        Err(HeaderError::NoLocalCopy { key, name: name_of(recorded), hash: hash.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pair::{DiskPolicy, ModeSetting, PairDisk, PAIR_HEADER_VERSION};

    fn pair(sharing: DiskSharing, paths: &[&str]) -> PairHeader {
        PairHeader {
            version: PAIR_HEADER_VERSION,
            generation: 1,
            mode: ModeSetting::Lockstep,
            disk_policy: DiskPolicy { sharing, backup_reads: false },
            disks: paths
                .iter()
                .enumerate()
                .map(|(slot, p)| PairDisk { slot, path: PathBuf::from(p), digest: None })
                .collect(),
            storage_token: String::new(),
            host: "host-a".into(),
        }
    }

    #[test]
    fn paths_in_a_header_never_leave_the_shared_storage() {
        let local = LocalFiles { shared: Some(PathBuf::from("/srv/pair")), ..LocalFiles::default() };
        let disks = local.disk_paths(&pair(DiskSharing::Shared, &["/etc/passwd", "/x/../../disk.img"])).unwrap();
        assert_eq!(disks, vec![(0, PathBuf::from("/srv/pair/passwd")), (1, PathBuf::from("/srv/pair/disk.img"))]);
        assert!(local.disk_paths(&pair(DiskSharing::Shared, &["/"])).is_err());
        assert!(local.disk_paths(&pair(DiskSharing::Shared, &[".."])).is_err());
    }

    #[test]
    fn separate_copies_must_be_given() {
        let local = LocalFiles { shared: Some(PathBuf::from("/srv/pair")), ..LocalFiles::default() };
        let e = local.disk_paths(&pair(DiskSharing::Separate, &["/data/disk.img"])).unwrap_err();
        assert!(matches!(e, ProtectionError::DiskNotGiven { slot: 0, .. }), "{e}");
        let given = LocalFiles { disks: vec![PathBuf::from("/mine.img")], ..local };
        assert_eq!(
            given.disk_paths(&pair(DiskSharing::Separate, &["/data/disk.img"])).unwrap()[0].1,
            PathBuf::from("/mine.img")
        );
    }

    #[test]
    fn files_are_found_by_hash_among_this_hosts_own() {
        let dir = std::env::temp_dir().join(format!("ftvm-local-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kernel = dir.join("my-kernel");
        std::fs::write(&kernel, b"kernel bytes").unwrap();
        let hash = blake3::hash(b"kernel bytes").to_hex().to_string();
        let local =
            LocalFiles { shared: Some(dir.join("shared")), start_files: vec![kernel.clone()], ..LocalFiles::default() };
        // Recorded under another path and name: found by its hash.
        assert_eq!(local.find("kernel", &hash, Path::new("/somewhere/Image")).unwrap(), b"kernel bytes");
        // A path in the header to a file that is not ours is never read.
        let other = blake3::hash(b"root:x:0:0").to_hex().to_string();
        let e = local.find("kernel", &other, Path::new("/etc/passwd")).unwrap_err();
        assert!(matches!(e, HeaderError::NoLocalCopy { key: "kernel", .. }), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
