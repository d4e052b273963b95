//! The wire format of what the backup sends the primary on the logging
//! channel: acknowledgements, requests and a refusal, each a kind byte
//! and its fields, integers little-endian. The log itself goes the other
//! way as opaque bytes: its format is the caller's.
//!
//! ```text
//! acknowledgement: kind 1 | bytes of log received u64 | instructions executed u64
//!                  | sequence number of the primary's last heartbeat heard u64 (0: none)
//!                  | the backup's failure timeout, ms u32
//!                  | the backup's heartbeat timeout, ms u32
//! refusal:         kind 2 | length u16 | reason
//! request:         kind 3 | length u32 | bytes
//! ```

use super::failure::Failure;

const ACK: u8 = 1;
const ACK_LEN: usize = 33;
/// The backup will not follow this primary: kind, length (u16 LE), reason.
const REFUSE: u8 = 2;
/// Something the backup asks of the primary before it is ready to follow
/// (what it asks is the caller's business): kind, length (u32 LE), bytes.
const REQUEST: u8 = 3;
/// Largest request a primary takes.
pub const MAX_REQUEST: usize = 16 << 20;

/// One message from the backup, as the primary reads it.
pub enum Message<'a> {
    Ack { received: u64, icount: u64, heartbeat: u64, timeout_ms: u32, beat_timeout_ms: u32 },
    Request(&'a [u8]),
    Refuse(String),
}

/// An acknowledgement of `received` bytes of log, the backup having
/// executed up to `icount` and last heard the primary's heartbeat number
/// `heartbeat`, while it declares the primary failed after `timeout_ms`
/// of the channel's silence or `beat_timeout_ms` of the heartbeats': what
/// the primary's lease is reckoned from (`fence`). The backup says its
/// timeouts because the lease must never outrun them, and the two sides'
/// timeouts differ (the heartbeat timeout is learned by each side, the
/// timeout may have been set differently or be changing).
pub fn ack(received: u64, icount: u64, heartbeat: u64, timeout_ms: u32, beat_timeout_ms: u32) -> [u8; ACK_LEN] {
    let mut msg = [0u8; ACK_LEN];
    msg[0] = ACK;
    msg[1..9].copy_from_slice(&received.to_le_bytes());
    msg[9..17].copy_from_slice(&icount.to_le_bytes());
    msg[17..25].copy_from_slice(&heartbeat.to_le_bytes());
    msg[25..29].copy_from_slice(&timeout_ms.to_le_bytes());
    msg[29..33].copy_from_slice(&beat_timeout_ms.to_le_bytes());
    msg
}

/// A request (its length the caller has checked against [`MAX_REQUEST`]).
pub fn request(request: Vec<u8>) -> Vec<u8> {
    let mut msg = vec![REQUEST];
    msg.extend((request.len() as u32).to_le_bytes());
    msg.extend(request);
    msg
}

/// A refusal, its reason cut to what its length can say.
pub fn refusal(why: &str) -> Vec<u8> {
    let text = &why.as_bytes()[..why.len().min(u16::MAX as usize)];
    let mut msg = vec![REFUSE];
    msg.extend((text.len() as u16).to_le_bytes());
    msg.extend(text);
    msg
}

/// The message `bytes` begin with, and its length; `None` until it has
/// all come. What cannot be a message is the failure to declare.
pub fn parse(msg: &[u8]) -> Result<Option<(Message<'_>, usize)>, Failure> {
    let Some(&kind) = msg.first() else { return Ok(None) };
    match kind {
        ACK if msg.len() >= ACK_LEN => {
            let received = u64::from_le_bytes(msg[1..9].try_into().unwrap());
            let icount = u64::from_le_bytes(msg[9..17].try_into().unwrap());
            let heartbeat = u64::from_le_bytes(msg[17..25].try_into().unwrap());
            let timeout_ms = u32::from_le_bytes(msg[25..29].try_into().unwrap());
            let beat_timeout_ms = u32::from_le_bytes(msg[29..33].try_into().unwrap());
            Ok(Some((Message::Ack { received, icount, heartbeat, timeout_ms, beat_timeout_ms }, ACK_LEN)))
        }
        REQUEST if msg.len() >= 5 => {
            let len = u32::from_le_bytes(msg[1..5].try_into().unwrap()) as usize;
            if len > MAX_REQUEST {
                return Err(Failure::Closed(format!("a request of {len} bytes from the backup")));
            }
            if msg.len() < 5 + len {
                return Ok(None);
            }
            Ok(Some((Message::Request(&msg[5..5 + len]), 5 + len)))
        }
        REFUSE if msg.len() >= 3 => {
            let len = u16::from_le_bytes([msg[1], msg[2]]) as usize;
            if msg.len() < 3 + len {
                return Ok(None);
            }
            Ok(Some((Message::Refuse(String::from_utf8_lossy(&msg[3..3 + len]).into_owned()), 3 + len)))
        }
        ACK | REQUEST | REFUSE => Ok(None),
        other => Err(Failure::Closed(format!("unknown message kind {other} from the backup"))),
    }
}

/// What the end of the stream means with `partial`, the start of a
/// message, unread: a refusal cut short is still one.
pub fn at_end(partial: &[u8]) -> Failure {
    match partial.first() {
        Some(&REFUSE) => Failure::Refused(String::from_utf8_lossy(partial.get(3..).unwrap_or(&[])).into_owned()),
        Some(_) => Failure::Closed("end of stream inside a message".into()),
        None => Failure::Closed("end of stream".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_parse_as_written_and_wait_until_whole() {
        let mut bytes = ack(7, 9, 11, 500, 60).to_vec();
        bytes.extend(request(b"digests".to_vec()));
        bytes.extend(refusal("its disk differs"));
        let mut at = 0;
        let mut got = Vec::new();
        while let Some((msg, len)) = parse(&bytes[at..]).unwrap() {
            // Every shorter prefix is a message yet to come.
            for cut in at..at + len {
                assert!(parse(&bytes[at..cut]).unwrap().is_none(), "cut at {cut}");
            }
            got.push(match msg {
                Message::Ack { received, icount, heartbeat, timeout_ms, beat_timeout_ms } => {
                    format!("ack {received} {icount} {heartbeat} {timeout_ms} {beat_timeout_ms}")
                }
                Message::Request(r) => format!("request {}", String::from_utf8_lossy(r)),
                Message::Refuse(why) => format!("refuse {why}"),
            });
            at += len;
        }
        assert_eq!(got, ["ack 7 9 11 500 60", "request digests", "refuse its disk differs"]);
        assert_eq!(at, bytes.len());
        assert_eq!(at_end(&refusal("its disk")[..5]), Failure::Refused("it".into()));
        assert!(matches!(parse(&[9]), Err(Failure::Closed(_))));
    }
}
