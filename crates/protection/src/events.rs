//! The lifecycle of a pair as typed events: protected, a side declared
//! failed, the arbiter's verdict, going live, halting, the VM's end, and
//! the steps before protection starts. Each side keeps a journal of its
//! events ([`Events`]): a subscriber (the control socket's `events`
//! request, a daemon in the same process) gets what happened so far and
//! then each event as it happens, and a journal file (`--events PATH`)
//! gets every event as one JSON line, so a script never reads stderr.

use crate::error::ProtectionError;
pub use ftvm_api::events::{EventRecord, PairEvent};
use ftvm_replication::arbiter::ArbiterNote;
use std::io::Write;
use std::path::Path;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// Most events kept for a subscriber that comes late: far more than a
/// pair's life makes, and a bound on what a flood of strangers' refused
/// connections can cost.
const KEPT: usize = 4096;

#[derive(Default)]
struct Journal {
    /// The last [`KEPT`] events.
    history: std::collections::VecDeque<EventRecord>,
    /// Events emitted so far.
    emitted: u64,
    subscribers: Vec<Sender<EventRecord>>,
    file: Option<std::fs::File>,
}

/// A side's journal of events; cloning shares it.
#[derive(Clone, Default)]
pub struct Events(Arc<Mutex<Journal>>);

impl Events {
    /// A journal that also appends each event to the file at `path` as
    /// a JSON line.
    pub fn with_file(path: &Path) -> Result<Events, ProtectionError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(crate::error::file("cannot open the event journal", path))?;
        Ok(Events(Arc::new(Mutex::new(Journal { file: Some(file), ..Journal::default() }))))
    }

    /// Records `event` and hands it to every subscriber.
    pub fn emit(&self, event: PairEvent) {
        let mut j = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let unix_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        j.emitted += 1;
        let record = EventRecord { seq: j.emitted, unix_ms, event };
        if let Some(f) = &mut j.file {
            let line = serde_json::to_string(&record).expect("an event serializes");
            // A journal that cannot be written must not stop the VM: the
            // event still reaches the subscribers.
            let _ = writeln!(f, "{line}");
        }
        j.subscribers.retain(|s| s.send(record.clone()).is_ok());
        if j.history.len() == KEPT {
            j.history.pop_front();
        }
        j.history.push_back(record);
    }

    /// What the arbiter's contest tells this side: said on stderr, and an
    /// event where this side found itself cut off
    /// ([`PairEvent::Isolated`]) or its arbiter out of reach
    /// ([`PairEvent::ArbiterUnreachable`]).
    pub fn arbiter_note(&self, note: ArbiterNote) {
        eprintln!("ftvm: {note}");
        match note {
            ArbiterNote::Isolated { addresses, defer } => {
                let addresses = addresses.iter().map(|a| a.to_string()).collect();
                self.emit(PairEvent::Isolated { addresses, defer_ms: defer.as_millis() as u64 });
            }
            ArbiterNote::StorageUnreachable { store, problem } => {
                self.emit(PairEvent::ArbiterUnreachable { store, problem });
            }
            _ => {}
        }
    }

    /// What happened so far, and a receiver of each event from now on.
    pub fn subscribe(&self) -> (Vec<EventRecord>, Receiver<EventRecord>) {
        let (tx, rx) = mpsc::channel();
        let mut j = self.0.lock().unwrap_or_else(|e| e.into_inner());
        j.subscribers.push(tx);
        (j.history.iter().cloned().collect(), rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_subscriber_gets_the_history_then_each_event_and_the_file_every_line() {
        let dir = std::env::temp_dir().join(format!("ftvm-events-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("events.jsonl");
        let events = Events::with_file(&path).unwrap();
        events.emit(PairEvent::ArbiterWon { generation: 3 });
        let (history, rx) = events.subscribe();
        assert_eq!(history.len(), 1);
        assert_eq!(history[0].seq, 1);
        let live = PairEvent::GoingLive {
            instruction: 42,
            checkpoint: None,
            epoch_inputs: None,
            epoch_inputs_at_multiples: None,
            segments_sent_again: 0,
            frames_given: 0,
        };
        events.emit(live.clone());
        let next = rx.try_recv().unwrap();
        assert_eq!((next.seq, next.event.clone()), (2, live));
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<EventRecord> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2);
        assert!(text.lines().nth(1).unwrap().contains(r#""event":"going_live","instruction":42"#), "{text}");
        assert_eq!(lines[1], next);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
