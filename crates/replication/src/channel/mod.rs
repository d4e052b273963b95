//! The logging channel (VMware FT §2, §3.2, Figure 3): a TCP connection
//! from primary to backup carrying the replay log as one byte stream, and
//! acknowledgements back.
//!
//! Primary end ([`LogSender`]): the VM thread writes log bytes into a
//! bounded buffer that a sender thread flushes to the socket as soon as
//! they come; a full buffer stalls the writer (the VM). A reader thread
//! takes acknowledgements.
//!
//! Backup end ([`LogReceiver`]): a thread reads the socket into a bounded
//! buffer that the replaying VM consumes through [`LogPipe`] (an empty
//! buffer stalls the VM, whose thread then reads the socket itself for a
//! moment); each read is acknowledged at once, on receipt, not on
//! execution (§3.2). A full buffer stops the reading, so the primary's
//! buffer fills and the primary stalls in turn.
//!
//! An acknowledgement carries the bytes of log received and the
//! instruction count the backup has executed (`wire` has the format).
//! The latter is what the primary measures the execution lag with.
//! Acknowledgements also go out every interval while nothing arrives, so
//! they double as the backup's heartbeat on the channel; the primary's
//! keep-alives are log frames its VM loop writes when the log is quiet.
//!
//! Each end declares its peer failed (§2.3) when the connection closes
//! (the peer's process is gone and its kernel said so), or when either
//! the channel or the UDP heartbeats have been silent for the timeout.
//!
//! Everything either way is authenticated and encrypted under the pair's
//! key (`secure`): only the pair's primary can connect to a backup, and a
//! backup that is offered garbage, a stranger's handshake or an idle
//! connection goes on listening for its primary.
//!
//! The module by job: `pipe` is the bounded buffer at each end, `wire`
//! the messages the backup sends back, `secure` the handshake and the
//! sealed frames under them, `sender` the primary's end, `receiver` the
//! backup's, `failure` why and when a peer is declared failed, `error`
//! what can go wrong opening an end.

mod error;
mod failure;
mod pipe;
mod receiver;
pub mod secure;
mod sender;
pub mod wire;

pub use error::{ChannelError, RequestTooLarge};
pub use failure::Failure;
pub use receiver::{LogPipe, LogReceiver};
pub use secure::{HandshakeError, Session};
pub use sender::{connect, LogSender, PrimaryEvent, SenderWatch, HANDSHAKE_WAIT, SEND_DELAY};
pub use wire::MAX_REQUEST;

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Default size of each end's buffer (VMware speaks of "a large buffer").
pub const DEFAULT_BUFFER: usize = 64 << 20;

/// How long [`LogSender::wait_acked`] reads acknowledgements itself, and
/// the backup's VM reads the log itself when it has none, before they
/// sleep: about a round trip on a loaded host.
const SPIN_FOR: Duration = Duration::from_micros(200);
/// How long after a wait for an acknowledgement (or, on the backup, for
/// log) its caller is counted on to read the next one itself (see
/// [`WaiterTurn`](crate::poll::WaiterTurn)): the epoch ends of the
/// original epoch protocol come a few microseconds of guest work apart.
const WAITER_GRACE: Duration = Duration::from_millis(1);

/// Microsecond clock shared by the threads of one end.
struct Clock(Instant);

impl Clock {
    fn now_us(&self) -> u64 {
        self.0.elapsed().as_micros() as u64
    }
    fn since(&self, us: u64) -> Duration {
        Duration::from_micros(self.now_us().saturating_sub(us))
    }
}

/// Starts one of the channel's threads.
fn spawn(thread: &'static str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, ChannelError> {
    std::thread::Builder::new().name(thread.into()).spawn(f).map_err(|source| ChannelError::Thread { thread, source })
}

/// Starts one of the threads whose silence the peer would take for this
/// side's failure (the acknowledgements' reader, the detector), at a
/// priority the VM's threads, and the log's movers, cannot starve
/// ([`crate::priority`]).
fn spawn_watcher(thread: &'static str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, ChannelError> {
    spawn(thread, move || {
        crate::priority::raise_watcher();
        f()
    })
}

/// Starts the log's sender or receiver: above the VM's threads, below the
/// watchers, whom its bulk work (sealing or opening a large checkpoint)
/// must not keep waiting ([`crate::priority`]).
fn spawn_mover(thread: &'static str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, ChannelError> {
    spawn(thread, move || {
        crate::priority::raise_mover();
        f()
    })
}

#[cfg(test)]
mod tests;
