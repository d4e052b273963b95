//! The wire format of what the backup sends the primary on the logging
//! channel: acknowledgements, requests and a refusal, each a kind byte
//! and its fields. The log itself goes the other way as opaque bytes:
//! its format is the caller's.

pub(super) const ACK: u8 = 1;
pub(super) const ACK_LEN: usize = 17;
/// The backup will not follow this primary: kind, length (u16 LE), reason.
pub(super) const REFUSE: u8 = 2;
/// Something the backup asks of the primary before it is ready to follow
/// (what it asks is the caller's business): kind, length (u32 LE), bytes.
pub(super) const REQUEST: u8 = 3;
/// Largest request a primary takes.
pub const MAX_REQUEST: usize = 16 << 20;
