//! One log entry on the wire: `varint(icount - previous icount)`, a kind
//! byte, then the kind's payload. Lengths are varints; fixed-size numbers
//! are little-endian. Decoding never panics and never allocates more than
//! the input holds.

use ftvm_devices::virtio::blk::BlkResult;
use ftvm_machine::{Event, IoCompletion, StateDigest};

/// What happened at an instruction count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// An input applied to the machine at this instruction count.
    Event(Event),
    /// The machine's state digest here, for replay to compare against.
    StateHash(StateDigest),
    /// The end of a group of entries that must be consumed together: the
    /// log holds every input up to this instruction count, so a backup may
    /// run this far and go live here.
    GoLive,
    /// The recording ended here (the guest powered off with this status,
    /// or the recorder stopped: `None`).
    End(Option<u32>),
    /// The recording ended here, and the VM goes on from this point
    /// elsewhere: a planned handover to the backup, which goes live here
    /// (the log holds every input up to this point, as at a go-live point).
    HandOver,
    /// An entry for the log's user, opaque here: a change made on the
    /// recording side that the follower must make too (VMware FT §3.3's
    /// control entries: a pair's settings). Replay hands it up; it does
    /// not touch the machine.
    Control(Vec<u8>),
}

/// An entry and the instruction count where it takes effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub icount: u64,
    pub entry: Entry,
}

const CONSOLE: u8 = 1;
const CLOCK_RATE: u8 = 2;
const CLOCK_ADVANCE: u8 = 3;
const DISK_DONE: u8 = 4;
const NET_RX: u8 = 5;
const ENTROPY: u8 = 6;
const CONSOLE_BREAK: u8 = 7;
const STATE_HASH: u8 = 16;
const GO_LIVE: u8 = 17;
const END: u8 = 18;
const HAND_OVER: u8 = 19;
const CONTROL: u8 = 20;

pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Appends `r`, whose instruction count is `r.icount - prev` past the
/// previous entry's. `r.icount` must not be below `prev`.
pub fn encode(out: &mut Vec<u8>, prev: u64, r: &Record) {
    debug_assert!(r.icount >= prev, "log entries must not go back in time");
    put_varint(out, r.icount - prev);
    match &r.entry {
        Entry::Event(Event::ConsoleInput(b)) => {
            out.push(CONSOLE);
            put_bytes(out, b);
        }
        Entry::Event(Event::ConsoleBreak) => out.push(CONSOLE_BREAK),
        Entry::Event(Event::ClockRate(v)) => {
            out.push(CLOCK_RATE);
            put_varint(out, *v);
        }
        Entry::Event(Event::ClockAdvance(v)) => {
            out.push(CLOCK_ADVANCE);
            put_varint(out, *v);
        }
        Entry::Event(Event::Io { slot, completion }) => match completion {
            IoCompletion::Disk { tag, result } => {
                out.push(DISK_DONE);
                put_varint(out, *slot as u64);
                put_varint(out, *tag as u64);
                out.push(result.status);
                put_bytes(out, &result.data);
            }
            IoCompletion::NetRx { frame } => {
                out.push(NET_RX);
                put_varint(out, *slot as u64);
                put_bytes(out, frame);
            }
            IoCompletion::Entropy { tag, data } => {
                out.push(ENTROPY);
                put_varint(out, *slot as u64);
                put_varint(out, *tag as u64);
                put_bytes(out, data);
            }
        },
        Entry::StateHash(d) => {
            out.push(STATE_HASH);
            for hashes in [&d.harts, &d.parts] {
                put_varint(out, hashes.len() as u64);
                hashes.iter().for_each(|h| out.extend_from_slice(h));
            }
            out.extend_from_slice(&d.ram);
            // Page numbers ascend: each is stored as the step from the last.
            put_varint(out, d.pages.len() as u64);
            let mut last = 0;
            for &(pfn, h) in &d.pages {
                put_varint(out, pfn.wrapping_sub(last));
                out.extend_from_slice(&h.to_le_bytes());
                last = pfn;
            }
        }
        Entry::GoLive => out.push(GO_LIVE),
        Entry::HandOver => out.push(HAND_OVER),
        Entry::Control(payload) => {
            out.push(CONTROL);
            put_bytes(out, payload);
        }
        Entry::End(code) => {
            out.push(END);
            match code {
                Some(c) => {
                    out.push(1);
                    put_varint(out, *c as u64);
                }
                None => out.push(0),
            }
        }
    }
}

/// Why a frame's payload does not decode into entries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("entry cut short")]
    Cut,
    #[error("varint too long")]
    VarintTooLong,
    /// `what` names the field ("virtio slot", "page count", ...).
    #[error("{what} {value} out of range")]
    OutOfRange { what: &'static str, value: u64 },
    #[error("a {len}-byte field with {left} bytes left")]
    FieldTooLong { len: u64, left: u64 },
    #[error("instruction count overflows")]
    IcountOverflow,
    #[error("bad end flag {0}")]
    EndFlag(u8),
    #[error("unknown entry kind {0}")]
    Kind(u8),
}

/// Reads entries out of one frame's payload.
pub struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Decoder<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Decoder { buf, pos: 0 }
    }

    pub fn at_end(&self) -> bool {
        self.pos >= self.buf.len()
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    fn byte(&mut self) -> Result<u8, DecodeError> {
        let b = *self.buf.get(self.pos).ok_or(DecodeError::Cut)?;
        self.pos += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                if shift == 63 && b > 1 {
                    break;
                }
                return Ok(v);
            }
        }
        Err(DecodeError::VarintTooLong)
    }

    fn small(&mut self, what: &'static str, max: u64) -> Result<u64, DecodeError> {
        let v = self.varint()?;
        if v > max {
            return Err(DecodeError::OutOfRange { what, value: v });
        }
        Ok(v)
    }

    fn bytes(&mut self) -> Result<Vec<u8>, DecodeError> {
        let n = self.varint()?;
        let left = (self.buf.len() - self.pos) as u64;
        if n > left {
            return Err(DecodeError::FieldTooLong { len: n, left });
        }
        let b = self.buf[self.pos..self.pos + n as usize].to_vec();
        self.pos += n as usize;
        Ok(b)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let b = self.buf.get(self.pos..self.pos + N).ok_or(DecodeError::Cut)?;
        self.pos += N;
        Ok(b.try_into().expect("N bytes"))
    }

    /// A count of at most `max`, then that many 8-byte hashes.
    fn hashes(&mut self, what: &'static str, max: u64) -> Result<Vec<[u8; 8]>, DecodeError> {
        let n = self.small(what, max)?;
        (0..n).map(|_| self.array::<8>()).collect()
    }

    /// The next entry; `prev` is the previous entry's instruction count.
    pub fn next(&mut self, prev: u64) -> Result<Record, DecodeError> {
        let icount = prev.checked_add(self.varint()?).ok_or(DecodeError::IcountOverflow)?;
        let kind = self.byte()?;
        let slot = |d: &mut Self| d.small("virtio slot", 63).map(|v| v as usize);
        let tag = |d: &mut Self| d.small("request tag", u32::MAX as u64).map(|v| v as u32);
        let entry = match kind {
            CONSOLE => Entry::Event(Event::ConsoleInput(self.bytes()?)),
            CONSOLE_BREAK => Entry::Event(Event::ConsoleBreak),
            CLOCK_RATE => Entry::Event(Event::ClockRate(self.varint()?)),
            CLOCK_ADVANCE => Entry::Event(Event::ClockAdvance(self.varint()?)),
            DISK_DONE => {
                let slot = slot(self)?;
                let tag = tag(self)?;
                let status = self.byte()?;
                let data = self.bytes()?;
                Entry::Event(Event::Io {
                    slot,
                    completion: IoCompletion::Disk { tag, result: BlkResult { status, data } },
                })
            }
            NET_RX => {
                let slot = slot(self)?;
                Entry::Event(Event::Io { slot, completion: IoCompletion::NetRx { frame: self.bytes()? } })
            }
            ENTROPY => {
                let slot = slot(self)?;
                let tag = tag(self)?;
                Entry::Event(Event::Io { slot, completion: IoCompletion::Entropy { tag, data: self.bytes()? } })
            }
            STATE_HASH => {
                let harts = self.hashes("harts", 8)?;
                let parts = self.hashes("devices", 64)?;
                let ram = self.array::<8>()?;
                // Each page takes at least 3 bytes: no allocation beyond the input.
                let n = self.small("page count", ((self.buf.len() - self.pos) / 3) as u64)?;
                let mut pages = Vec::with_capacity(n as usize);
                let mut last = 0u64;
                for _ in 0..n {
                    let pfn = last.wrapping_add(self.varint()?);
                    pages.push((pfn, u16::from_le_bytes(self.array::<2>()?)));
                    last = pfn;
                }
                Entry::StateHash(StateDigest { harts, parts, ram, pages })
            }
            GO_LIVE => Entry::GoLive,
            HAND_OVER => Entry::HandOver,
            CONTROL => Entry::Control(self.bytes()?),
            END => match self.byte()? {
                0 => Entry::End(None),
                1 => Entry::End(Some(self.small("exit status", u32::MAX as u64)? as u32)),
                f => return Err(DecodeError::EndFlag(f)),
            },
            k => return Err(DecodeError::Kind(k)),
        };
        Ok(Record { icount, entry })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn samples() -> Vec<Record> {
        let io = |slot, completion| Entry::Event(Event::Io { slot, completion });
        vec![
            Record { icount: 0, entry: Entry::Event(Event::ClockRate(214_748_364)) },
            Record { icount: 5, entry: Entry::Event(Event::ConsoleInput(b"ls\r".to_vec())) },
            Record { icount: 5, entry: Entry::Event(Event::ConsoleBreak) },
            Record { icount: 5, entry: Entry::Event(Event::ClockAdvance(u64::MAX)) },
            Record {
                icount: 1 << 40,
                entry: io(
                    0,
                    IoCompletion::Disk { tag: u32::MAX, result: BlkResult { status: 0, data: vec![7; 4096] } },
                ),
            },
            Record { icount: 1 << 40, entry: io(2, IoCompletion::NetRx { frame: vec![1; 60] }) },
            Record { icount: (1 << 40) + 1, entry: io(63, IoCompletion::Entropy { tag: 9, data: vec![] }) },
            Record {
                icount: u64::MAX - 1,
                entry: Entry::StateHash(StateDigest {
                    harts: vec![[0xab; 8], [1; 8]],
                    parts: vec![[2; 8]; 9],
                    ram: [3; 8],
                    pages: vec![(0x80000, 0xffff), (0x80001, 0), (0xfffff, 0x1234)],
                }),
            },
            Record { icount: u64::MAX - 1, entry: Entry::Control(vec![1, 0xf4, 1, 0, 0]) },
            Record { icount: u64::MAX - 1, entry: Entry::GoLive },
            Record { icount: u64::MAX, entry: Entry::HandOver },
            Record { icount: u64::MAX, entry: Entry::End(Some(7)) },
        ]
    }

    #[test]
    fn every_kind_round_trips() {
        let mut buf = Vec::new();
        let mut prev = 0;
        for r in samples() {
            encode(&mut buf, prev, &r);
            prev = r.icount;
        }
        let mut d = Decoder::new(&buf);
        let mut prev = 0;
        for want in samples() {
            let got = d.next(prev).unwrap();
            assert_eq!(got, want);
            prev = got.icount;
        }
        assert!(d.at_end());
    }

    #[test]
    fn varints() {
        for v in [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            assert_eq!(Decoder::new(&b).varint().unwrap(), v);
        }
        assert_eq!(Decoder::new(&[0xff; 11]).varint(), Err(DecodeError::VarintTooLong));
        assert_eq!(
            Decoder::new(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02]).varint(),
            Err(DecodeError::VarintTooLong)
        );
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mut x: u64 = 88172645463325252;
        for len in 0..2000 {
            let buf: Vec<u8> = (0..len % 64)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let mut d = Decoder::new(&buf);
            let mut prev = 0;
            while !d.at_end() {
                match d.next(prev) {
                    Ok(r) => prev = r.icount,
                    Err(_) => break,
                }
            }
        }
    }
}
