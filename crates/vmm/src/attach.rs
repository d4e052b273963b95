//! Consoles attached through the control socket (`ftvm console SOCK`):
//! what the VM's serial console showed lately, kept for whoever attaches
//! next, each attached client's copy of what it shows from then on, and
//! which one of them types.
//!
//! The live loop publishes the console's output here as it takes it from
//! the machine; the control socket's connection threads attach. A watcher
//! that falls behind (a client that stopped reading) is let go rather than
//! held in memory or allowed to slow the VM: its connection ends. What a
//! client types goes to the loop as console input, the same host event as
//! the terminal's own, so a recording logs it and a backup replays it.

use std::collections::VecDeque;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use crate::console::Input;
use crate::host_io::HostEvent;

/// Bytes of recent output an attaching client is shown first: a few
/// screens (a login prompt, the last command's output, a panic's trace).
pub const BACKLOG: usize = 64 << 10;
/// Pieces of output a watcher may have waiting before it is let go (the
/// loop publishes at most one piece a slice of about half a millisecond).
const WATCHER_QUEUE: usize = 4096;

/// The VM's console as clients of its control socket see it; cheap to
/// clone (all clones are one).
#[derive(Clone, Default)]
pub struct ConsoleHub {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    backlog: VecDeque<u8>,
    watchers: Vec<SyncSender<Arc<[u8]>>>,
    /// The attachment that types, if one does.
    typist: Option<u64>,
    next_id: u64,
    /// Why no client may type on this VM's console (an `--exec` run: the
    /// console carries the command's protocol).
    no_typing: Option<&'static str>,
    /// The live loop's events, where typed bytes go; none while no loop
    /// runs the VM here (a backup that has not gone live).
    input: Option<Sender<HostEvent>>,
}

/// Why an attachment that wants to type cannot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    #[error("another client types on this console (attach with --read-only to watch)")]
    TypistPresent,
    #[error("nobody types on this console: {0}")]
    NoTyping(&'static str),
    #[error("the VM does not run here (a backup shows no console until it goes live)")]
    NotRunning,
}

/// One attached client: the output shown before it came, and what comes.
/// Its typist's seat is free again when it is dropped.
pub struct Attachment {
    /// The console's recent output, up to [`BACKLOG`] bytes.
    pub backlog: Vec<u8>,
    /// The output from now on; ends when the VM's console goes away or this
    /// client fell too far behind.
    pub output: Receiver<Arc<[u8]>>,
    /// Where what the client sends goes.
    pub keys: Keys,
}

/// An attached client's keyboard: typed on the console if the client
/// types, dropped if it only watches.
#[derive(Clone)]
pub struct Keys {
    hub: ConsoleHub,
    id: u64,
    /// Whether this client types.
    pub types: bool,
}

impl Keys {
    /// Types `bytes` on the console (a watcher's are dropped). False once
    /// the VM's loop is gone.
    pub fn type_bytes(&self, bytes: &[u8]) -> bool {
        if !self.types {
            return true;
        }
        let input = self.hub.inner.lock().unwrap().input.clone();
        input.is_some_and(|i| i.send(HostEvent::Console(Input::Bytes(bytes.to_vec()))).is_ok())
    }

    /// The client went: its typist's place is free at once (a user who
    /// detaches and attaches again is not refused by their own ghost).
    pub fn leave(&self) {
        let mut inner = self.hub.inner.lock().unwrap();
        if inner.typist == Some(self.id) {
            inner.typist = None;
        }
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        self.keys.leave();
    }
}

impl ConsoleHub {
    /// Typed bytes go to `input`, the live loop's events, from now on.
    pub fn set_input(&self, input: Sender<HostEvent>) {
        self.inner.lock().unwrap().input = Some(input);
    }

    /// Refuse typing from clients, saying why (watching stays allowed).
    pub fn forbid_typing(&self, why: &'static str) {
        self.inner.lock().unwrap().no_typing = Some(why);
    }

    /// What the console showed: kept for later attachments, sent to each
    /// attached one.
    pub fn publish(&self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let mut inner = self.inner.lock().unwrap();
        let over = (inner.backlog.len() + bytes.len()).saturating_sub(BACKLOG).min(inner.backlog.len());
        inner.backlog.drain(..over);
        let kept = &bytes[bytes.len().saturating_sub(BACKLOG)..];
        inner.backlog.extend(kept);
        if inner.watchers.is_empty() {
            return;
        }
        let piece: Arc<[u8]> = bytes.into();
        inner.watchers.retain(|w| match w.try_send(piece.clone()) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => false,
        });
    }

    /// Attaches a client, as a typist if `types` (one at a time).
    pub fn attach(&self, types: bool) -> Result<Attachment, AttachError> {
        let mut inner = self.inner.lock().unwrap();
        if inner.input.is_none() {
            return Err(AttachError::NotRunning);
        }
        if types {
            if let Some(why) = inner.no_typing {
                return Err(AttachError::NoTyping(why));
            }
            if inner.typist.is_some() {
                return Err(AttachError::TypistPresent);
            }
        }
        let id = inner.next_id;
        inner.next_id += 1;
        if types {
            inner.typist = Some(id);
        }
        let (tx, rx) = mpsc::sync_channel(WATCHER_QUEUE);
        inner.watchers.push(tx);
        let backlog = inner.backlog.iter().copied().collect();
        Ok(Attachment { backlog, output: rx, keys: Keys { hub: self.clone(), id, types } })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running() -> ConsoleHub {
        let hub = ConsoleHub::default();
        hub.set_input(mpsc::channel().0);
        hub
    }

    #[test]
    fn an_attachment_sees_the_backlog_then_what_comes() {
        let hub = running();
        hub.publish(b"login: ");
        let a = hub.attach(false).unwrap();
        assert_eq!(a.backlog, b"login: ");
        hub.publish(b"root\n");
        assert_eq!(&*a.output.recv().unwrap(), b"root\n");
    }

    #[test]
    fn the_backlog_keeps_the_latest_bytes() {
        let hub = running();
        hub.publish(&vec![b'a'; BACKLOG]);
        hub.publish(b"end");
        let a = hub.attach(false).unwrap();
        assert_eq!(a.backlog.len(), BACKLOG);
        assert!(a.backlog.ends_with(b"aend"));
        hub.publish(&vec![b'b'; 2 * BACKLOG]);
        let b = hub.attach(false).unwrap();
        assert_eq!(b.backlog, vec![b'b'; BACKLOG]);
    }

    #[test]
    fn one_types_and_its_place_frees_when_it_goes() {
        let hub = ConsoleHub::default();
        assert_eq!(hub.attach(true).err(), Some(AttachError::NotRunning));
        assert_eq!(hub.attach(false).err(), Some(AttachError::NotRunning));
        let (tx, rx) = mpsc::channel();
        hub.set_input(tx);
        let first = hub.attach(true).unwrap();
        assert_eq!(hub.attach(true).err(), Some(AttachError::TypistPresent));
        let watcher = hub.attach(false).unwrap();
        assert!(first.keys.type_bytes(b"ls\n") && watcher.keys.type_bytes(b"rm -rf /\n"));
        assert!(matches!(rx.try_recv(), Ok(HostEvent::Console(Input::Bytes(b))) if b == b"ls\n"));
        assert!(rx.try_recv().is_err(), "a watcher's bytes are not typed");
        let keys = first.keys.clone();
        keys.leave();
        let second = hub.attach(true).unwrap();
        drop(first);
        assert_eq!(hub.attach(true).err(), Some(AttachError::TypistPresent), "the old seat's drop frees no other");
        drop(second);
        assert!(hub.attach(true).is_ok());
        hub.forbid_typing("it runs --exec");
        assert_eq!(hub.attach(true).err(), Some(AttachError::NoTyping("it runs --exec")));
    }

    #[test]
    fn a_watcher_that_stops_reading_is_let_go() {
        let hub = running();
        let slow = hub.attach(false).unwrap();
        for _ in 0..WATCHER_QUEUE + 1 {
            hub.publish(b"x");
        }
        assert_eq!(hub.inner.lock().unwrap().watchers.len(), 0);
        // what it had waiting is still there to read, then the end
        assert_eq!(slow.output.iter().count(), WATCHER_QUEUE);
    }
}
