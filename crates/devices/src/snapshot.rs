//! Byte encoding of device state for snapshots and checkpoints.
//!
//! Every device saves itself as a flat little-endian byte string behind a
//! four-byte tag and a version, so a checkpoint stream can carry devices of
//! any type (including virtio devices behind a trait object) without a
//! serialization framework, and the bytes are identical for identical state:
//! snapshot → restore → snapshot must compare equal. Decoding never panics:
//! a truncated or foreign blob is an error.

/// Why a device's saved state cannot be restored: a blob that is cut,
/// foreign or corrupt, or one saved from a device unlike this one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error("bad device snapshot: expected tag {expected:?}, found {found:?}")]
    Tag { expected: [u8; 4], found: Vec<u8> },
    #[error("bad device snapshot: truncated")]
    Truncated,
    #[error("bad device snapshot: truncated byte string")]
    TruncatedBytes,
    #[error("bad device snapshot: bad bool {0}")]
    Bool(u8),
    #[error("bad device snapshot: {0} trailing bytes")]
    Trailing(usize),
    /// A layout this build does not read; `device` names it ("UART").
    #[error("bad device snapshot: {device} snapshot version {version}")]
    Version { device: &'static str, version: u32 },
    #[error("bad device snapshot: PLIC snapshot has {saved} contexts, machine has {actual}")]
    PlicContexts { saved: usize, actual: usize },
    #[error("bad device snapshot: CLINT snapshot has {saved} harts, machine has {actual}")]
    ClintHarts { saved: usize, actual: usize },
    #[error("bad device snapshot: UART snapshot drives irq {saved}, this one {actual}")]
    UartIrq { saved: u32, actual: u32 },
    #[error("bad device snapshot: UART snapshot receive buffer too large")]
    UartBuffer,
    #[error(
        "bad device snapshot: RTC snapshot drives irq {saved_irq} at {saved_hz} Hz, this one irq {irq} at {hz} Hz"
    )]
    RtcWiring { saved_irq: u32, saved_hz: u64, irq: u32, hz: u64 },
    #[error("bad device snapshot: syscon request tag {0}")]
    SysconRequest(u8),
    #[error("bad device snapshot: queue max size {saved}, device has {actual}")]
    QueueMaxSize { saved: u16, actual: u16 },
    #[error("bad device snapshot: ready queue with invalid size")]
    QueueSize,
    #[error(
        "bad device snapshot: virtio-mmio snapshot is type {saved_type} on irq {saved_irq}, slot is type {slot_type} on irq {slot_irq}"
    )]
    MmioSlot { saved_type: u32, saved_irq: u32, slot_type: u32, slot_irq: u32 },
    #[error("bad device snapshot: virtio-mmio snapshot has {saved} queues, device has {actual}")]
    MmioQueues { saved: usize, actual: usize },
    /// A saved request with more buffers than a queue can hold;
    /// `device` names it ("virtio-blk").
    #[error("bad device snapshot: {device} request with too many buffers")]
    TooManyBuffers { device: &'static str },
    #[error("bad device snapshot: virtio-blk snapshot is for a different disk")]
    OtherDisk,
    #[error("bad device snapshot: unknown disk operation {0}")]
    DiskOperation(u8),
    #[error("bad device snapshot: virtio-net snapshot is for MAC {}, device has {}", crate::virtio::net::format_mac(.saved), crate::virtio::net::format_mac(.actual))]
    OtherMac { saved: Vec<u8>, actual: [u8; 6] },
    #[error("bad device snapshot: virtio-rng snapshot has requests out of tag order")]
    RngOrder,
    #[error("bad device snapshot: virtio-rng request of {0} bytes")]
    RngLength(u32),
}

pub type SnapResult<T> = Result<T, SnapshotError>;

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
            return Err(SnapshotError::Tag { expected: *tag, found: t.to_vec() });
        }
        let v = r.u32()?;
        Ok((r, v))
    }

    fn take(&mut self, n: usize) -> SnapResult<&'a [u8]> {
        if self.buf.len() - self.pos < n {
            return Err(SnapshotError::Truncated);
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
            b => Err(SnapshotError::Bool(b)),
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
            return Err(SnapshotError::TruncatedBytes);
        }
        self.take(n as usize)
    }

    /// Decoding must consume the whole blob, so a blob from a newer layout
    /// with extra fields is rejected rather than half-read.
    pub fn end(&self) -> SnapResult<()> {
        if self.pos != self.buf.len() {
            return Err(SnapshotError::Trailing(self.buf.len() - self.pos));
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
