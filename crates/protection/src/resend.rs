//! The frames a backup sends again when it goes live (issue 31 item 2):
//! for each TCP connection, the last segment the guest sent that carried
//! data or a FIN, if its replay made it (or, in checkpoint mode, a
//! committed checkpoint's guest sent it) in the last moments before the
//! primary failed.
//!
//! Why: a host that fails without a FIN often dies with a reply just
//! released into its dead switch port, or held by the Output Rule. The
//! backup's guest, replaying, made the same reply and took it for sent;
//! its TCP resends it only when its retransmission timer fires, at least
//! 200 ms (Linux's minimum) after it first sent it, while the client,
//! with nothing more to send, waits. Sending that segment again as the
//! VM goes live gives the client its reply at once.
//!
//! Why it is sound in every TCP state: the segment is one the guest's
//! stack made, bit for bit, from the log the backup holds, so the Output
//! Rule allows it (the backup, having won the arbiter, is the only side
//! that releases anything), and the network may always deliver a segment
//! twice: a receiver drops data it has and acknowledges again (RFC 9293
//! §3.10.7.4), a FIN it has seen is acknowledged again, whatever the state
//! the connection has reached meanwhile. Never sent again: a RST (an old
//! one could fall into the window of a connection reopened on the same
//! addresses), a SYN (a connection not yet open has its own timers), a
//! segment with neither data nor FIN (a duplicate ACK makes no Linux
//! client with SACK retransmit: its RACK loss detection needs a SACK), and
//! anything not TCP (UDP has no duplicates to absorb them).
//!
//! Lockstep and epoch mode see the guest's frames on the backup as the
//! replay makes them; a checkpoint backup never runs the guest, so its
//! primary sends the last segments of each interval ahead of the
//! interval's checkpoint (`checkpoint_stream`'s `Sent` records), and
//! they count once it commits.

use ftvm_machine::{IoCompletion, IoRequest};
use ftvm_replay::replayer::{HookError, ReplayIo};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How recent a segment must be to be sent again: one made longer ago
/// was released or resent by the guest already, and one failure timeout
/// is as far back as a failure can cut.
pub const WINDOW: Duration = Duration::from_millis(500);
/// Connections remembered at most; the oldest is forgotten first.
const FLOWS: usize = 256;

/// (source address, destination address, source port, destination port).
type Flow = ([u8; 4], [u8; 4], u16, u16);

/// The last segment of each connection the replay made, with when.
#[derive(Default)]
pub struct LastSegments {
    flows: HashMap<Flow, (Instant, usize, Vec<u8>)>,
}

impl LastSegments {
    /// The guest sent `frame` on NIC `slot` just now.
    pub fn saw(&mut self, slot: usize, frame: &[u8]) {
        let Some(flow) = resendable(frame) else { return };
        if self.flows.len() >= FLOWS && !self.flows.contains_key(&flow) {
            if let Some(oldest) = self.flows.iter().min_by_key(|(_, (t, ..))| *t).map(|(k, _)| *k) {
                self.flows.remove(&oldest);
            }
        }
        self.flows.insert(flow, (Instant::now(), slot, frame.to_vec()));
    }

    /// The segments made within [`WINDOW`] of now, oldest first, as
    /// (NIC slot, frame).
    pub fn recent(self) -> Vec<(usize, Vec<u8>)> {
        let now = Instant::now();
        let mut kept: Vec<_> =
            self.flows.into_values().filter(|(t, ..)| now.saturating_duration_since(*t) <= WINDOW).collect();
        kept.sort_by_key(|(t, ..)| *t);
        kept.into_iter().map(|(_, slot, frame)| (slot, frame)).collect()
    }
}

/// The connection of `frame` if it is a TCP segment over IPv4 that may be
/// sent again (see the module's description).
fn resendable(frame: &[u8]) -> Option<Flow> {
    use etherparse::{NetSlice, SlicedPacket, TransportSlice};
    let packet = SlicedPacket::from_ethernet(frame).ok()?;
    let (Some(NetSlice::Ipv4(ip)), Some(TransportSlice::Tcp(tcp))) = (&packet.net, &packet.transport) else {
        return None;
    };
    if tcp.rst() || tcp.syn() || (tcp.payload().is_empty() && !tcp.fin()) {
        return None;
    }
    let h = ip.header();
    Some((h.source(), h.destination(), tcp.source_port(), tcp.destination_port()))
}

/// A replay's I/O that also keeps the last segment of each connection.
pub struct Keeping<'a> {
    /// The I/O the replay does anyway.
    pub inner: &'a mut dyn ReplayIo,
    /// Where the segments are kept.
    pub segments: &'a mut LastSegments,
}

impl ReplayIo for Keeping<'_> {
    fn requests(&mut self, icount: u64, requests: Vec<(usize, IoRequest)>) -> Result<(), HookError> {
        for (slot, req) in &requests {
            if let IoRequest::NetTx { frame } = req {
                self.segments.saw(*slot, frame);
            }
        }
        self.inner.requests(icount, requests)
    }

    fn completion(&mut self, slot: usize, completion: &mut IoCompletion) -> Result<(), HookError> {
        self.inner.completion(slot, completion)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Ethernet frame with a TCP segment from 10.0.0.2:6379 to
    /// 10.0.0.9:`port` carrying `payload`, with RST set if `rst`.
    fn segment(port: u16, payload: &[u8], rst: bool) -> Vec<u8> {
        let b = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4([10, 0, 0, 2], [10, 0, 0, 9], 64)
            .tcp(6379, port, 1000, 65535)
            .ack(77);
        let b = if rst { b.rst() } else { b };
        let mut out = Vec::new();
        b.write(&mut out, payload).unwrap();
        out
    }

    #[test]
    fn the_last_data_segment_of_each_connection_is_kept() {
        let mut s = LastSegments::default();
        s.saw(0, &segment(40000, b"+OK\r\n", false));
        s.saw(0, &segment(40000, b":1\r\n", false));
        s.saw(0, &segment(40001, b"$-1\r\n", false));
        // A pure ACK, a RST and what is not TCP are not sent again.
        s.saw(0, &segment(40002, b"", false));
        s.saw(0, &segment(40003, b"x", true));
        s.saw(0, b"not a frame");
        let recent = s.recent();
        assert_eq!(recent.len(), 2, "one per connection with data");
        assert!(recent[0].1.ends_with(b":1\r\n"), "the last of 40000's");
        assert!(recent[1].1.ends_with(b"$-1\r\n"));
    }

    #[test]
    fn what_is_older_than_the_window_is_not_sent_again() {
        let mut s = LastSegments::default();
        s.saw(1, &segment(40000, b"old", false));
        std::thread::sleep(WINDOW + Duration::from_millis(20));
        s.saw(1, &segment(40001, b"new", false));
        let recent = s.recent();
        assert_eq!(recent.len(), 1);
        assert_eq!(recent[0].0, 1);
        assert!(recent[0].1.ends_with(b"new"));
    }
}
