//! Cluster operations across the agents, for `ftvm cluster` and the
//! controller: the hosts as etcd lists them, where a VM's sides run, and
//! what changes a VM (create and delete its record, protect it on a
//! host, unprotect, hand over, move, drain a host). Each is blocking and
//! ends when the change has happened or failed.
//!
//! A VM's wanted state is its record ([`crate::control::desired`]): an operation
//! changes the record first, so the controller carries on toward it if the
//! client dies, then does what it can at once. An operation that takes
//! the VM through states the controller would "repair" (a move gives a
//! VM whose record wants no protection a backup on the way) holds the
//! record for its duration.

use crate::authority::credentials::Credentials;
use crate::client::{AgentApi, Agents, ClientError, HttpAgents};
use crate::control::desired::{self, DesiredError, VmRecord};
use crate::model::{ApiError, BackupRequest, Done, HostImage, HostRecord, ProtectRequest, Role, VmInfo, VmSpec};
use crate::store::{self, EtcdStore, Store, StoreError};
use ftvm_api::Mode;
use ftvm_etcd::Endpoints;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long an operation holds its VM at most (the longest protect the
/// API waits for, and some): the controller acts again after it even if
/// the client died halfway.
const HOLD: Duration = Duration::from_secs(600);

#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Desired(#[from] DesiredError),
    #[error("{0}")]
    Agent(#[from] ClientError),
    #[error("{0}")]
    Spec(ApiError),
    #[error("no host {0} in the cluster")]
    NoHost(String),
    #[error("no VM {0} in the cluster")]
    NoVm(String),
    /// The backup would be on the primary's own host: a failure of the
    /// host would take both (anti-affinity).
    #[error("VM {vm} runs on {host}: its backup must be on another host")]
    SameHost { vm: String, host: String },
    #[error("VM {vm} has a backup already (on {host})")]
    HasBackup { vm: String, host: String },
    #[error("host {0} is being drained: nothing new goes there")]
    Drained(String),
    #[error("host {host} has {free_mib} MiB free for VMs: too little for VM {vm}'s {memory_mib} MiB")]
    NoRoom { host: String, vm: String, memory_mib: u64, free_mib: u64 },
    /// The image a VM boots is on no host (or not on the one asked for).
    #[error("{} image {image} (`ftvm image build --name {image}` on a host; `ftvm cluster host list` shows each host's)", .host.as_ref().map_or("no host of the cluster has".to_string(), |h| format!("host {h} has no")))]
    NoImage { image: String, host: Option<String> },
    #[error("VM {vm} runs on {host} already")]
    AlreadyThere { vm: String, host: String },
    #[error("VM {vm}'s backup is on {host} already")]
    BackupThere { vm: String, host: String },
    #[error("VM {0} has no backup to move")]
    NoBackup(String),
    #[error("{what} did not happen within {} s{}", .within.as_secs(), .problem.as_ref().map(|p| format!(" (last problem: {p})")).unwrap_or_default())]
    Timeout { what: String, within: Duration, problem: Option<String> },
}

/// A VM's process on a host.
#[derive(Debug, Clone)]
pub struct VmSide {
    pub host: HostRecord,
    pub info: VmInfo,
}

/// The cluster, as a client sees it: its store, and its agents.
pub struct Cluster {
    store: Arc<dyn Store>,
    agents: Arc<dyn Agents>,
}

impl Cluster {
    /// The cluster whose etcd is at `etcd`, its agents spoken to with
    /// `credentials`.
    pub fn new(etcd: Endpoints, credentials: &Credentials) -> Result<Cluster, OpsError> {
        let store = Arc::new(EtcdStore::new(etcd)?);
        Ok(Cluster::with(store, Arc::new(HttpAgents { credentials: credentials.clone() })))
    }

    /// The cluster in `store`, its agents reached through `agents`.
    pub fn with(store: Arc<dyn Store>, agents: Arc<dyn Agents>) -> Cluster {
        Cluster { store, agents }
    }

    /// Its store.
    pub fn store(&self) -> &dyn Store {
        &*self.store
    }

    /// A client of a host's agent.
    pub fn agent(&self, host: &HostRecord) -> Box<dyn AgentApi> {
        self.agents.agent(host, None)
    }

    /// A client of a host's agent whose requests give up after `deadline`.
    pub fn agent_within(&self, host: &HostRecord, deadline: Duration) -> Box<dyn AgentApi> {
        self.agents.agent(host, Some(deadline))
    }

    /// The hosts whose agents are alive (their records in etcd), by id.
    pub fn hosts(&self) -> Result<Vec<HostRecord>, OpsError> {
        let records = self.store.range(store::HOSTS)?;
        Ok(records.into_iter().filter_map(|e| serde_json::from_slice(&e.value).ok()).collect())
    }

    fn host(&self, id: &str) -> Result<HostRecord, OpsError> {
        self.hosts()?.into_iter().find(|h| h.id == id).ok_or_else(|| OpsError::NoHost(id.into()))
    }

    /// Every VM process of the cluster, with its host, from the agents.
    pub fn processes(&self, hosts: &[HostRecord]) -> Vec<(HostRecord, Result<Vec<VmInfo>, ClientError>)> {
        hosts.iter().map(|h| (h.clone(), self.agent(h).vms())).collect()
    }

    /// VM `name`'s running side (its primary, or the VM itself if
    /// unprotected), and its backup if it has one.
    pub fn find(&self, hosts: &[HostRecord], name: &str) -> Result<(VmSide, Option<VmSide>), OpsError> {
        let mut running = None;
        let mut backup = None;
        for h in hosts.iter().filter(|h| h.vms.iter().any(|v| v.name == name)) {
            let info = match self.agent(h).vm(name) {
                Ok(i) => i,
                Err(ClientError::Api(ApiError::NotFound(_))) => continue,
                // A host whose agent does not answer (gone, its record not
                // yet expired) runs nothing anyone can reach.
                Err(ClientError::Transport { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            let side = VmSide { host: h.clone(), info };
            match side.info.role {
                Role::Backup => backup = Some(side),
                Role::Ended => {}
                _ => running = Some(side),
            }
        }
        let running = running.ok_or_else(|| OpsError::NoVm(name.into()))?;
        Ok((running, backup))
    }

    /// Adds VM `spec` to the cluster: the controller starts it on `on`, or
    /// on the host with the most memory free.
    pub fn create(&self, spec: VmSpec, on: Option<&str>) -> Result<(), OpsError> {
        spec.check().map_err(OpsError::Spec)?;
        let image = spec.image_name();
        let no_image = |host: Option<&str>| OpsError::NoImage { image: image.into(), host: host.map(String::from) };
        // One read of the hosts' records serves the checks below.
        let hosts = self.hosts()?;
        if let Some(on) = on {
            let host = hosts.iter().find(|h| h.id == on).ok_or_else(|| OpsError::NoHost(on.into()))?;
            if host.free_memory_bytes < spec.memory_mib << 20 {
                return Err(OpsError::NoRoom {
                    host: on.into(),
                    vm: spec.name.clone(),
                    memory_mib: spec.memory_mib,
                    free_mib: host.free_memory_bytes >> 20,
                });
            }
            if desired::drained(self.store())?.iter().any(|h| h == on) {
                return Err(OpsError::Drained(on.into()));
            }
        }
        // The image as the hosts that have it list it (its root disk's
        // size), for a disk asked smaller than it.
        let listed: Vec<&HostImage> =
            hosts.iter().filter(|h| on.is_none_or(|on| h.id == on)).filter_map(|h| h.image(image)).collect();
        if listed.is_empty() {
            return Err(no_image(on));
        }
        let image_mib = listed.iter().map(|i| i.disk_bytes.div_ceil(1 << 20)).max().unwrap_or(0);
        if let Some(mib) = spec.disk_mib.filter(|&mib| mib < image_mib) {
            return Err(OpsError::Spec(ApiError::BadRequest(format!(
                "a disk of {mib} MiB is smaller than image {image}'s root disk ({image_mib} MiB)"
            ))));
        }
        let record = VmRecord {
            spec,
            start_on: on.map(String::from),
            phase: desired::Phase::Pending,
            held_until: None,
            problem: None,
        };
        Ok(desired::create(self.store(), &record)?)
    }

    /// Waits until VM `name` runs on a host (the controller started it).
    pub fn wait_running(&self, name: &str, within: Duration) -> Result<VmSide, OpsError> {
        let t0 = Instant::now();
        loop {
            if let Ok((running, _)) = self.find(&self.hosts()?, name) {
                if running.info.role != Role::Starting {
                    return Ok(running);
                }
            }
            let record = desired::get(self.store(), name)?.ok_or_else(|| OpsError::NoVm(name.into()))?;
            if t0.elapsed() > within {
                return Err(OpsError::Timeout { what: format!("VM {name}'s start"), within, problem: record.problem });
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Removes VM `name` from the cluster: its record, then its processes
    /// on every host (a protected primary hands over first, then its
    /// backup is stopped too).
    pub fn delete(&self, name: &str) -> Result<Vec<Done>, OpsError> {
        let had_record = desired::remove(self.store(), name)?;
        let mut deleted = Vec::new();
        for h in self.hosts()?.iter().filter(|h| h.vms.iter().any(|v| v.name == name)) {
            match self.agent(h).delete(name) {
                Ok(done) => deleted.push(done),
                Err(ClientError::Api(ApiError::NotFound(_))) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if deleted.is_empty() && !had_record {
            return Err(OpsError::NoVm(name.into()));
        }
        Ok(deleted)
    }

    /// Holds VM `name`'s record (if it has one) while `op` runs: the
    /// controller leaves the VM alone meanwhile.
    fn holding<T>(&self, name: &str, op: impl FnOnce() -> Result<T, OpsError>) -> Result<T, OpsError> {
        let has_record = desired::get(self.store(), name)?.is_some();
        if has_record {
            desired::update(self.store(), name, |r| {
                r.held_until = Some(desired::now() + HOLD.as_secs());
                Ok::<_, DesiredError>(())
            })?;
        }
        let result = op();
        if has_record {
            let released = desired::update(self.store(), name, |r| {
                r.held_until = None;
                Ok::<_, DesiredError>(())
            });
            // The record may have been deleted meanwhile: nothing to
            // release then.
            if let Err(e) = released {
                if !matches!(e, DesiredError::NoVm(_)) && result.is_ok() {
                    return Err(e.into());
                }
            }
        }
        result
    }

    /// Keeps VM `name` protected in `mode` from now on (its record), and,
    /// with `on`, gives it its backup on that host at once.
    pub fn protect(&self, name: &str, on: Option<&str>, mode: Mode) -> Result<Done, OpsError> {
        // A VM the cluster has no record of (started by hand on an agent)
        // is protected all the same; its protection is then nobody's to keep.
        let recorded = desired::update(self.store(), name, |r| {
            r.spec.protect = Some(mode);
            r.spec.check().map_err(OpsError::Spec)
        });
        match recorded {
            Ok(_) | Err(OpsError::Desired(DesiredError::NoVm(_))) => {}
            Err(e) => return Err(e),
        }
        match on {
            Some(on) => self.holding(name, || self.protect_on(name, on, mode)),
            None => {
                Ok(Done { message: format!("VM {name} is to be protected ({mode}): the controller chooses the host") })
            }
        }
    }

    /// The mode VM `name` is kept protected in (its record's), or
    /// checkpoint mode for a VM with none: what a protection asked for
    /// without a mode (the dashboard's, a move's) uses.
    pub fn protection_mode(&self, name: &str) -> Result<Mode, OpsError> {
        let record = desired::get(self.store(), name)?;
        Ok(record.and_then(|r| r.spec.protect).unwrap_or(Mode::Checkpoint))
    }

    /// Gives VM `name` a backup on host `on`: that host's agent starts one
    /// (waiting for its primary), then the VM's agent protects the VM toward
    /// it in `mode`. A backup that the protection did not take is stopped.
    pub fn protect_on(&self, name: &str, on: &str, mode: Mode) -> Result<Done, OpsError> {
        let hosts = self.hosts()?;
        let (running, backup) = self.find(&hosts, name)?;
        if let Some(b) = backup {
            return Err(OpsError::HasBackup { vm: name.into(), host: b.host.id });
        }
        self.backup_onto(&hosts, &running, on, mode)
    }

    /// Moves VM `name`'s backup to host `on` (protected in `mode` from
    /// then on): the pair in force goes on until the new backup holds the
    /// VM, and only then does the old one stop, so the VM is never
    /// unprotected on the way (the VMM's `protect` while protected).
    pub fn move_backup(&self, name: &str, on: &str, mode: Mode) -> Result<Done, OpsError> {
        let hosts = self.hosts()?;
        let (running, backup) = self.find(&hosts, name)?;
        match backup {
            Some(b) if b.host.id == on => Err(OpsError::BackupThere { vm: name.into(), host: on.into() }),
            Some(_) => self.backup_onto(&hosts, &running, on, mode),
            None => Err(OpsError::NoBackup(name.into())),
        }
    }

    /// A backup of `running`'s VM started on host `on`, then the VM
    /// protected toward it in `mode` (moving its backup if it had one). A
    /// backup that the protection did not take is stopped.
    fn backup_onto(&self, hosts: &[HostRecord], running: &VmSide, on: &str, mode: Mode) -> Result<Done, OpsError> {
        let name = running.info.name.as_str();
        if running.host.id == on {
            return Err(OpsError::SameHost { vm: name.into(), host: on.into() });
        }
        let target = hosts.iter().find(|h| h.id == on).ok_or_else(|| OpsError::NoHost(on.into()))?;
        if desired::drained(self.store())?.iter().any(|h| h == on) {
            return Err(OpsError::Drained(on.into()));
        }
        let backup_agent = self.agent(target);
        let started = backup_agent.start_backup(&BackupRequest { spec: running.info.spec.clone() })?;
        let request = ProtectRequest { backup: started.listen, mode, heartbeat_port: Some(started.heartbeat_port) };
        match self.agent(&running.host).protect(name, &request) {
            Ok(done) => Ok(done),
            Err(e) => {
                let _ = backup_agent.delete(name);
                Err(e.into())
            }
        }
    }

    /// Stops protecting VM `name` (its record wants no protection any
    /// more, and its backup stops).
    pub fn unprotect(&self, name: &str) -> Result<Done, OpsError> {
        match desired::update(self.store(), name, |r| {
            r.spec.protect = None;
            Ok::<_, DesiredError>(())
        }) {
            Ok(_) | Err(DesiredError::NoVm(_)) => {}
            Err(e) => return Err(e.into()),
        }
        let (running, backup) = self.find(&self.hosts()?, name)?;
        if backup.is_none() && running.info.role != Role::Primary {
            return Ok(Done { message: format!("VM {name} runs unprotected on {}", running.host.id) });
        }
        Ok(self.agent(&running.host).unprotect(name)?)
    }

    /// Hands VM `name` over to its backup now.
    pub fn handover(&self, name: &str) -> Result<Done, OpsError> {
        let (running, _) = self.find(&self.hosts()?, name)?;
        Ok(self.agent(&running.host).handover(name)?)
    }

    /// Moves VM `name` to host `to`, the guest running on throughout: a
    /// backup there (the one it has, its backup moved there, or a new one
    /// in checkpoint mode), then a handover to it. Its record's protection
    /// is restored by the controller afterwards.
    pub fn move_to(&self, name: &str, to: &str) -> Result<Done, OpsError> {
        self.holding(name, || {
            let hosts = self.hosts()?;
            let (running, backup) = self.find(&hosts, name)?;
            if running.host.id == to {
                return Err(OpsError::AlreadyThere { vm: name.into(), host: to.into() });
            }
            if backup.as_ref().map(|b| b.host.id.as_str()) != Some(to) {
                let mode = self.protection_mode(name)?;
                self.backup_onto(&hosts, &running, to, mode)?;
            }
            let done = self.agent(&running.host).handover(name)?;
            Ok(Done { message: format!("VM {name} moved from {} to {to}: {}", running.host.id, done.message) })
        })
    }

    /// Marks host `id` drained (the controller moves its VMs away and
    /// places nothing new there), or no longer.
    pub fn drain(&self, id: &str, drain: bool) -> Result<(), OpsError> {
        if drain {
            self.host(id)?;
        }
        Ok(desired::set_drain(self.store(), id, drain)?)
    }

    /// Waits until host `id` runs no VM (none that runs or follows).
    pub fn wait_drained(&self, id: &str, within: Duration) -> Result<(), OpsError> {
        let t0 = Instant::now();
        loop {
            let left: Vec<String> = match self.hosts()?.into_iter().find(|h| h.id == id) {
                None => return Ok(()),
                Some(h) => h.vms.into_iter().filter(|v| v.role != Role::Ended).map(|v| v.name).collect(),
            };
            if left.is_empty() {
                return Ok(());
            }
            if t0.elapsed() > within {
                let problem = Some(format!("still on it: {}", left.join(", ")));
                return Err(OpsError::Timeout { what: format!("the drain of host {id}"), within, problem });
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}
