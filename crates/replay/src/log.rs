//! The log stream: a header, then frames.
//!
//! ```text
//! "FTVMLOG\n" | format u32 | header length u32 | header (text) | crc32 u32
//! frame*:  payload length u32 | crc32(payload) u32 | payload (entries)
//! ```
//! Every frame ends with a go-live point ([`Entry::GoLive`]) or the end of
//! the recording ([`Entry::End`]): a frame is the group of entries that
//! must be consumed together. The reader hands out a frame's entries only
//! once the whole frame is there and its checksum matches.
//!
//! The header is text, one `key value` per line, so a log says plainly
//! which machine and which starting state it belongs to.

use std::collections::VecDeque;
use std::io::{Read, Write};

use crate::codec::{encode, Decoder, Entry, Record};

const MAGIC: &[u8; 8] = b"FTVMLOG\n";
/// Bumped whenever the encoding changes; other formats are refused.
pub const FORMAT_VERSION: u32 = 2;
/// Larger frames are taken as corruption rather than allocated.
pub const MAX_FRAME: u32 = 64 << 20;
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

    fn from_text(text: &str) -> Result<Header, String> {
        let mut h = Header::default();
        for line in text.lines() {
            let (k, v) = line.split_once(' ').ok_or_else(|| format!("header line '{line}' has no value"))?;
            h.fields.push((k.to_string(), v.to_string()));
        }
        Ok(h)
    }
}

/// Where reading a log stopped, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogError {
    /// Byte offset in the stream of the frame (or header) that failed.
    pub offset: u64,
    /// Instruction count of the last go-live point read before it.
    pub icount: u64,
    pub message: String,
}

impl std::fmt::Display for LogError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at byte {} (last go-live point: instruction {})", self.message, self.offset, self.icount)
    }
}

impl std::error::Error for LogError {}

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

    fn send_frame(&mut self) -> std::io::Result<()> {
        let len = self.frame.len() as u32;
        let mut head = [0u8; 8];
        head[..4].copy_from_slice(&len.to_le_bytes());
        head[4..].copy_from_slice(&crc32fast::hash(&self.frame).to_le_bytes());
        self.out.write_all(&head)?;
        self.out.write_all(&self.frame)?;
        self.out.flush()?;
        self.written += 8 + self.frame.len() as u64;
        self.frame.clear();
        Ok(())
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
}

impl<R: Read> LogReader<R> {
    /// Reads and checks the header.
    pub fn open(mut input: R) -> Result<(LogReader<R>, Header), LogError> {
        let fail = |offset: u64, message: String| LogError { offset, icount: 0, message };
        let mut fixed = [0u8; 16];
        read_exact_or(&mut input, &mut fixed).map_err(|_| fail(0, "not an ftvm log (too short)".into()))?;
        if &fixed[..8] != MAGIC {
            return Err(fail(0, "not an ftvm log".into()));
        }
        let format = u32::from_le_bytes(fixed[8..12].try_into().unwrap());
        if format != FORMAT_VERSION {
            return Err(fail(8, format!("log format {format}, but this ftvm reads format {FORMAT_VERSION}")));
        }
        let len = u32::from_le_bytes(fixed[12..16].try_into().unwrap());
        if len > MAX_HEADER {
            return Err(fail(12, format!("header of {len} bytes is implausible")));
        }
        let mut text = vec![0u8; len as usize + 4];
        read_exact_or(&mut input, &mut text).map_err(|m| fail(16, m))?;
        let crc = u32::from_le_bytes(text[len as usize..].try_into().unwrap());
        text.truncate(len as usize);
        if crc32fast::hash(&text) != crc {
            return Err(fail(16, "header checksum mismatch".into()));
        }
        let text = String::from_utf8(text).map_err(|_| fail(16, "header is not text".into()))?;
        let header = Header::from_text(&text).map_err(|m| fail(16, m))?;
        let reader = LogReader {
            input,
            offset: 20 + len as u64,
            prev: 0,
            last_go_live: 0,
            ready: VecDeque::new(),
            ended: false,
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

    fn err(&self, message: impl Into<String>) -> LogError {
        LogError { offset: self.offset, icount: self.last_go_live, message: message.into() }
    }

    fn read_frame(&mut self) -> Result<(), LogError> {
        let mut head = [0u8; 8];
        match read_exact_or(&mut self.input, &mut head) {
            Ok(()) => {}
            Err(m) if m == EOF_AT_START => return Err(self.err("the log ends without an end entry (truncated)")),
            Err(m) if m == "cut short" => return Err(self.err("the last frame is cut short (truncated)")),
            Err(m) => return Err(self.err(format!("frame header {m}"))),
        }
        let len = u32::from_le_bytes(head[..4].try_into().unwrap());
        let crc = u32::from_le_bytes(head[4..].try_into().unwrap());
        if len == 0 || len > MAX_FRAME {
            return Err(self.err(format!("frame of {len} bytes is implausible (corrupt)")));
        }
        let mut payload = vec![0u8; len as usize];
        read_exact_or(&mut self.input, &mut payload)
            .map_err(|_| self.err("the last frame is cut short (truncated)"))?;
        if crc32fast::hash(&payload) != crc {
            return Err(self.err("frame checksum mismatch (corrupt)"));
        }
        let mut d = Decoder::new(&payload);
        let mut prev = self.prev;
        let mut records = Vec::new();
        while !d.at_end() {
            let r = d.next(prev).map_err(|m| self.err(format!("undecodable entry: {m}")))?;
            prev = r.icount;
            records.push(r);
        }
        match records.last().map(|r| &r.entry) {
            Some(Entry::GoLive) => {}
            Some(Entry::End(_)) => self.ended = true,
            _ => return Err(self.err("frame does not end at a go-live point (corrupt)")),
        }
        if records[..records.len() - 1].iter().any(|r| matches!(r.entry, Entry::GoLive | Entry::End(_))) {
            return Err(self.err("frame holds a go-live point before its end (corrupt)"));
        }
        self.prev = prev;
        self.last_go_live = prev;
        self.offset += 8 + len as u64;
        self.ready.extend(records);
        Ok(())
    }
}

const EOF_AT_START: &str = "ends here";

/// Fills `buf`, telling a clean end of input (nothing read) from a cut.
fn read_exact_or(r: &mut impl Read, buf: &mut [u8]) -> Result<(), String> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Err(EOF_AT_START.into()),
            Ok(0) => return Err("cut short".into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("unreadable: {e}")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
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
            assert!(e.message.contains("truncated"), "cut at {cut}: {e}");
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

    #[test]
    fn foreign_input_is_refused() {
        assert!(LogReader::open(&b"hello"[..]).err().unwrap().message.contains("not an ftvm log"));
        assert!(LogReader::open(&b"FTVMSNAP........"[..]).err().unwrap().message.contains("not an ftvm log"));
        let (mut bytes, _) = sample(1);
        bytes[8] = 1;
        assert!(LogReader::open(&bytes[..]).err().unwrap().message.contains("log format 1"));
    }
}
