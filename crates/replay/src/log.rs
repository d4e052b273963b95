//! The log stream: a header, then frames.
//!
//! ```text
//! "FTVMLOG\n" | format u32 | header length u32 | header (text) | crc32 u32
//! frame*:  payload length u32 | crc32(payload) u32 | payload (entries)
//! ```
//! Every frame ends with a go-live point ([`Entry::GoLive`]) or the end of
//! the recording ([`Entry::End`], or [`Entry::HandOver`] when the VM goes
//! on elsewhere from there): a frame is the group of entries that
//! must be consumed together. The reader hands out a frame's entries only
//! once the whole frame is there and its checksum matches.
//!
//! A frame whose length has its top bit set ([`WAITING`]) is not part of
//! the recording: it carries received network frames that wait to be
//! delivered at a point the log has not reached (epoch mode holds inputs
//! to the end of their epoch), sent as they arrive so that a backup whose
//! primary dies before that point can give them to its guest as it goes
//! live, rather than lose them with the primary. Its entries are
//! `NetRx` events at instruction 0; the next frame of the recording
//! delivers every one of them, so reading one forgets them.
//!
//! The header is text, one `key value` per line, so a log says plainly
//! which machine and which starting state it belongs to.

use std::collections::VecDeque;
use std::io::{Read, Write};

use crate::codec::{encode, DecodeError, Decoder, Entry, Record};
use crate::waiting::WaitingFrames;
use ftvm_machine::{Event, IoCompletion};

const MAGIC: &[u8; 8] = b"FTVMLOG\n";
/// Bumped whenever the encoding changes; other formats are refused.
/// 3: the header's machine names the RTC's base (`rtc_base_ns=`), and the
/// board has an RTC.
/// 4: frames of received frames waiting for delivery ([`WAITING`]).
/// 5: state digests hashed with XXH3-64 instead of BLAKE3 (same layout,
/// other values: an older log's checks would all fail, so it is refused).
pub const FORMAT_VERSION: u32 = 5;
/// Larger frames are taken as corruption rather than allocated.
pub const MAX_FRAME: u32 = 64 << 20;
/// The bit of a frame's length that marks a frame of received frames
/// waiting for delivery (see the module's doc).
pub const WAITING: u32 = 1 << 31;
const MAX_HEADER: u32 = 1 << 20;

/// What a log belongs to: the machine configuration and starting state,
/// as `key value` lines in the order written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Header {
    pub fields: Vec<(String, String)>,
}

impl Header {
    pub fn set(&mut self, key: &str, value: impl Into<String>) {
        let value = value.into();
        match self.fields.iter_mut().find(|(k, _)| k == key) {
            Some(f) => f.1 = value,
            None => self.fields.push((key.to_string(), value)),
        }
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    fn to_text(&self) -> String {
        let mut s = String::new();
        for (k, v) in &self.fields {
            // Keys are words and values one line: anything else would not
            // read back as written.
            debug_assert!(!k.is_empty() && !k.contains([' ', '\n']) && !v.contains('\n'));
            s += &format!("{k} {v}\n");
        }
        s
    }

    fn from_text(text: &str) -> Result<Header, LogErrorKind> {
        let mut h = Header::default();
        for line in text.lines() {
            let (k, v) = line.split_once(' ').ok_or_else(|| LogErrorKind::HeaderLine(line.to_string()))?;
            h.fields.push((k.to_string(), v.to_string()));
        }
        Ok(h)
    }
}

/// Where reading a log stopped, and why.
#[derive(Debug, thiserror::Error)]
#[error("{kind} at byte {offset} (last go-live point: instruction {icount})")]
pub struct LogError {
    /// Byte offset in the stream of the frame (or header) that failed.
    pub offset: u64,
    /// Instruction count of the last go-live point read before it.
    pub icount: u64,
    #[source]
    pub kind: LogErrorKind,
}

impl LogError {
    /// Whether the log just stops (a recorder or a primary that died, a
    /// file cut short) rather than holding something wrong: everything up
    /// to [`LogError::icount`] is sound either way.
    pub fn is_truncated(&self) -> bool {
        matches!(self.kind, LogErrorKind::NoEnd | LogErrorKind::FrameCut)
    }
}

/// What was wrong with a log, its header or a frame.
#[derive(Debug, thiserror::Error)]
pub enum LogErrorKind {
    #[error("not an ftvm log (too short)")]
    TooShort,
    #[error("not an ftvm log")]
    NotALog,
    #[error("log format {0}, but this ftvm reads format {FORMAT_VERSION}")]
    Version(u32),
    #[error("header of {0} bytes is implausible")]
    HeaderSize(u32),
    /// The stream ends right after the fixed part of the header.
    #[error("ends here")]
    HeaderMissing,
    #[error("cut short")]
    HeaderCut,
    #[error("unreadable: {0}")]
    HeaderUnreadable(#[source] std::io::Error),
    #[error("header checksum mismatch")]
    HeaderChecksum,
    #[error("header is not text")]
    HeaderNotText,
    #[error("header line '{0}' has no value")]
    HeaderLine(String),
    /// The stream ends between frames, without the end entry.
    #[error("the log ends without an end entry (truncated)")]
    NoEnd,
    /// The stream ends inside a frame.
    #[error("the last frame is cut short (truncated)")]
    FrameCut,
    #[error("frame header unreadable: {0}")]
    FrameUnreadable(#[source] std::io::Error),
    #[error("frame of {0} bytes is implausible (corrupt)")]
    FrameSize(u32),
    #[error("frame checksum mismatch (corrupt)")]
    FrameChecksum,
    #[error("undecodable entry: {0}")]
    Entry(#[source] DecodeError),
    #[error("frame does not end at a go-live point (corrupt)")]
    FrameEnd,
    #[error("frame holds a go-live point before its end (corrupt)")]
    GoLiveInside,
    #[error("a frame of received frames waiting holds something else (corrupt)")]
    NotWaiting,
}

/// Writes a log to any byte stream.
pub struct LogWriter<W: Write> {
    out: W,
    frame: Vec<u8>,
    prev: u64,
    written: u64,
}

impl<W: Write> LogWriter<W> {
    pub fn new(mut out: W, header: &Header) -> std::io::Result<Self> {
        let text = header.to_text();
        let mut head = Vec::with_capacity(text.len() + 20);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        head.extend_from_slice(&(text.len() as u32).to_le_bytes());
        head.extend_from_slice(text.as_bytes());
        head.extend_from_slice(&crc32fast::hash(text.as_bytes()).to_le_bytes());
        out.write_all(&head)?;
        Ok(LogWriter { out, frame: Vec::new(), prev: 0, written: head.len() as u64 })
    }

    /// A writer whose stream already holds `written` bytes, its header
    /// among them (see `Recorder::resume`): the frames follow.
    pub fn resume(out: W, written: u64) -> Self {
        LogWriter { out, frame: Vec::new(), prev: 0, written }
    }

    /// Adds an entry to the current frame and returns its encoded size.
    /// Instruction counts never go back; an entry below the previous one is
    /// a caller bug.
    pub fn push(&mut self, r: &Record) -> usize {
        assert!(r.icount >= self.prev, "log entry at {} after one at {}", r.icount, self.prev);
        let before = self.frame.len();
        encode(&mut self.frame, self.prev, r);
        self.prev = r.icount;
        self.frame.len() - before
    }

    /// Ends the current frame with a go-live point at `icount` and sends it.
    pub fn go_live(&mut self, icount: u64) -> std::io::Result<()> {
        self.push(&Record { icount, entry: Entry::GoLive });
        self.send_frame()
    }

    /// Ends the log at `icount`.
    pub fn finish(mut self, icount: u64, status: Option<u32>) -> std::io::Result<W> {
        self.push(&Record { icount, entry: Entry::End(status) });
        self.send_frame()?;
        Ok(self.out)
    }

    /// Ends the log at `icount` with the VM handed over: it goes on there.
    /// Nothing may be pushed after it.
    pub fn hand_over(&mut self, icount: u64) -> std::io::Result<()> {
        self.push(&Record { icount, entry: Entry::HandOver });
        self.send_frame()
    }

    /// The byte stream, for a stream that carries something else after
    /// the header (checkpoint mode). Entries of an unsent frame are dropped.
    pub fn into_sink(self) -> W {
        self.out
    }

    /// Where the log goes.
    pub fn sink(&self) -> &W {
        &self.out
    }

    /// Bytes written so far (header and complete frames).
    pub fn bytes_written(&self) -> u64 {
        self.written
    }

    /// Whether entries wait in the current frame.
    pub fn has_pending(&self) -> bool {
        !self.frame.is_empty()
    }

    /// Sends a frame received on NIC `slot` that waits for delivery at a
    /// point the log has not reached, at once and beside the frame being
    /// filled (see the module's doc). The next frame of the recording must
    /// deliver it.
    pub fn waiting(&mut self, slot: usize, frame: Vec<u8>) -> std::io::Result<()> {
        let mut payload = Vec::with_capacity(frame.len() + 16);
        let ev = Event::Io { slot, completion: IoCompletion::NetRx { frame } };
        encode(&mut payload, 0, &Record { icount: 0, entry: Entry::Event(ev) });
        Self::write_frame(&mut self.out, &payload, WAITING)?;
        self.written += 8 + payload.len() as u64;
        Ok(())
    }

    fn send_frame(&mut self) -> std::io::Result<()> {
        Self::write_frame(&mut self.out, &self.frame, 0)?;
        self.written += 8 + self.frame.len() as u64;
        self.frame.clear();
        Ok(())
    }

    fn write_frame(out: &mut W, payload: &[u8], flags: u32) -> std::io::Result<()> {
        let mut head = [0u8; 8];
        head[..4].copy_from_slice(&(payload.len() as u32 | flags).to_le_bytes());
        head[4..].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
        out.write_all(&head)?;
        out.write_all(payload)?;
        out.flush()
    }
}

/// Reads a log from any byte stream, a whole frame at a time.
pub struct LogReader<R: Read> {
    input: R,
    offset: u64,
    prev: u64,
    last_go_live: u64,
    ready: VecDeque<Record>,
    ended: bool,
    /// Received frames waiting for a point the log has not reached (each
    /// frame of the recording forgets them all).
    waiting: WaitingFrames<()>,
}

impl<R: Read> LogReader<R> {
    /// Reads and checks the header.
    pub fn open(mut input: R) -> Result<(LogReader<R>, Header), LogError> {
        let fail = |offset: u64, kind: LogErrorKind| LogError { offset, icount: 0, kind };
        let mut fixed = [0u8; 16];
        read_exact_or(&mut input, &mut fixed).map_err(|_| fail(0, LogErrorKind::TooShort))?;
        if &fixed[..8] != MAGIC {
            return Err(fail(0, LogErrorKind::NotALog));
        }
        let format = u32::from_le_bytes(fixed[8..12].try_into().unwrap());
        if format != FORMAT_VERSION {
            return Err(fail(8, LogErrorKind::Version(format)));
        }
        let len = u32::from_le_bytes(fixed[12..16].try_into().unwrap());
        if len > MAX_HEADER {
            return Err(fail(12, LogErrorKind::HeaderSize(len)));
        }
        let mut text = vec![0u8; len as usize + 4];
        read_exact_or(&mut input, &mut text).map_err(|e| {
            fail(
                16,
                match e {
                    ReadFailure::Ended => LogErrorKind::HeaderMissing,
                    ReadFailure::Cut => LogErrorKind::HeaderCut,
                    ReadFailure::Io(e) => LogErrorKind::HeaderUnreadable(e),
                },
            )
        })?;
        let crc = u32::from_le_bytes(text[len as usize..].try_into().unwrap());
        text.truncate(len as usize);
        if crc32fast::hash(&text) != crc {
            return Err(fail(16, LogErrorKind::HeaderChecksum));
        }
        let text = String::from_utf8(text).map_err(|_| fail(16, LogErrorKind::HeaderNotText))?;
        let header = Header::from_text(&text).map_err(|kind| fail(16, kind))?;
        let reader = LogReader {
            input,
            offset: 20 + len as u64,
            prev: 0,
            last_go_live: 0,
            ready: VecDeque::new(),
            ended: false,
            waiting: WaitingFrames::default(),
        };
        Ok((reader, header))
    }

    /// The next entry, `Ok(None)` after the end of the recording. A log
    /// that stops without an end entry (a recorder that died, a backup
    /// whose primary died) gives an error naming where the last complete
    /// frame ended; everything before it has been handed out.
    pub fn next_record(&mut self) -> Result<Option<Record>, LogError> {
        loop {
            if let Some(r) = self.ready.pop_front() {
                return Ok(Some(r));
            }
            if self.ended {
                return Ok(None);
            }
            self.read_frame()?;
        }
    }

    /// The byte stream after what was read, for a stream that carries
    /// something else after the header (checkpoint mode). Frames read
    /// but not handed out are dropped.
    pub fn into_input(self) -> R {
        self.input
    }

    /// The byte stream where the next frame starts, for what a stream
    /// carries between the header and the first frame (a streamed
    /// machine); call before reading any record.
    pub fn input_mut(&mut self) -> &mut R {
        debug_assert!(self.ready.is_empty() && !self.ended);
        &mut self.input
    }

    /// Whether every record of the frames read so far was handed out:
    /// the next comes from a frame not read yet.
    pub fn frame_done(&self) -> bool {
        self.ready.is_empty()
    }

    /// Instruction count of the last go-live point handed out.
    pub fn last_go_live(&self) -> u64 {
        self.last_go_live
    }

    /// Bytes of complete frames read so far, header included.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The received frames that wait for a point the frames read so far
    /// have not reached, as (NIC slot, frame), in the order they came:
    /// what a follower that goes live where the log stops gives its
    /// guest, since its primary never delivered them.
    pub fn take_waiting(&mut self) -> Vec<(usize, Vec<u8>)> {
        self.waiting.take()
    }

    fn err(&self, kind: LogErrorKind) -> LogError {
        LogError { offset: self.offset, icount: self.last_go_live, kind }
    }

    fn read_frame(&mut self) -> Result<(), LogError> {
        let mut head = [0u8; 8];
        match read_exact_or(&mut self.input, &mut head) {
            Ok(()) => {}
            Err(ReadFailure::Ended) => return Err(self.err(LogErrorKind::NoEnd)),
            Err(ReadFailure::Cut) => return Err(self.err(LogErrorKind::FrameCut)),
            Err(ReadFailure::Io(e)) => return Err(self.err(LogErrorKind::FrameUnreadable(e))),
        }
        let len = u32::from_le_bytes(head[..4].try_into().unwrap());
        let crc = u32::from_le_bytes(head[4..].try_into().unwrap());
        let waiting = len & WAITING != 0;
        let len = len & !WAITING;
        if len == 0 || len > MAX_FRAME {
            return Err(self.err(LogErrorKind::FrameSize(len)));
        }
        let mut payload = vec![0u8; len as usize];
        read_exact_or(&mut self.input, &mut payload).map_err(|_| self.err(LogErrorKind::FrameCut))?;
        if crc32fast::hash(&payload) != crc {
            return Err(self.err(LogErrorKind::FrameChecksum));
        }
        if waiting {
            return self.read_waiting(&payload);
        }
        let mut d = Decoder::new(&payload);
        let mut prev = self.prev;
        let mut records = Vec::new();
        while !d.at_end() {
            let r = d.next(prev).map_err(|e| self.err(LogErrorKind::Entry(e)))?;
            prev = r.icount;
            records.push(r);
        }
        match records.last().map(|r| &r.entry) {
            Some(Entry::GoLive) => {}
            Some(Entry::End(_) | Entry::HandOver) => self.ended = true,
            _ => return Err(self.err(LogErrorKind::FrameEnd)),
        }
        if records[..records.len() - 1]
            .iter()
            .any(|r| matches!(r.entry, Entry::GoLive | Entry::End(_) | Entry::HandOver))
        {
            return Err(self.err(LogErrorKind::GoLiveInside));
        }
        self.prev = prev;
        self.last_go_live = prev;
        self.offset += 8 + len as u64;
        self.ready.extend(records);
        // This frame delivered every frame that waited before it.
        self.waiting.clear();
        Ok(())
    }

    /// Keeps the received frames of a frame of them (see the module's doc).
    fn read_waiting(&mut self, payload: &[u8]) -> Result<(), LogError> {
        let mut d = Decoder::new(payload);
        while !d.at_end() {
            let r = d.next(0).map_err(|e| self.err(LogErrorKind::Entry(e)))?;
            let Record {
                icount: 0,
                entry: Entry::Event(Event::Io { slot, completion: IoCompletion::NetRx { frame } }),
            } = r
            else {
                return Err(self.err(LogErrorKind::NotWaiting));
            };
            self.waiting.push((), slot, frame);
        }
        self.offset += 8 + payload.len() as u64;
        Ok(())
    }
}

/// Why [`read_exact_or`] did not fill its buffer.
enum ReadFailure {
    /// The input ended before the first byte.
    Ended,
    /// The input ended after some bytes.
    Cut,
    Io(std::io::Error),
}

/// Fills `buf`, telling a clean end of input (nothing read) from a cut.
fn read_exact_or(r: &mut impl Read, buf: &mut [u8]) -> Result<(), ReadFailure> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Err(ReadFailure::Ended),
            Ok(0) => return Err(ReadFailure::Cut),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadFailure::Io(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::waiting::{MAX_BYTES, MAX_FRAMES};
    use ftvm_machine::Event;

    fn header() -> Header {
        let mut h = Header::default();
        h.set("machine", "harts=1 ram=268435456");
        h.set("state", "00ff");
        h
    }

    /// A log of `groups` frames with a few entries each, and the records
    /// written, in order.
    fn sample(groups: u64) -> (Vec<u8>, Vec<Record>) {
        let mut w = LogWriter::new(Vec::new(), &header()).unwrap();
        let mut all = Vec::new();
        for g in 0..groups {
            for i in 0..3 {
                let r =
                    Record { icount: g * 1000 + i * 10, entry: Entry::Event(Event::ConsoleInput(vec![g as u8; 3])) };
                w.push(&r);
                all.push(r);
            }
            w.go_live(g * 1000 + 500).unwrap();
            all.push(Record { icount: g * 1000 + 500, entry: Entry::GoLive });
        }
        let end = groups * 1000;
        all.push(Record { icount: end, entry: Entry::End(Some(0)) });
        (w.finish(end, Some(0)).unwrap(), all)
    }

    fn read_all(bytes: &[u8]) -> (Vec<Record>, Result<(), LogError>) {
        let (mut r, h) = match LogReader::open(bytes) {
            Ok(x) => x,
            Err(e) => return (Vec::new(), Err(e)),
        };
        assert_eq!(h, header());
        let mut out = Vec::new();
        loop {
            match r.next_record() {
                Ok(Some(rec)) => out.push(rec),
                Ok(None) => return (out, Ok(())),
                Err(e) => return (out, Err(e)),
            }
        }
    }

    #[test]
    fn round_trip() {
        let (bytes, all) = sample(5);
        let (got, res) = read_all(&bytes);
        res.unwrap();
        assert_eq!(got, all);
    }

    #[test]
    fn a_cut_log_replays_to_its_last_go_live_point() {
        let (bytes, all) = sample(5);
        let header_len = {
            let (r, _) = LogReader::open(&bytes[..]).unwrap();
            r.offset() as usize
        };
        for cut in header_len..bytes.len() {
            let (got, res) = read_all(&bytes[..cut]);
            let e = res.expect_err("a cut log must report it");
            assert!(e.to_string().contains("truncated"), "cut at {cut}: {e}");
            assert!(e.is_truncated(), "cut at {cut}: {e:?}");
            // Whole groups only, ending at a go-live point.
            assert!(got.is_empty() || got.last().unwrap().entry == Entry::GoLive, "cut at {cut}");
            assert_eq!(got[..], all[..got.len()]);
            assert_eq!(e.icount, got.last().map_or(0, |r| r.icount));
            assert!(e.offset as usize <= cut);
        }
    }

    #[test]
    fn any_flipped_bit_is_caught() {
        let (bytes, all) = sample(3);
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x04;
            let (got, res) = read_all(&b);
            match res {
                Err(e) => assert_eq!(got[..], all[..got.len()], "flip at {i}: {e}"),
                Ok(()) => panic!("flip at byte {i} went unnoticed"),
            }
        }
    }

    fn rx(n: u8) -> (usize, Vec<u8>) {
        (1, vec![n; 60])
    }

    /// Received frames sent beside the recording: not records, and each
    /// frame of the recording forgets those before it; a log cut after
    /// some leaves them to take.
    #[test]
    fn frames_waiting_are_kept_until_the_next_frame_delivers_them() {
        let mut w = LogWriter::new(Vec::new(), &header()).unwrap();
        w.waiting(rx(1).0, rx(1).1).unwrap();
        w.push(&Record { icount: 10, entry: Entry::Event(Event::ConsoleInput(vec![1])) });
        w.waiting(rx(2).0, rx(2).1).unwrap();
        w.go_live(20).unwrap();
        let delivered = w.bytes_written();
        w.waiting(rx(3).0, rx(3).1).unwrap();
        w.waiting(rx(4).0, rx(4).1).unwrap();
        let bytes = w.sink().clone();
        assert_eq!(w.bytes_written(), bytes.len() as u64);
        let (mut r, _) = LogReader::open(&bytes[..]).unwrap();
        assert_eq!(r.next_record().unwrap().unwrap().icount, 10);
        assert_eq!(r.next_record().unwrap().unwrap().entry, Entry::GoLive);
        assert_eq!(r.offset(), delivered);
        assert!(r.next_record().unwrap_err().is_truncated());
        assert_eq!(r.take_waiting(), vec![rx(3), rx(4)]);
        assert_eq!(r.offset(), bytes.len() as u64);
        // With the frame that delivers them, none is left.
        w.push(&Record { icount: 30, entry: Entry::Event(Event::ConsoleInput(vec![2])) });
        let bytes = w.finish(40, None).unwrap();
        let (got, res) = read_all(&bytes);
        res.unwrap();
        assert_eq!(got.len(), 4);
        let (mut r, _) = LogReader::open(&bytes[..]).unwrap();
        while r.next_record().unwrap().is_some() {}
        assert!(r.take_waiting().is_empty());
    }

    /// Past the bounds the oldest waiting frames go, not the log.
    #[test]
    fn frames_waiting_past_the_bounds_drop_the_oldest() {
        let mut w = LogWriter::new(Vec::new(), &header()).unwrap();
        for i in 0..MAX_FRAMES + 2 {
            w.waiting(0, (i as u32).to_le_bytes().to_vec()).unwrap();
        }
        let big = MAX_BYTES / 4 + 1;
        let (mut r, _) = LogReader::open(&w.sink()[..]).unwrap();
        assert!(r.next_record().unwrap_err().is_truncated());
        let kept = r.take_waiting();
        assert_eq!(kept.len(), MAX_FRAMES);
        assert_eq!(kept[0].1, 2u32.to_le_bytes());
        for i in 0..4 {
            w.waiting(1, vec![i; big]).unwrap();
        }
        let (mut r, _) = LogReader::open(&w.sink()[..]).unwrap();
        assert!(r.next_record().unwrap_err().is_truncated());
        let kept = r.take_waiting();
        assert_eq!(kept.len(), 3, "four of a quarter of the bytes each are one too many");
        assert_eq!(kept[0].1[0], 1);
    }

    /// A frame marked waiting must hold received frames only.
    #[test]
    fn a_waiting_frame_of_anything_else_is_refused() {
        let mut w = LogWriter::new(Vec::new(), &header()).unwrap();
        let mut payload = Vec::new();
        encode(&mut payload, 0, &Record { icount: 0, entry: Entry::Event(Event::ConsoleInput(vec![1])) });
        LogWriter::write_frame(&mut w.out, &payload, WAITING).unwrap();
        let (_, res) = read_all(w.sink());
        assert!(matches!(res.unwrap_err().kind, LogErrorKind::NotWaiting));
    }

    #[test]
    fn foreign_input_is_refused() {
        let kind = |bytes: &[u8]| LogReader::open(bytes).err().unwrap().kind;
        assert!(matches!(kind(b"hello"), LogErrorKind::TooShort));
        assert!(kind(b"hello").to_string().contains("not an ftvm log"));
        assert!(matches!(kind(b"FTVMSNAP........"), LogErrorKind::NotALog));
        assert!(kind(b"FTVMSNAP........").to_string().contains("not an ftvm log"));
        let (mut bytes, _) = sample(1);
        bytes[8] = 1;
        assert!(matches!(kind(&bytes), LogErrorKind::Version(1)));
        assert!(kind(&bytes).to_string().contains("log format 1"));
    }
}
