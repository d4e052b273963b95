//! The pair key: a 256-bit secret the two hosts of a pair share. It keys
//! the logging channel's handshake (only a holder can connect as the
//! primary or answer as the backup) and the heartbeats' MACs; each use
//! gets its own key derived from it, so no key does two jobs.
//!
//! A key file holds one line, `ftvm-pair-key-v1 <64 hex digits>`, and must
//! be readable by its owner only (as ssh insists of private keys): a key
//! others can read authenticates nobody. `ftvm ft keygen FILE` writes one;
//! by default both sides use `pair.key` on the shared storage, which both
//! hosts already trust with the disk and the arbiter, and whichever side
//! comes first creates it.

use std::io::{ErrorKind, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

const TAG: &str = "ftvm-pair-key-v1";
/// Key derivation contexts (BLAKE3's `derive_key`): one per use.
const CHANNEL_CONTEXT: &str = "ftvm 2026-11 logging channel pre-shared key";
const HEARTBEAT_CONTEXT: &str = "ftvm 2026-11 heartbeat MAC key";
const ID_CONTEXT: &str = "ftvm 2026-11 pair key identifier";

/// Why a pair key could not be had.
#[derive(Debug, thiserror::Error)]
pub enum PairKeyError {
    #[error("cannot read the pair key {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the pair key {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not a pair key (make one with `ftvm ft keygen FILE`)", .0.display())]
    Unreadable(PathBuf),
    #[error("the pair key {} can be read by others (mode {mode:o}): chmod 600 it", .path.display())]
    Exposed { path: PathBuf, mode: u32 },
    #[error("the pair key {} exists already", .0.display())]
    Exists(PathBuf),
    #[error("no randomness for a new pair key: {0}")]
    Random(String),
}

/// A pair's shared secret.
#[derive(Clone)]
pub struct PairKey([u8; 32]);

impl std::fmt::Debug for PairKey {
    /// Never the secret: its identifier.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PairKey({})", self.id())
    }
}

impl PairKey {
    /// A fresh random key.
    pub fn generate() -> Result<PairKey, PairKeyError> {
        let mut k = [0u8; 32];
        getrandom::fill(&mut k).map_err(|e| PairKeyError::Random(e.to_string()))?;
        Ok(PairKey(k))
    }

    /// A key from its 32 bytes (tests, and keys kept elsewhere).
    pub fn from_bytes(bytes: [u8; 32]) -> PairKey {
        PairKey(bytes)
    }

    /// Reads the key in `path`, which only its owner may read.
    pub fn read(path: &Path) -> Result<PairKey, PairKeyError> {
        let read_err = |source| PairKeyError::Read { path: path.to_path_buf(), source };
        let meta = std::fs::metadata(path).map_err(read_err)?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(PairKeyError::Exposed { path: path.to_path_buf(), mode });
        }
        // A key file is one short line: refuse to read anything large.
        if meta.len() > 256 {
            return Err(PairKeyError::Unreadable(path.to_path_buf()));
        }
        let text = std::fs::read_to_string(path).map_err(read_err)?;
        Self::parse(text.trim()).ok_or_else(|| PairKeyError::Unreadable(path.to_path_buf()))
    }

    fn parse(line: &str) -> Option<PairKey> {
        let hex = line.strip_prefix(TAG)?.trim();
        if hex.len() != 64 {
            return None;
        }
        let mut k = [0u8; 32];
        for (i, b) in k.iter_mut().enumerate() {
            *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(PairKey(k))
    }

    fn line(&self) -> String {
        let hex: String = self.0.iter().map(|b| format!("{b:02x}")).collect();
        format!("{TAG} {hex}\n")
    }

    /// Writes a new random key to `path` (mode 0600), which must not exist.
    pub fn create(path: &Path) -> Result<PairKey, PairKeyError> {
        let key = PairKey::generate()?;
        key.write_new(path)?;
        Ok(key)
    }

    /// Writes this key to `path` (mode 0600) whole or not at all: written
    /// beside it and linked into place, so a reader never sees half a
    /// key, and `path` is never replaced.
    fn write_new(&self, path: &Path) -> Result<(), PairKeyError> {
        let write_err = |source| PairKeyError::Write { path: path.to_path_buf(), source };
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut tag = [0u8; 8];
        getrandom::fill(&mut tag).map_err(|e| PairKeyError::Random(e.to_string()))?;
        let tag: String = tag.iter().map(|b| format!("{b:02x}")).collect();
        let tmp = path.with_file_name(format!(".{name}.{tag}.tmp"));
        let written = (|| {
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
            f.write_all(self.line().as_bytes())?;
            f.sync_all()?;
            std::fs::hard_link(&tmp, path)
        })();
        let _ = std::fs::remove_file(&tmp);
        match written {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Err(PairKeyError::Exists(path.to_path_buf())),
            Err(e) => Err(write_err(e)),
        }
    }

    /// The key in `path`, made there first if there is none: both sides of
    /// a pair call this on the shared storage, and the first one's key is
    /// the pair's.
    pub fn read_or_create(path: &Path) -> Result<PairKey, PairKeyError> {
        match PairKey::read(path) {
            Err(PairKeyError::Read { source, .. }) if source.kind() == ErrorKind::NotFound => {
                match PairKey::create(path) {
                    Err(PairKeyError::Exists(_)) => PairKey::read(path),
                    other => other,
                }
            }
            other => other,
        }
    }

    /// The logging channel's pre-shared key.
    pub(crate) fn channel_psk(&self) -> [u8; 32] {
        blake3::derive_key(CHANNEL_CONTEXT, &self.0)
    }

    /// The heartbeats' MAC key.
    pub(crate) fn heartbeat_key(&self) -> [u8; 32] {
        blake3::derive_key(HEARTBEAT_CONTEXT, &self.0)
    }

    /// A short public name of the key, for messages: two sides that print
    /// different ones hold different keys. It reveals nothing of the key.
    pub fn id(&self) -> String {
        let h = blake3::derive_key(ID_CONTEXT, &self.0);
        h[..4].iter().map(|b| format!("{b:02x}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ftvm-pair-key-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_created_key_reads_back_private_and_is_never_replaced() {
        let d = scratch("create");
        let path = d.join("pair.key");
        let k = PairKey::create(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(PairKey::read(&path).unwrap().0, k.0);
        assert!(matches!(PairKey::create(&path), Err(PairKeyError::Exists(_))));
        assert_eq!(PairKey::read_or_create(&path).unwrap().0, k.0, "the first side's key is the pair's");
        assert_eq!(format!("{k:?}"), format!("PairKey({})", k.id()), "Debug shows the identifier, never the key");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn racing_sides_agree_on_one_key() {
        let d = scratch("race");
        let path = d.join("pair.key");
        let keys: Vec<[u8; 32]> = (0..8)
            .map(|_| {
                let p = path.clone();
                std::thread::spawn(move || PairKey::read_or_create(&p).unwrap().0)
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        assert!(keys.iter().all(|k| *k == keys[0]));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn exposed_or_malformed_keys_are_refused() {
        let d = scratch("bad");
        let path = d.join("pair.key");
        PairKey::create(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(PairKey::read(&path), Err(PairKeyError::Exposed { mode: 0o644, .. })));
        let junk = d.join("junk.key");
        std::fs::write(&junk, "ftvm-pair-key-v1 abc\n").unwrap();
        std::fs::set_permissions(&junk, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(PairKey::read(&junk), Err(PairKeyError::Unreadable(_))));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn derived_keys_differ_by_use() {
        let k = PairKey::from_bytes([7; 32]);
        assert_ne!(k.channel_psk(), k.heartbeat_key());
        assert_ne!(k.channel_psk(), [7; 32]);
    }
}
