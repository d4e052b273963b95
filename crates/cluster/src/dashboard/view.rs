//! The dashboard's view of the whole cluster: one look ([`look`]) reads
//! the hosts' records, the VMs' records and the drained hosts from etcd
//! and every live agent's VMs from its API; [`Watch`] keeps the looks of
//! the last minutes, so that each VM's lag and log bandwidth have a
//! history to chart and a host that vanished is still shown, as lost.
//! Blocking: called on the blocking pool.

use crate::control::desired::{self, VmRecord};
use crate::control::ops::Cluster;
use crate::model::{HostRecord, Role, VmInfo};
use ftvm_api::{PairStatus, PrimaryMode};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// How long the charts reach back, ms.
pub const HISTORY_MS: u64 = 5 * 60 * 1000;
/// How long a look waits for an agent's answer: one that hangs is shown
/// as not answering rather than holding every page's view.
const ASK_WITHIN: std::time::Duration = std::time::Duration::from_secs(8);
/// How long a host that vanished from etcd is still shown (as lost).
const LOST_SHOWN_MS: u64 = 10 * 60 * 1000;

/// What one look found.
pub struct Look {
    pub unix_ms: u64,
    /// The hosts etcd lists (None: etcd did not answer).
    pub hosts: Option<Vec<HostRecord>>,
    pub records: Vec<VmRecord>,
    pub drained: Vec<String>,
    /// Each listed host's VMs as its agent answered (Err: the agent did
    /// not answer, in words).
    pub processes: HashMap<String, Result<Vec<VmInfo>, String>>,
}

/// Looks at the cluster once. A host's agent that does not answer costs
/// its connection's timeout (at most [`ASK_WITHIN`]), in parallel with
/// the others.
pub fn look(cluster: &Cluster) -> Look {
    let unix_ms = now_ms();
    let hosts = cluster.hosts().ok();
    let records = desired::all(cluster.store()).unwrap_or_default();
    let drained = desired::drained(cluster.store()).unwrap_or_default();
    let processes = std::thread::scope(|s| {
        let asks: Vec<_> = hosts
            .iter()
            .flatten()
            .map(|h| (h.id.clone(), s.spawn(|| cluster.agent_within(h, ASK_WITHIN).vms().map_err(|e| e.to_string()))))
            .collect();
        asks.into_iter()
            .map(|(id, t)| (id, t.join().unwrap_or_else(|_| Err("the look at its agent failed".into()))))
            .collect()
    });
    Look { unix_ms, hosts, records, drained, processes }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A VM's figures at a look: (unix ms, lag ms, Mbit/s).
pub type Sample = (u64, Option<f64>, Option<f64>);

/// A host's health as the dashboard shows it.
#[derive(Debug, Clone, PartialEq)]
pub enum Health {
    /// Its record is in etcd and its agent answers.
    Up,
    /// Its record is in etcd but its agent does not answer.
    NotAnswering(String),
    /// Its record is gone from etcd (its lease expired): the host or its
    /// agent died, last seen then.
    Lost { last_seen_ms: u64 },
}

/// A host as shown.
#[derive(Debug, Clone)]
pub struct HostRow {
    pub id: String,
    pub health: Health,
    pub drained: bool,
    pub cores: u32,
    pub memory_bytes: u64,
    pub free_memory_bytes: u64,
    /// Its VMs: (name, role).
    pub vms: Vec<(String, Role)>,
    /// The guest images it can boot VMs from.
    pub images: Vec<String>,
}

/// A VM's protection as shown.
#[derive(Debug, Clone, PartialEq)]
pub enum Protection {
    /// A primary in its mode, with a backup.
    Protected,
    /// On its way to a new backup (the machine's transfer), percent of
    /// the current round sent.
    Protecting { round: u32, percent: u8 },
    /// It runs alone and its record wants no protection.
    Unprotected,
    /// It runs alone and wants protection: the controller looks for a
    /// host (its last problem, if any).
    WaitingForHost(Option<String>),
    /// Its record says it is to run, and it runs nowhere yet.
    Starting,
    /// It runs nowhere an agent answers for.
    NotRunning,
}

/// The figures of a protected VM's pair.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    /// How far the backup is behind, ms: lockstep and epoch measure it;
    /// in checkpoint mode it is the interval times the checkpoints not yet
    /// acknowledged, plus one (the guest's state the backup would resume
    /// from is at most that old).
    pub lag_ms: Option<f64>,
    /// Log (or checkpoint stream) bandwidth, Mbit/s: lockstep's own
    /// figure; in checkpoint mode from the stream's bytes between looks.
    pub mbit_s: Option<f64>,
    pub outputs_held: Option<u64>,
    pub checkpoint_rate: Option<f64>,
    pub pause_median_us: Option<u64>,
    pub pause_p99_us: Option<u64>,
}

/// A VM as shown.
#[derive(Debug, Clone)]
pub struct VmRow {
    pub name: String,
    pub primary: Option<String>,
    pub backup: Option<String>,
    pub mode: String,
    /// The guest image it boots (its spec's, else that of a process).
    pub image: String,
    pub protection: Protection,
    pub figures: Figures,
    /// Its lag and bandwidth over the last minutes: (unix ms, lag ms,
    /// Mbit/s).
    pub history: Vec<Sample>,
}

/// The cluster as shown.
pub struct View {
    pub unix_ms: u64,
    pub etcd_answers: bool,
    pub hosts: Vec<HostRow>,
    pub vms: Vec<VmRow>,
}

/// The looks of the last minutes, made into views.
#[derive(Default)]
pub struct Watch {
    /// Each host last seen in etcd: its record and when.
    seen: BTreeMap<String, (HostRecord, u64)>,
    /// Each VM's samples: (unix ms, lag ms, Mbit/s).
    samples: HashMap<String, VecDeque<Sample>>,
    /// Each VM's primary's stream bytes at the last look: (host, bytes,
    /// unix ms), for the bandwidth of checkpoint mode.
    stream_bytes: HashMap<String, (String, u64, u64)>,
}

impl Watch {
    /// Takes a look in and makes the view of the cluster.
    pub fn view(&mut self, look: &Look) -> View {
        let now = look.unix_ms;
        if let Some(hosts) = &look.hosts {
            for h in hosts {
                self.seen.insert(h.id.clone(), (h.clone(), now));
            }
        }
        self.seen.retain(|_, (_, at)| now.saturating_sub(*at) < LOST_SHOWN_MS);
        let listed: Vec<&str> = look.hosts.iter().flatten().map(|h| h.id.as_str()).collect();
        let hosts = self
            .seen
            .values()
            .map(|(h, at)| {
                let health = if !listed.contains(&h.id.as_str()) && look.hosts.is_some() {
                    Health::Lost { last_seen_ms: *at }
                } else {
                    match look.processes.get(&h.id) {
                        Some(Err(e)) => Health::NotAnswering(e.clone()),
                        _ => Health::Up,
                    }
                };
                let vms = match look.processes.get(&h.id) {
                    Some(Ok(vms)) => vms.iter().map(|v| (v.name.clone(), v.role)).collect(),
                    _ => h.vms.iter().map(|v| (v.name.clone(), v.role)).collect(),
                };
                HostRow {
                    id: h.id.clone(),
                    health,
                    drained: look.drained.contains(&h.id),
                    cores: h.cores,
                    memory_bytes: h.memory_bytes,
                    free_memory_bytes: h.free_memory_bytes,
                    vms,
                    images: h.images.iter().map(|i| i.name.clone()).collect(),
                }
            })
            .collect();

        // Every VM the cluster has a record of or an agent runs.
        let mut sides: BTreeMap<String, Vec<&VmInfo>> = BTreeMap::new();
        for r in &look.records {
            sides.entry(r.spec.name.clone()).or_default();
        }
        for v in look.processes.values().flatten().flatten() {
            sides.entry(v.name.clone()).or_default().push(v);
        }
        let mut vms = Vec::new();
        for (name, procs) in sides {
            let record = look.records.iter().find(|r| r.spec.name == name);
            let running = procs.iter().find(|v| matches!(v.role, Role::Primary | Role::Unprotected | Role::Starting));
            let backup = procs.iter().find(|v| v.role == Role::Backup);
            let pair = running.and_then(|v| v.status.as_ref()).and_then(|s| s.pair.as_ref());
            let mut figures = Figures::default();
            let mut protection = match (running, pair) {
                (None, _) if record.is_some_and(|r| r.phase != desired::Phase::Running) => Protection::Starting,
                (None, _) => Protection::NotRunning,
                (Some(_), Some(PairStatus::Primary(p))) => match &p.mode {
                    PrimaryMode::Transfer(t) => {
                        let all = t.pages.saturating_add(t.round_left);
                        let percent = t.pages.saturating_mul(100).checked_div(all).map_or(0, |p| p.min(99) as u8);
                        Protection::Protecting { round: t.round, percent }
                    }
                    PrimaryMode::Lockstep(log) | PrimaryMode::Epoch { log, .. } => {
                        figures.lag_ms = Some(log.lag_ms as f64);
                        figures.mbit_s = Some(log.log_mbit_s);
                        figures.outputs_held = Some(log.held);
                        Protection::Protected
                    }
                    PrimaryMode::Checkpoint(c) => {
                        let unacked = c.checkpoints.saturating_sub(c.committed);
                        figures.lag_ms = Some(unacked.saturating_add(1).saturating_mul(c.interval_ms) as f64);
                        figures.outputs_held = Some(c.held);
                        figures.checkpoint_rate = Some(c.rate);
                        figures.pause_median_us = Some(c.pause_median_us);
                        figures.pause_p99_us = Some(c.pause_p99_us);
                        let host = running.map(|v| v.host.clone()).unwrap_or_default();
                        if let Some((h, bytes, at)) = self.stream_bytes.get(&name) {
                            if *h == host && c.log_bytes >= *bytes && now > *at {
                                figures.mbit_s =
                                    Some((c.log_bytes - bytes) as f64 * 8.0 / ((now - at) as f64 * 1000.0));
                            }
                        }
                        self.stream_bytes.insert(name.clone(), (host, c.log_bytes, now));
                        Protection::Protected
                    }
                },
                (Some(_), _) if record.and_then(|r| r.spec.protect.as_ref()).is_some() => {
                    Protection::WaitingForHost(record.and_then(|r| r.problem.clone()))
                }
                (Some(_), _) => Protection::Unprotected,
            };
            // A primary whose backup no agent shows is not protected.
            if protection == Protection::Protected && backup.is_none() {
                protection = Protection::WaitingForHost(record.and_then(|r| r.problem.clone()));
            }
            let series = self.samples.entry(name.clone()).or_default();
            series.push_back((now, figures.lag_ms, figures.mbit_s));
            while series.front().is_some_and(|(t, ..)| now.saturating_sub(*t) > HISTORY_MS) {
                series.pop_front();
            }
            vms.push(VmRow {
                name: name.clone(),
                primary: running.map(|v| v.host.clone()),
                backup: backup.map(|v| v.host.clone()),
                mode: running.map(|v| v.mode()).unwrap_or_else(|| "none".into()),
                image: record.map(|r| &r.spec).or(running.map(|v| &v.spec)).map_or("–", |s| s.image_name()).to_string(),
                protection,
                figures,
                history: series.iter().copied().collect(),
            });
        }
        let shown: Vec<String> = vms.iter().map(|v| v.name.clone()).collect();
        self.samples.retain(|n, _| shown.contains(n));
        View { unix_ms: now, etcd_answers: look.hosts.is_some(), hosts, vms }
    }
}
