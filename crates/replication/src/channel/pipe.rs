//! The bounded byte buffer at each end of the channel: the primary's VM
//! writes into it and its sender thread drains it to the socket; the
//! backup's receiving thread fills it and the replaying VM reads it. A
//! full pipe stalls its writer, an empty one its reader: that is how a
//! slow backup slows the primary (VMware FT §3.2).

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// A byte buffer with a bound, shared by a producer and a consumer thread.
pub(super) struct Pipe {
    state: Mutex<PipeState>,
    readable: Condvar,
    writable: Condvar,
    /// Signalled when the reader has taken everything and waits for more,
    /// or reads no more (see [`Pipe::wait_consumed`]).
    consumed: Condvar,
    capacity: usize,
}

struct PipeState {
    bytes: VecDeque<u8>,
    /// No more bytes will come (the channel is over): readers drain, then
    /// see the end; writers drop what they write.
    closed: bool,
    /// The reader took every byte there was and waits for more.
    starved: bool,
    /// The reader takes no more: it reached what it was reading for.
    reader_done: bool,
    /// The bytes there were announced (the reader was woken for them, or
    /// for room); until then a writer is still batching them.
    announced: bool,
}

impl Pipe {
    pub(super) fn new(capacity: usize) -> Pipe {
        Pipe {
            state: Mutex::new(PipeState {
                bytes: VecDeque::new(),
                closed: false,
                starved: false,
                reader_done: false,
                announced: false,
            }),
            readable: Condvar::new(),
            writable: Condvar::new(),
            consumed: Condvar::new(),
            capacity,
        }
    }

    /// Appends all of `data`, waiting for room; the reader is woken only
    /// if `wake` (or to make room). False if closed.
    pub(super) fn put(&self, mut data: &[u8], wake: bool) -> bool {
        let mut s = self.state.lock().unwrap();
        while !data.is_empty() {
            if s.closed {
                return false;
            }
            let room = self.capacity.saturating_sub(s.bytes.len());
            if room == 0 {
                s.announced = true;
                self.readable.notify_all();
                s = self.writable.wait(s).unwrap();
                continue;
            }
            let n = room.min(data.len());
            s.bytes.extend(&data[..n]);
            data = &data[n..];
        }
        if wake {
            s.announced = true;
            self.readable.notify_all();
        }
        true
    }

    /// Appends as much of `data` as fits within `wait`: how many bytes
    /// (all unless the pipe stayed full), None if closed.
    pub(super) fn put_for(&self, mut data: &[u8], wait: Duration) -> Option<usize> {
        let deadline = std::time::Instant::now() + wait;
        let mut put = 0;
        let mut s = self.state.lock().unwrap();
        while !data.is_empty() {
            if s.closed {
                return None;
            }
            let room = self.capacity.saturating_sub(s.bytes.len());
            if room == 0 {
                s.announced = true;
                self.readable.notify_all();
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                s = self.writable.wait_timeout(s, left).unwrap().0;
                continue;
            }
            let n = room.min(data.len());
            s.bytes.extend(&data[..n]);
            data = &data[n..];
            put += n;
        }
        Some(put)
    }

    /// Wakes the reader for what is there.
    pub(super) fn wake_reader(&self) {
        let mut s = self.state.lock().unwrap();
        s.announced = true;
        self.readable.notify_all();
    }

    /// Takes up to `max` bytes, waiting for some; empty once closed and drained.
    pub(super) fn take(&self, max: usize) -> Vec<u8> {
        let mut s = self.wait_for_bytes();
        self.drain(&mut s, max)
    }

    /// Waits until the reader has taken every byte and waits for more
    /// (true), or has said it reads no more (false).
    pub(super) fn wait_consumed(&self) -> bool {
        let s = self.state.lock().unwrap();
        let s = self.consumed.wait_while(s, |s| !(s.reader_done || s.starved && s.bytes.is_empty())).unwrap();
        !s.reader_done
    }

    /// The reader takes no more.
    pub(super) fn reader_done(&self) {
        self.state.lock().unwrap().reader_done = true;
        self.consumed.notify_all();
    }

    /// Takes up to `max` bytes without waiting.
    pub(super) fn try_take(&self, max: usize) -> Vec<u8> {
        self.drain(&mut self.state.lock().unwrap(), max)
    }

    /// Waits up to `wait` for bytes to take: Some(true) if there are,
    /// Some(false) if none came in time, None once closed and drained.
    ///
    /// Only bytes announced (put with a wake, or [`Pipe::wake_reader`])
    /// count: bytes put without a wake (a writer batching) stay put when
    /// the wait runs out, as they would for a reader asleep in
    /// [`Pipe::take`].
    pub(super) fn wait_readable_for(&self, wait: Duration) -> Option<bool> {
        let ready = |s: &PipeState| s.closed || (s.announced && !s.bytes.is_empty());
        let mut s = self.state.lock().unwrap();
        if !ready(&s) {
            s.starved = s.bytes.is_empty();
            self.consumed.notify_all();
            s = self.readable.wait_timeout_while(s, wait, |s| !ready(s)).unwrap().0;
            s.starved = false;
        }
        match (s.bytes.is_empty(), s.closed) {
            (true, true) => None,
            (false, _) if s.announced || s.closed => Some(true),
            _ => Some(false),
        }
    }

    /// Waits while the pipe is empty and open, starved meanwhile.
    fn wait_for_bytes(&self) -> std::sync::MutexGuard<'_, PipeState> {
        let mut s = self.state.lock().unwrap();
        while s.bytes.is_empty() && !s.closed {
            s.starved = true;
            self.consumed.notify_all();
            s = self.readable.wait(s).unwrap();
        }
        s.starved = false;
        s
    }

    fn drain(&self, s: &mut PipeState, max: usize) -> Vec<u8> {
        let n = max.min(s.bytes.len());
        let out: Vec<u8> = s.bytes.drain(..n).collect();
        if s.bytes.is_empty() {
            s.announced = false;
        }
        if n > 0 {
            self.writable.notify_all();
        }
        out
    }

    /// Free room, waiting up to `wait` for some.
    pub(super) fn room(&self, wait: Duration) -> usize {
        let s = self.state.lock().unwrap();
        let (s, _) =
            self.writable.wait_timeout_while(s, wait, |s| s.bytes.len() >= self.capacity && !s.closed).unwrap();
        self.capacity.saturating_sub(s.bytes.len())
    }

    /// Free room now.
    pub(super) fn free(&self) -> usize {
        self.capacity.saturating_sub(self.len())
    }

    pub(super) fn close(&self) {
        self.state.lock().unwrap().closed = true;
        self.readable.notify_all();
        self.writable.notify_all();
    }

    pub(super) fn len(&self) -> usize {
        self.state.lock().unwrap().bytes.len()
    }

    pub(super) fn is_closed(&self) -> bool {
        self.state.lock().unwrap().closed
    }
}
