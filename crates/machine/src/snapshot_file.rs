//! The snapshot file: a machine's state plus what the host needs to give
//! it its outside world again (disk paths, TAP names: opaque here), with a
//! versioned header and a checksum.
//!
//! Layout (little-endian):
//!   magic "FTVMSNAP" | format version u32 | ftvm version (u16 length, text)
//!   | host section (u32 length, bytes) | machine state (u64 length, zstd)
//!   | blake3 of everything before it (32 bytes)
//! The file holds no time stamp or host name, so the same machine state
//! always gives the same file: restore-then-snapshot diffs clean.

use std::io::Write;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"FTVMSNAP";
/// Bumped whenever the machine state encoding or this layout changes; a
/// file of another format is refused rather than misread. 2: the board
/// has an RTC (board state version 2).
pub const FORMAT_VERSION: u32 = 2;
/// zstd level: snapshots sit on the pause path, so favour speed.
const ZSTD_LEVEL: i32 = 1;

/// What a snapshot file holds, decoded and verified.
#[derive(Debug)]
pub struct SnapshotFile {
    /// The ftvm version that wrote it (informative).
    pub writer: String,
    pub host: Vec<u8>,
    pub machine: Vec<u8>,
}

/// Why a snapshot file cannot be written or read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotFileError {
    #[error("cannot compress the snapshot: {0}")]
    Compress(#[source] std::io::Error),
    #[error("snapshot path {} names no file", .0.display())]
    NoFileName(PathBuf),
    #[error("cannot write snapshot {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read snapshot {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file was read but is not a snapshot this ftvm can use.
    #[error("snapshot {}: {source}", .path.display())]
    Format {
        path: PathBuf,
        #[source]
        source: SnapshotFormatError,
    },
}

/// Why bytes are not a valid snapshot file.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotFormatError {
    #[error("not an ftvm snapshot")]
    NotASnapshot,
    #[error("snapshot format {found}, but this ftvm ({ftvm}) reads format {FORMAT_VERSION}", ftvm = env!("CARGO_PKG_VERSION"))]
    Version { found: u32 },
    #[error("truncated")]
    Truncated,
    #[error("corrupt or truncated (checksum mismatch)")]
    Checksum,
    #[error("trailing bytes after the machine state")]
    TrailingBytes,
    #[error("machine state of {0} bytes is implausible")]
    ImplausibleLength(u64),
    #[error("machine state: {0}")]
    Decompress(#[source] std::io::Error),
    #[error("machine state has the wrong length")]
    WrongLength,
    #[error("cannot allocate {} MiB for the machine state: the host refused the memory", .0 >> 20)]
    OutOfMemory(u64),
}

/// Writes atomically: a crash mid-write leaves the old file (or none),
/// never a torn one.
pub fn write(path: &Path, host: &[u8], machine: &[u8]) -> Result<(), SnapshotFileError> {
    let bytes = encode(host, machine).map_err(SnapshotFileError::Compress)?;
    let name = path.file_name().ok_or_else(|| SnapshotFileError::NoFileName(path.to_path_buf()))?;
    let tmp = path.with_file_name(format!(".{}.tmp{}", name.to_string_lossy(), std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        SnapshotFileError::Write { path: path.to_path_buf(), source }
    })
}

pub fn encode(host: &[u8], machine: &[u8]) -> std::io::Result<Vec<u8>> {
    let body = zstd::bulk::compress(machine, ZSTD_LEVEL)?;
    let version = env!("CARGO_PKG_VERSION").as_bytes();
    let mut out = Vec::with_capacity(body.len() + host.len() + 128);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(version.len() as u16).to_le_bytes());
    out.extend_from_slice(version);
    out.extend_from_slice(&(host.len() as u32).to_le_bytes());
    out.extend_from_slice(host);
    out.extend_from_slice(&(machine.len() as u64).to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&body);
    let sum = blake3::hash(&out);
    out.extend_from_slice(sum.as_bytes());
    Ok(out)
}

pub fn read(path: &Path) -> Result<SnapshotFile, SnapshotFileError> {
    let bytes = std::fs::read(path).map_err(|source| SnapshotFileError::Read { path: path.to_path_buf(), source })?;
    decode(&bytes).map_err(|source| SnapshotFileError::Format { path: path.to_path_buf(), source })
}

pub fn decode(bytes: &[u8]) -> Result<SnapshotFile, SnapshotFormatError> {
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(SnapshotFormatError::NotASnapshot);
    }
    let mut r = Cursor { buf: bytes, pos: MAGIC.len() };
    let format = u32::from_le_bytes(r.take(4)?.try_into().unwrap());
    if format != FORMAT_VERSION {
        return Err(SnapshotFormatError::Version { found: format });
    }
    if bytes.len() < 32 + r.pos {
        return Err(SnapshotFormatError::Truncated);
    }
    let (content, sum) = bytes.split_at(bytes.len() - 32);
    if blake3::hash(content).as_bytes() != sum {
        return Err(SnapshotFormatError::Checksum);
    }
    r.buf = content;
    let vlen = u16::from_le_bytes(r.take(2)?.try_into().unwrap()) as usize;
    let writer = String::from_utf8_lossy(r.take(vlen)?).into_owned();
    let hlen = u32::from_le_bytes(r.take(4)?.try_into().unwrap()) as usize;
    let host = r.take(hlen)?.to_vec();
    let mlen = u64::from_le_bytes(r.take(8)?.try_into().unwrap());
    let blen = u64::from_le_bytes(r.take(8)?.try_into().unwrap());
    let body = r.take(usize::try_from(blen).map_err(|_| SnapshotFormatError::Truncated)?)?;
    if r.pos != content.len() {
        return Err(SnapshotFormatError::TrailingBytes);
    }
    // The size is bounded by the largest RAM a machine can have plus its
    // devices, so a corrupt length cannot make us allocate without end.
    if mlen > (64 << 30) + (1 << 30) {
        return Err(SnapshotFormatError::ImplausibleLength(mlen));
    }
    let machine = inflate(body, mlen)?;
    Ok(SnapshotFile { writer, host, machine })
}

/// Decompresses `body`, which says it holds `len` bytes. The buffer grows
/// with what the data really holds, fallibly: a corrupt or hostile length
/// cannot make us reserve tens of GiB up front (`zstd::bulk` would, and
/// abort when the host refuses), and a host short of memory for a real
/// snapshot is an error.
fn inflate(body: &[u8], len: u64) -> Result<Vec<u8>, SnapshotFormatError> {
    use std::io::Read;
    let mut decoder = zstd::stream::read::Decoder::with_buffer(body).map_err(SnapshotFormatError::Decompress)?;
    let mut out = Vec::new();
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let n = match decoder.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(SnapshotFormatError::Decompress(e)),
        };
        if out.len() as u64 + n as u64 > len {
            return Err(SnapshotFormatError::WrongLength);
        }
        out.try_reserve(n).map_err(|_| SnapshotFormatError::OutOfMemory(len))?;
        out.extend_from_slice(&chunk[..n]);
    }
    if out.len() as u64 != len {
        return Err(SnapshotFormatError::WrongLength);
    }
    Ok(out)
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotFormatError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or(SnapshotFormatError::Truncated)?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let machine: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let f = encode(b"host", &machine).unwrap();
        let d = decode(&f).unwrap();
        assert_eq!((d.host.as_slice(), d.machine.as_slice()), (&b"host"[..], &machine[..]));
        assert_eq!(encode(b"host", &machine).unwrap(), f, "encoding is deterministic");
        assert!(matches!(decode(b"hello"), Err(SnapshotFormatError::NotASnapshot)));
        assert!(decode(b"hello").unwrap_err().to_string().contains("not an ftvm snapshot"));
        let mut other = f.clone();
        other[8] = 9;
        assert!(matches!(decode(&other), Err(SnapshotFormatError::Version { found: 9 })));
        assert!(decode(&other).unwrap_err().to_string().contains("format 9"));
        // Files from before the RTC (format 1) are refused in one line.
        other[8] = 1;
        let e = decode(&other).unwrap_err().to_string();
        assert!(e.starts_with("snapshot format 1, but this ftvm (") && e.ends_with("reads format 2"), "{e}");
        for cut in [9, 12, 40, f.len() / 2, f.len() - 1] {
            assert!(decode(&f[..cut]).is_err(), "cut at {cut}");
        }
        let mut flipped = f.clone();
        let mid = f.len() / 2;
        flipped[mid] ^= 1;
        assert!(matches!(decode(&flipped), Err(SnapshotFormatError::Checksum)));
        assert!(decode(&flipped).unwrap_err().to_string().contains("checksum"));
    }

    /// A small file that declares a huge machine state (60 GiB, under the
    /// plausible bound) is refused by what its data holds, without
    /// reserving the declared size first (which aborted the process).
    #[test]
    fn a_declared_length_beyond_the_data_is_refused_without_reserving_it() {
        let f = encode(b"", b"tiny machine").unwrap();
        let version = env!("CARGO_PKG_VERSION").len();
        let at = MAGIC.len() + 4 + 2 + version + 4;
        let mut forged = f[..f.len() - 32].to_vec();
        forged[at..at + 8].copy_from_slice(&(60u64 << 30).to_le_bytes());
        let sum = blake3::hash(&forged);
        forged.extend_from_slice(sum.as_bytes());
        assert!(matches!(decode(&forged), Err(SnapshotFormatError::WrongLength)));
    }
}
