//! Byte encoding of device state for snapshots and checkpoints.
//!
//! Every device saves itself as a flat little-endian byte string behind a
//! four-byte tag and a version, so a checkpoint stream can carry devices of
//! any type (including virtio devices behind a trait object) without a
//! serialization framework, and the bytes are identical for identical state:
//! snapshot → restore → snapshot must compare equal. Decoding never panics:
//! a truncated or foreign blob is an error.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotError(pub String);

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad device snapshot: {}", self.0)
    }
}

impl std::error::Error for SnapshotError {}

pub type SnapResult<T> = Result<T, SnapshotError>;

pub fn err<T>(msg: impl Into<String>) -> SnapResult<T> {
    Err(SnapshotError(msg.into()))
}

#[derive(Default)]
pub struct SnapWriter {
    buf: Vec<u8>,
}

impl SnapWriter {
    pub fn new(tag: &[u8; 4], version: u32) -> Self {
        let mut w = SnapWriter { buf: Vec::new() };
        w.buf.extend_from_slice(tag);
        w.u32(version);
        w
    }

    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    pub fn bool(&mut self, v: bool) {
        self.buf.push(v as u8);
    }

    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// Length-prefixed bytes.
    pub fn bytes(&mut self, v: &[u8]) {
        self.u64(v.len() as u64);
        self.buf.extend_from_slice(v);
    }

    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
}

pub struct SnapReader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> SnapReader<'a> {
    /// Checks the tag and returns the reader with the version it found.
    pub fn new(buf: &'a [u8], tag: &[u8; 4]) -> SnapResult<(Self, u32)> {
        let mut r = SnapReader { buf, pos: 0 };
        let t = r.take(4)?;
        if t != tag {
            return err(format!("expected tag {:?}, found {:?}", tag, t));
        }
        let v = r.u32()?;
        Ok((r, v))
    }

    fn take(&mut self, n: usize) -> SnapResult<&'a [u8]> {
        if self.buf.len() - self.pos < n {
            return err("truncated");
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub fn u8(&mut self) -> SnapResult<u8> {
        Ok(self.take(1)?[0])
    }

    pub fn bool(&mut self) -> SnapResult<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => err(format!("bad bool {b}")),
        }
    }

    pub fn u16(&mut self) -> SnapResult<u16> {
        let mut b = [0u8; 2];
        b.copy_from_slice(self.take(2)?);
        Ok(u16::from_le_bytes(b))
    }

    pub fn u32(&mut self) -> SnapResult<u32> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }

    pub fn u64(&mut self) -> SnapResult<u64> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }

    pub fn bytes(&mut self) -> SnapResult<&'a [u8]> {
        let n = self.u64()?;
        if n > (self.buf.len() - self.pos) as u64 {
            return err("truncated byte string");
        }
        self.take(n as usize)
    }

    /// Decoding must consume the whole blob, so a blob from a newer layout
    /// with extra fields is rejected rather than half-read.
    pub fn end(&self) -> SnapResult<()> {
        if self.pos != self.buf.len() {
            return err(format!("{} trailing bytes", self.buf.len() - self.pos));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_truncation() {
        let mut w = SnapWriter::new(b"TEST", 3);
        w.u8(1);
        w.bool(true);
        w.u16(0xbeef);
        w.u32(7);
        w.u64(u64::MAX);
        w.bytes(b"abc");
        let blob = w.finish();
        let (mut r, v) = SnapReader::new(&blob, b"TEST").unwrap();
        assert_eq!(v, 3);
        assert_eq!(r.u8().unwrap(), 1);
        assert!(r.bool().unwrap());
        assert_eq!(r.u16().unwrap(), 0xbeef);
        assert_eq!(r.u32().unwrap(), 7);
        assert_eq!(r.u64().unwrap(), u64::MAX);
        assert_eq!(r.bytes().unwrap(), b"abc");
        r.end().unwrap();
        for cut in 0..blob.len() {
            let res = SnapReader::new(&blob[..cut], b"TEST").and_then(|(mut r, _)| {
                r.u8()?;
                r.bool()?;
                r.u16()?;
                r.u32()?;
                r.u64()?;
                r.bytes()?;
                Ok(())
            });
            assert!(res.is_err());
        }
        assert!(SnapReader::new(&blob, b"NOPE").is_err());
    }
}
