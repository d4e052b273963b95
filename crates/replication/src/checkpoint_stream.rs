//! The checkpoint stream of checkpoint mode (Remus, ../../../shared/seeds/remus.txt
//! §2.2, §2.5): what the primary sends the backup after the header, over
//! the same channel the replay log uses. It knows nothing of the machine:
//! a checkpoint's state and pages are opaque bytes here.
//!
//! ```text
//! record: kind u8 | payload length u32 | crc32(payload) u32 | payload
//! kind 1, a disk write made since the last checkpoint:
//!          slot u32 | offset u64 | data
//! kind 2, checkpoint `number` (the first is 0):
//!          number u64 | icount u64 | state length u32 | state | pages
//! kind 3, the VM ended:   has status u8 | status u32
//! kind 4, pages of checkpoint `number`, ahead of it:
//!          number u64 | pages
//! kind 5, a block of a disk as it was when protection started, before
//!          the first checkpoint (the backup's copy made the same):
//!          slot u32 | offset u64 | data
//! kind 6, nothing: the primary is alive while its machine is busy
//!          (the first checkpoint's scan of all of RAM, say)
//! kind 7, handed over: the VM goes on from the last checkpoint on the
//!          backup (nothing follows)
//! kind 8, a control entry (VMware FT §3.3): a change made on the
//!          primary that the backup makes too when it reads it; opaque
//!          here (the pair's settings are the caller's)
//! kind 9, a frame the guest received on NIC `slot` while it ran toward
//!          checkpoint `number`, sent as it arrived:
//!          number u64 | slot u32 | frame
//! kind 10, the last TCP segment of a connection among the frames the
//!          guest sent while it ran toward checkpoint `number` (ahead
//!          of it): number u64 | slot u32 | frame
//! ```
//!
//! Kinds 9 and 10 are what a backup that goes live from checkpoint c
//! gives the network that its primary took with it: the frames received
//! after c, which the guest resumed at c never had (the network may
//! deliver a frame late), and the last segment of each connection the
//! guest sent up to c, which the primary may have died holding or
//! releasing into its dead port (a segment may arrive twice). Without
//! them the client and the guest each wait for their retransmission
//! timers.
//!
//! A large checkpoint (the first carries all of RAM) goes as several page
//! records and then the checkpoint: compressing it whole would keep the
//! channel silent long enough to look like a failure, and hold it all
//! in memory twice more.
//!
//! Stream order is checkpoint order: the disk writes between checkpoints
//! k - 1 and k were issued while the guest ran toward k, so the backup
//! applies them when k commits and drops them if k never arrives whole.
//! (Remus calls that stretch of the guest's run an epoch; here the word
//! is kept for Bressoud & Schneider's, and a checkpoint has a number.) A checkpoint is whole when its record
//! is: the reader hands out only complete records whose checksum matches.

use std::io::{ErrorKind, Read, Write};

const DISK_WRITE: u8 = 1;
const CHECKPOINT: u8 = 2;
const END: u8 = 3;
const PAGES: u8 = 4;
const DISK_SYNC: u8 = 5;
const KEEP_ALIVE: u8 = 6;
const HAND_OVER: u8 = 7;
const CONTROL: u8 = 8;
const RECEIVED: u8 = 9;
const SENT: u8 = 10;
/// Larger records are taken as corruption rather than allocated (a full
/// first checkpoint of a large guest is the largest thing sent).
pub const MAX_RECORD: u32 = 1 << 31;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    DiskWrite {
        slot: u32,
        offset: u64,
        data: Vec<u8>,
    },
    Checkpoint {
        number: u64,
        icount: u64,
        state: Vec<u8>,
        pages: Vec<u8>,
    },
    End {
        status: Option<u32>,
    },
    Pages {
        number: u64,
        pages: Vec<u8>,
    },
    DiskSync {
        slot: u32,
        offset: u64,
        data: Vec<u8>,
    },
    KeepAlive,
    /// The stream ends and the VM goes on from the last checkpoint on the
    /// backup: a planned handover (the primary stopped its guest and sent
    /// a last checkpoint just before).
    HandOver,
    /// A change the backup makes too (see the module's table).
    Control(Vec<u8>),
    /// A frame received while the guest ran toward checkpoint `number`.
    Received {
        number: u64,
        slot: u32,
        frame: Vec<u8>,
    },
    /// A connection's last segment sent toward checkpoint `number`.
    Sent {
        number: u64,
        slot: u32,
        frame: Vec<u8>,
    },
}

/// Appends a record's bytes to `out` (one buffer, one write: the channel
/// counts what an output waits for in whole records).
pub fn encode(out: &mut Vec<u8>, r: &Record) {
    let start = out.len();
    out.extend_from_slice(&[0u8; 9]);
    let kind = match r {
        Record::DiskWrite { slot, offset, data } => {
            out.extend_from_slice(&slot.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            out.extend_from_slice(data);
            DISK_WRITE
        }
        Record::Checkpoint { number, icount, state, pages } => {
            out.extend_from_slice(&number.to_le_bytes());
            out.extend_from_slice(&icount.to_le_bytes());
            out.extend_from_slice(&(state.len() as u32).to_le_bytes());
            out.extend_from_slice(state);
            out.extend_from_slice(pages);
            CHECKPOINT
        }
        Record::End { status } => {
            out.push(status.is_some() as u8);
            out.extend_from_slice(&status.unwrap_or(0).to_le_bytes());
            END
        }
        Record::Pages { number, pages } => {
            out.extend_from_slice(&number.to_le_bytes());
            out.extend_from_slice(pages);
            PAGES
        }
        Record::DiskSync { slot, offset, data } => {
            out.extend_from_slice(&slot.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            out.extend_from_slice(data);
            DISK_SYNC
        }
        Record::KeepAlive => KEEP_ALIVE,
        Record::HandOver => HAND_OVER,
        Record::Control(payload) => {
            out.extend_from_slice(payload);
            CONTROL
        }
        Record::Received { number, slot, frame } | Record::Sent { number, slot, frame } => {
            out.extend_from_slice(&number.to_le_bytes());
            out.extend_from_slice(&slot.to_le_bytes());
            out.extend_from_slice(frame);
            if matches!(r, Record::Received { .. }) {
                RECEIVED
            } else {
                SENT
            }
        }
    };
    let payload_len = (out.len() - start - 9) as u32;
    let crc = crc32fast::hash(&out[start + 9..]);
    out[start] = kind;
    out[start + 1..start + 5].copy_from_slice(&payload_len.to_le_bytes());
    out[start + 5..start + 9].copy_from_slice(&crc.to_le_bytes());
}

/// Writes one record.
pub fn write(out: &mut impl Write, r: &Record) -> std::io::Result<()> {
    let mut buf = Vec::new();
    encode(&mut buf, r);
    out.write_all(&buf)
}

/// How reading stopped short of a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// The stream ended (cleanly between records, or inside one: an
    /// incomplete record is discarded).
    #[error("the stream was cut")]
    Cut,
    /// The bytes are not a checkpoint stream: the record that starts at
    /// byte `offset` is not one.
    #[error("checkpoint stream at byte {offset}: {problem}")]
    Corrupt {
        offset: u64,
        #[source]
        problem: Corruption,
    },
}

/// What is wrong with a record that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Corruption {
    /// Its length is past [`MAX_RECORD`].
    #[error("a record of {len} bytes")]
    TooLong { len: u32 },
    /// Its payload does not have the checksum its head gives.
    #[error("record checksum mismatch")]
    Checksum { head: u32, payload: u32 },
    /// A checkpoint whose state is longer than its record.
    #[error("checkpoint state of {state_len} bytes in a record of {payload_len}")]
    StateTooLong { state_len: usize, payload_len: usize },
    /// A known kind of record whose payload has a length it cannot have.
    #[error("record of kind {kind} has {payload_len} bytes")]
    Length { kind: u8, payload_len: usize },
    /// A kind of record nobody knows.
    #[error("unknown record kind {kind}")]
    UnknownKind { kind: u8 },
}

/// Reads records from a byte stream.
pub struct Reader<R: Read> {
    input: R,
    /// Bytes of complete records read.
    offset: u64,
}

impl<R: Read> Reader<R> {
    pub fn new(input: R) -> Reader<R> {
        Reader { input, offset: 0 }
    }

    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The next complete record.
    pub fn next_record(&mut self) -> Result<Record, ReadError> {
        let mut head = [0u8; 9];
        self.fill(&mut head)?;
        let kind = head[0];
        let len = u32::from_le_bytes(head[1..5].try_into().unwrap());
        let crc = u32::from_le_bytes(head[5..9].try_into().unwrap());
        if len > MAX_RECORD {
            return Err(self.corrupt(Corruption::TooLong { len }));
        }
        let payload = self.payload(len as usize)?;
        let actual = crc32fast::hash(&payload);
        if actual != crc {
            return Err(self.corrupt(Corruption::Checksum { head: crc, payload: actual }));
        }
        let record = parse(kind, payload).map_err(|problem| self.corrupt(problem))?;
        self.offset += 9 + len as u64;
        Ok(record)
    }

    fn corrupt(&self, problem: Corruption) -> ReadError {
        ReadError::Corrupt { offset: self.offset, problem }
    }

    /// A payload of `len` bytes. The buffer grows with what arrives (as
    /// `read_to_end` grows it): a head that declares more than comes
    /// (corrupt, or cut short) costs no more memory than what came.
    fn payload(&mut self, len: usize) -> Result<Vec<u8>, ReadError> {
        let mut payload = Vec::new();
        match (&mut self.input).take(len as u64).read_to_end(&mut payload) {
            Ok(n) if n == len => Ok(payload),
            _ => Err(ReadError::Cut),
        }
    }

    fn fill(&mut self, buf: &mut [u8]) -> Result<(), ReadError> {
        let mut got = 0;
        while got < buf.len() {
            match self.input.read(&mut buf[got..]) {
                Ok(0) => return Err(ReadError::Cut),
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Err(ReadError::Cut),
            }
        }
        Ok(())
    }
}

fn parse(kind: u8, mut p: Vec<u8>) -> Result<Record, Corruption> {
    let u32_at = |p: &[u8], at: usize| u32::from_le_bytes(p[at..at + 4].try_into().unwrap());
    let u64_at = |p: &[u8], at: usize| u64::from_le_bytes(p[at..at + 8].try_into().unwrap());
    match kind {
        DISK_WRITE if p.len() >= 12 => {
            let (slot, offset) = (u32_at(&p, 0), u64_at(&p, 4));
            Ok(Record::DiskWrite { slot, offset, data: p.split_off(12) })
        }
        CHECKPOINT if p.len() >= 20 => {
            let (number, icount, state_len) = (u64_at(&p, 0), u64_at(&p, 8), u32_at(&p, 16) as usize);
            if state_len > p.len() - 20 {
                return Err(Corruption::StateTooLong { state_len, payload_len: p.len() });
            }
            let pages = p.split_off(20 + state_len);
            Ok(Record::Checkpoint { number, icount, state: p.split_off(20), pages })
        }
        END if p.len() == 5 => Ok(Record::End { status: (p[0] != 0).then(|| u32_at(&p, 1)) }),
        PAGES if p.len() >= 8 => Ok(Record::Pages { number: u64_at(&p, 0), pages: p.split_off(8) }),
        DISK_SYNC if p.len() >= 12 => {
            let (slot, offset) = (u32_at(&p, 0), u64_at(&p, 4));
            Ok(Record::DiskSync { slot, offset, data: p.split_off(12) })
        }
        KEEP_ALIVE if p.is_empty() => Ok(Record::KeepAlive),
        HAND_OVER if p.is_empty() => Ok(Record::HandOver),
        CONTROL => Ok(Record::Control(p)),
        RECEIVED | SENT if p.len() >= 12 => {
            let (number, slot, frame) = (u64_at(&p, 0), u32_at(&p, 8), p.split_off(12));
            Ok(if kind == RECEIVED {
                Record::Received { number, slot, frame }
            } else {
                Record::Sent { number, slot, frame }
            })
        }
        DISK_WRITE | CHECKPOINT | END | PAGES | DISK_SYNC | KEEP_ALIVE | HAND_OVER | RECEIVED | SENT => {
            Err(Corruption::Length { kind, payload_len: p.len() })
        }
        _ => Err(Corruption::UnknownKind { kind }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Record> {
        vec![
            Record::DiskWrite { slot: 1, offset: 4096 * 7, data: vec![0xab; 1024] },
            Record::Checkpoint { number: 3, icount: 123_456_789, state: b"state".to_vec(), pages: vec![9; 100] },
            Record::Checkpoint { number: 4, icount: 123_456_790, state: Vec::new(), pages: Vec::new() },
            Record::End { status: Some(3) },
            Record::End { status: None },
            Record::Pages { number: 5, pages: vec![1, 2, 3] },
            Record::DiskSync { slot: 2, offset: 1 << 20, data: vec![0xcd; 4096] },
            Record::KeepAlive,
            Record::HandOver,
            Record::Control(vec![1, 2, 3, 4, 5]),
            Record::Received { number: 6, slot: 1, frame: vec![7; 60] },
            Record::Sent { number: 6, slot: 0, frame: vec![8; 1514] },
        ]
    }

    #[test]
    fn records_read_back_as_written() {
        let mut buf = Vec::new();
        for r in samples() {
            write(&mut buf, &r).unwrap();
        }
        let mut reader = Reader::new(&buf[..]);
        for r in samples() {
            assert_eq!(reader.next_record().unwrap(), r);
        }
        assert_eq!(reader.offset(), buf.len() as u64);
        assert_eq!(reader.next_record(), Err(ReadError::Cut));
    }

    #[test]
    fn a_record_cut_anywhere_is_not_handed_out() {
        let mut buf = Vec::new();
        let all = samples();
        write(&mut buf, &all[0]).unwrap();
        let first = buf.len();
        write(&mut buf, &all[1]).unwrap();
        for cut in first..buf.len() {
            let mut reader = Reader::new(&buf[..cut]);
            assert_eq!(reader.next_record().unwrap(), all[0]);
            assert_eq!(reader.next_record(), Err(ReadError::Cut), "cut at {cut}");
            assert_eq!(reader.offset(), first as u64);
        }
    }

    /// A head that declares the largest record, then a few bytes: the
    /// stream is cut, and the reader never asked for much more than came
    /// (it allocated the 2 GiB declared up front, found by the
    /// checkpoint_stream fuzz target as an out-of-memory).
    #[test]
    fn a_declared_length_is_not_allocated_before_it_comes() {
        struct Widest<'a>(&'a [u8], usize);
        impl Read for Widest<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                self.1 = self.1.max(buf.len());
                self.0.read(buf)
            }
        }
        let mut stream = vec![CHECKPOINT];
        stream.extend_from_slice(&MAX_RECORD.to_le_bytes());
        stream.extend_from_slice(&[0; 4]);
        stream.extend_from_slice(&[1; 100]);
        let mut input = Widest(&stream, 0);
        assert_eq!(Reader::new(&mut input).next_record(), Err(ReadError::Cut));
        assert!(input.1 <= 64 << 10, "a read of {} bytes", input.1);
        // A record of several MiB reads as written.
        let big = Record::DiskWrite { slot: 3, offset: 1 << 30, data: (0..(3 << 20) + 5).map(|i| i as u8).collect() };
        let mut buf = Vec::new();
        write(&mut buf, &big).unwrap();
        assert_eq!(Reader::new(&buf[..]).next_record(), Ok(big));
    }

    #[test]
    fn corruption_is_found_not_trusted() {
        let mut buf = Vec::new();
        write(&mut buf, &samples()[1]).unwrap();
        for i in 0..buf.len() {
            let mut bad = buf.clone();
            bad[i] ^= 0x40;
            match Reader::new(&bad[..]).next_record() {
                Err(ReadError::Corrupt { .. }) | Err(ReadError::Cut) => {}
                Ok(r) => panic!("byte {i} flipped, yet read {r:?}"),
            }
        }
        // A record of a kind nobody knows, with a good checksum.
        let mut odd = vec![11u8, 1, 0, 0, 0];
        odd.extend_from_slice(&crc32fast::hash(&[0]).to_le_bytes());
        odd.push(0);
        let odd = Reader::new(&odd[..]).next_record().unwrap_err();
        assert_eq!(odd, ReadError::Corrupt { offset: 0, problem: Corruption::UnknownKind { kind: 11 } });
        assert_eq!(odd.to_string(), "checkpoint stream at byte 0: unknown record kind 11");
        // A state longer than its record.
        let mut payload = vec![0u8; 20];
        payload[16..20].copy_from_slice(&100u32.to_le_bytes());
        let mut lying = vec![CHECKPOINT];
        lying.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        lying.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        lying.extend_from_slice(&payload);
        assert!(matches!(
            Reader::new(&lying[..]).next_record(),
            Err(ReadError::Corrupt { problem: Corruption::StateTooLong { state_len: 100, payload_len: 20 }, .. })
        ));
    }
}
