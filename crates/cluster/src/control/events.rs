//! The cluster's event log: what happened to its VMs (their pairs' own
//! events: protected, a side declared failed, the arbiter's verdict, gone
//! live, handed over) and what its controller did about it (started a VM,
//! asked for a backup, moved one), each with its time, host and VM. Kept
//! in etcd under `/ftvm/events/` ([`crate::store`]), not under an agent's lease: the
//! events of a host's death must outlive the host. An event's id is the
//! etcd revision that wrote it, so the log has one order across hosts,
//! and a reader (the API's `GET /v1/events`, the CLI, the metrics) asks
//! for what was written after the last id it saw. The controller keeps the
//! log to its newest [`KEPT`] events.
//!
//! Publishing never stops a VM or the controller: an event that cannot be
//! written (etcd away) is dropped with a line on stderr.

use crate::store::{self, Store, StoreError};
use ftvm_api::events::{EventRecord, PairEvent};
use ftvm_api::Mode;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// The most events kept: far more than the VMs' failovers and
/// re-protections of a day, and a bound on etcd's space.
pub const KEPT: usize = 1000;
/// How often a follower of the log asks for what is new. A poll on the
/// readers' usual connection rather than an etcd watch: a watch is a
/// stream that a member dying without a word leaves hanging, while each
/// poll has the deadline and the move to the next member that every other
/// request has.
pub const POLL: std::time::Duration = std::time::Duration::from_millis(500);
/// The most deletions in one transaction (etcd allows 128 operations).
const TRIM_BATCH: usize = 100;

/// Something that happened in the cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterEvent {
    /// Its place in the log: the etcd revision that wrote it (0 until
    /// written).
    #[serde(default)]
    pub id: i64,
    /// Milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// The host it happened on (the controller's, for its steps).
    pub host: String,
    /// The VM it concerns, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm: Option<String>,
    /// What happened.
    pub what: What,
}

/// Where an event comes from, and what it says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum What {
    /// A VM's process reported an event of its pair.
    Pair { event: PairEvent },
    /// The controller acted.
    Controller { action: ControllerAction },
}

/// What the controller did for a VM.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum ControllerAction {
    /// Asked a host to start the VM.
    Start { on: String },
    /// Asked for a backup on a host (a first protection, or a
    /// re-protection after a failover).
    Protect { on: String, mode: Mode },
    /// Asked for the backup to move off a drained host.
    MoveBackup { from: String, to: String },
    /// Asked the primary on a drained host to hand over.
    Handover { from: String },
    /// Asked for the VM to move off a drained host.
    Move { from: String, to: String },
    /// Let the VM's backup go.
    Unprotect { primary: String },
    /// Stopped a backup no primary follows into (a protect cut short: a
    /// controller or an operator's client that died between starting the
    /// backup and asking the primary), so the VM can be protected again.
    StopOrphan { on: String },
    /// A step failed; it is tried again later.
    Failed { problem: String },
}

/// Whether a pair's event is one an operator follows (not the steps of a
/// disk's copy, nor each refused stranger, which would let anyone who
/// can reach a backup's port fill the log).
pub fn worth_keeping(event: &PairEvent) -> bool {
    !matches!(
        event,
        PairEvent::Listening { .. }
            | PairEvent::StrangerRefused { .. }
            | PairEvent::DiskBlocksSent { .. }
            | PairEvent::DiskDiffers { .. }
            | PairEvent::DiskCopied { .. }
            | PairEvent::TimeoutChanged { .. }
    )
}

/// The key of a VM process's event: the same for the same event read
/// twice (a follower that starts again), so writing it is idempotent.
pub fn pair_key(host: &str, vm: &str, pid: u32, record: &EventRecord) -> String {
    store::pair_event_key(host, vm, pid, record.seq)
}

/// Writes `event` at `key` unless something is there already.
pub fn publish(store: &dyn Store, key: &str, event: &ClusterEvent) -> Result<(), StoreError> {
    let value = serde_json::to_string(event).expect("an event serializes");
    store.create(key, value.as_bytes()).map(|_| ())
}

/// The events written after id `after`, oldest first (an unreadable one
/// is skipped).
pub fn since(store: &dyn Store, after: i64) -> Result<Vec<ClusterEvent>, StoreError> {
    Ok(store
        .range_since(store::EVENTS, after)?
        .into_iter()
        .filter_map(|entry| {
            let mut e: ClusterEvent = serde_json::from_slice(&entry.value).ok()?;
            e.id = entry.revision;
            Some(e)
        })
        .collect())
}

/// A reader's place in the log: what it saw last, and which VM's events
/// it wants (all when `vm` is `None`). The API's stream and the CLI's
/// `events --follow` both read through one.
#[derive(Debug, Clone, Default)]
pub struct Cursor {
    /// The id of the newest event read so far (0: none).
    pub after: i64,
    /// Only this VM's events.
    pub vm: Option<String>,
}

impl Cursor {
    /// The wanted events written since the last call, oldest first; the
    /// cursor moves past every event read, wanted or not.
    pub fn next(&mut self, store: &dyn Store) -> Result<Vec<ClusterEvent>, StoreError> {
        let new = since(store, self.after)?;
        self.after = new.iter().map(|e| e.id).max().unwrap_or(self.after);
        Ok(new.into_iter().filter(|e| self.vm.is_none() || e.vm == self.vm).collect())
    }
}

/// Which of `keys` (each with its revision) to delete so that `kept`
/// remain: the oldest, at most [`TRIM_BATCH`] at a time.
pub fn to_trim(mut keys: Vec<(String, i64)>, kept: usize) -> Vec<String> {
    if keys.len() <= kept {
        return vec![];
    }
    keys.sort_by_key(|(_, r)| *r);
    let excess = keys.len() - kept;
    keys.into_iter().take(excess.min(TRIM_BATCH)).map(|(k, _)| k).collect()
}

/// Deletes the oldest events beyond [`KEPT`].
pub fn trim(store: &dyn Store) -> Result<(), StoreError> {
    let doomed = to_trim(store.keys(store::EVENTS)?, KEPT);
    if doomed.is_empty() {
        return Ok(());
    }
    store.remove_all(&doomed)
}

/// A VM's failovers, handovers and re-protections, as the log tells them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct History {
    /// Backups that went live because their primary failed.
    pub failovers: u64,
    /// Backups that went live because their primary handed the VM over
    /// (a drain, a move, `handover`): planned, nothing failed.
    pub handovers: u64,
    /// The first protection after each loss of redundancy (a failover,
    /// or a backup that failed): redundancy restored.
    pub reprotections: u64,
}

/// What an event means for its VM's history, read in the log's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Meaning {
    /// Its backup went live because the primary failed.
    Failover,
    /// Its backup went live because the primary handed the VM over.
    Handover,
    /// Its first protection after a failover or its backup's failure:
    /// redundancy restored.
    Reprotection,
}

/// A reader of the log that tells what each pair event means for its VM
/// (the histories and the dashboard's timeline read through one). A going
/// live is a handover when the same VM's backup received a handover
/// before it (that event is always written before the going live it leads
/// to), else a failover; a protection is a re-protection only when it is
/// the first since the VM ran alone after a failure (its backup's
/// failover, or its primary's going on without the backup that failed),
/// so a backup moved by a drain is not one.
#[derive(Debug, Default)]
pub struct Story {
    vms: HashMap<String, Reading>,
}

#[derive(Debug, Default)]
struct Reading {
    handed_over: bool,
    exposed: bool,
}

impl Story {
    /// The meaning of `e`, the next event of the log (oldest first).
    pub fn read(&mut self, e: &ClusterEvent) -> Option<Meaning> {
        let (Some(vm), What::Pair { event }) = (&e.vm, &e.what) else { return None };
        let r = self.vms.entry(vm.clone()).or_default();
        match event {
            PairEvent::HandOverReceived { .. } => {
                r.handed_over = true;
                None
            }
            PairEvent::GoingLive { .. } if r.handed_over => {
                r.handed_over = false;
                Some(Meaning::Handover)
            }
            PairEvent::GoingLive { .. } => {
                r.exposed = true;
                Some(Meaning::Failover)
            }
            PairEvent::Unprotected { .. } => {
                r.exposed = true;
                None
            }
            PairEvent::Protected { .. } if r.exposed => {
                r.exposed = false;
                Some(Meaning::Reprotection)
            }
            _ => None,
        }
    }
}

/// Each VM's [`History`] in `events` (oldest first), as [`Story`] reads
/// them.
pub fn histories(events: &[ClusterEvent]) -> HashMap<String, History> {
    let mut folded = Histories::default();
    for e in events {
        folded.read(e);
    }
    folded.by_vm
}

/// Each VM's [`History`], folded from the log one event at a time as it is
/// read (oldest first): the agent's metrics keep one, so a scrape reads
/// memory, not the log.
#[derive(Debug, Default)]
pub struct Histories {
    story: Story,
    by_vm: HashMap<String, History>,
}

impl Histories {
    /// Takes the log's next event into the histories.
    pub fn read(&mut self, e: &ClusterEvent) {
        let Some(meaning) = self.story.read(e) else { return };
        let h = self.by_vm.entry(e.vm.clone().unwrap_or_default()).or_default();
        match meaning {
            Meaning::Failover => h.failovers += 1,
            Meaning::Handover => h.handovers += 1,
            Meaning::Reprotection => h.reprotections += 1,
        }
    }

    /// Each VM's history so far.
    pub fn by_vm(&self) -> &HashMap<String, History> {
        &self.by_vm
    }
}

impl std::fmt::Display for ClusterEvent {
    /// One line: the time (UTC), the host, the VM and what happened.
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let secs = (self.unix_ms / 1000) as i64;
        let (h, m, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
        let days = secs.div_euclid(86400);
        let (y, mo, d) = civil_from_days(days);
        write!(
            f,
            "{y:04}-{mo:02}-{d:02} {h:02}:{m:02}:{s:02}.{:03} {} {}",
            self.unix_ms % 1000,
            self.host,
            self.vm.as_deref().unwrap_or("-")
        )?;
        let (name, rest) = match &self.what {
            What::Pair { event } => ("", serde_json::to_value(event)),
            What::Controller { action } => ("controller ", serde_json::to_value(action)),
        };
        let mut v = rest.expect("an event serializes");
        let tag = v
            .as_object_mut()
            .and_then(|o| o.remove("event").or_else(|| o.remove("action")))
            .and_then(|t| t.as_str().map(String::from))
            .unwrap_or_default();
        write!(f, " {name}{tag}")?;
        if let Some(o) = v.as_object().filter(|o| !o.is_empty()) {
            for (k, v) in o {
                match v {
                    serde_json::Value::String(s) => write!(f, " {k}={s}")?,
                    serde_json::Value::Null => {}
                    other => write!(f, " {k}={other}")?,
                }
            }
        }
        Ok(())
    }
}

/// The (year, month, day) of a day counted from 1970-01-01 (Howard
/// Hinnant's algorithm; written out rather than a date crate for one line
/// of output).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(vm: &str, event: PairEvent) -> ClusterEvent {
        ClusterEvent { id: 0, unix_ms: 0, host: "a".into(), vm: Some(vm.into()), what: What::Pair { event } }
    }

    fn protected() -> PairEvent {
        PairEvent::Protected { backup: "10.0.0.2:7700".into(), generation: 1, mode: Mode::Checkpoint }
    }

    #[test]
    fn an_event_reads_back_as_written_and_in_one_line() {
        let e = ClusterEvent {
            id: 0,
            unix_ms: 1_795_719_452_566,
            host: "backup".into(),
            vm: Some("redis".into()),
            what: What::Pair {
                event: PairEvent::GoingLive {
                    instruction: 7,
                    checkpoint: Some(3),
                    epoch_inputs: None,
                    epoch_inputs_at_multiples: None,
                    segments_sent_again: 2,
                    frames_given: 1,
                },
            },
        };
        let json = serde_json::to_string(&e).unwrap();
        assert_eq!(serde_json::from_str::<ClusterEvent>(&json).unwrap(), e);
        assert!(json.contains(r#""source":"pair""#) && json.contains(r#""event":"going_live""#), "{json}");
        assert_eq!(e.to_string(), "2026-11-26 18:57:32.566 backup redis going_live checkpoint=3 frames_given=1 instruction=7 segments_sent_again=2");
        let c = ClusterEvent {
            what: What::Controller { action: ControllerAction::Protect { on: "spare".into(), mode: Mode::Checkpoint } },
            ..e
        };
        assert!(c.to_string().ends_with("redis controller protect mode=checkpoint on=spare"), "{c}");
    }

    #[test]
    fn progress_and_strangers_are_not_kept() {
        assert!(!worth_keeping(&PairEvent::StrangerRefused { peer: "x".into(), reason: "y".into() }));
        assert!(!worth_keeping(&PairEvent::Listening { address: "x".into() }));
        assert!(worth_keeping(&PairEvent::ArbiterWon { generation: 2 }));
        assert!(worth_keeping(&protected()));
    }

    #[test]
    fn the_oldest_go_beyond_the_kept_and_a_batch_at_a_time() {
        let keys = |n: i64| (0..n).map(|i| (format!("k{i}"), 100 - i)).collect::<Vec<_>>();
        assert!(to_trim(keys(10), 10).is_empty());
        assert_eq!(to_trim(keys(12), 10), ["k11", "k10"]);
        assert_eq!(to_trim(keys(500), 10).len(), TRIM_BATCH);
    }

    fn live() -> PairEvent {
        PairEvent::GoingLive {
            instruction: 1,
            checkpoint: None,
            epoch_inputs: None,
            epoch_inputs_at_multiples: None,
            segments_sent_again: 0,
            frames_given: 0,
        }
    }

    #[test]
    fn failovers_and_the_protections_after_them_are_counted_per_vm() {
        let log = [
            pair("v", protected()),
            pair("w", protected()),
            pair("v", live()),
            pair("v", protected()),
            pair("v", live()),
            pair("v", protected()),
        ];
        let h = histories(&log);
        assert_eq!(h["v"], History { failovers: 2, handovers: 0, reprotections: 2 });
        assert_eq!(h.get("w").copied().unwrap_or_default(), History::default());
    }

    #[test]
    fn a_handover_is_not_a_failover_a_moved_backup_not_a_reprotection_a_lost_one_is() {
        let received = || PairEvent::HandOverReceived { primary: "10.0.0.1:1".into(), generation: 2 };
        let log = [
            pair("v", protected()),
            pair("v", received()),
            pair("v", live()),
            pair("v", protected()),
            pair("v", protected()),
            pair("v", live()),
            pair("v", protected()),
            pair("v", protected()),
            pair("v", PairEvent::Unprotected { released: 0 }),
            pair("v", protected()),
        ];
        let h = histories(&log);
        assert_eq!(h["v"], History { failovers: 1, handovers: 1, reprotections: 2 });
    }
}
