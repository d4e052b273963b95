//! Hosts in memory, for the controller's tests: each host's agent as
//! [`AgentApi`] (its VMs' processes and their parts, changed as a real
//! agent's requests change them), its record written to a
//! [`MemoryStore`] after every change as the agent's loop writes it to
//! etcd, and what the pairs do on their own (a backup whose primary's host
//! vanished goes live).

use crate::client::{AgentApi, Agents, ClientError};
use crate::model::{
    ApiError, BackupRequest, BackupStarted, Done, HostImage, HostRecord, HostVm, ProtectRequest, Role, VmInfo, VmSpec,
};
use crate::store::{self, MemoryStore, Store};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// The hosts of a cluster in memory. Clones share them.
#[derive(Clone)]
pub struct FakeHosts {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<MemoryStore>,
    hosts: Mutex<BTreeMap<String, Host>>,
    /// Every request an agent was asked, as `host request vm`.
    calls: Mutex<Vec<String>>,
}

struct Host {
    memory_mib: u64,
    /// Its VMs' processes, oldest first.
    vms: Vec<Process>,
}

#[derive(Clone)]
struct Process {
    spec: VmSpec,
    role: Role,
    /// The host of its backup (a primary's), or of its primary (a
    /// backup's, once protected).
    peer: Option<String>,
}

impl FakeHosts {
    pub fn new(store: Arc<MemoryStore>) -> FakeHosts {
        FakeHosts { inner: Arc::new(Inner { store, hosts: Mutex::default(), calls: Mutex::default() }) }
    }

    /// A host joins with `memory_mib` for its VMs.
    pub fn add(&self, id: &str, memory_mib: u64) {
        self.hosts().insert(id.into(), Host { memory_mib, vms: vec![] });
        self.publish();
    }

    /// A process of VM `spec` in `role` on host `on`, its peer on `peer`.
    pub fn run(&self, on: &str, spec: &VmSpec, role: Role, peer: Option<&str>) {
        let process = Process { spec: spec.clone(), role, peer: peer.map(String::from) };
        self.hosts().get_mut(on).expect("a host").vms.push(process);
        self.publish();
    }

    /// VM `spec`'s pair: its primary on `primary`, its backup on `backup`.
    pub fn run_pair(&self, spec: &VmSpec, primary: &str, backup: &str) {
        self.run(primary, spec, Role::Primary, Some(backup));
        self.run(backup, spec, Role::Backup, Some(primary));
    }

    /// Host `id` dies: its processes with it, its record gone when its
    /// lease expires (here at once). A backup whose primary ran there
    /// goes live, as the pair's arbiter lets it.
    pub fn vanish(&self, id: &str) {
        let mut hosts = self.hosts();
        let gone = hosts.remove(id).expect("a host");
        for p in gone.vms.iter().filter(|p| p.role == Role::Primary) {
            if let Some(backup) = p.peer.as_ref().and_then(|b| hosts.get_mut(b)) {
                if let Some(b) = backup.vms.iter_mut().find(|b| b.spec.name == p.spec.name && b.role == Role::Backup) {
                    b.role = Role::Unprotected;
                    b.peer = None;
                }
            }
        }
        drop(hosts);
        self.inner.store.remove(&store::host_key(id)).expect("in memory");
        self.publish();
    }

    /// The parts VM `vm` has on each host, by host (ended ones too).
    pub fn sides(&self, vm: &str) -> Vec<(String, Role)> {
        let hosts = self.hosts();
        hosts
            .iter()
            .flat_map(|(id, h)| h.vms.iter().filter(|p| p.spec.name == vm).map(move |p| (id.clone(), p.role)))
            .collect()
    }

    /// The VMs on host `id` that run or follow (not the ended).
    pub fn live_on(&self, id: &str) -> Vec<String> {
        let hosts = self.hosts();
        hosts[id].vms.iter().filter(|p| p.role != Role::Ended).map(|p| p.spec.name.clone()).collect()
    }

    /// The requests the agents were asked, as `host request vm`.
    pub fn calls(&self) -> Vec<String> {
        self.inner.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn hosts(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Host>> {
        self.inner.hosts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes each host's record, as its agent would.
    fn publish(&self) {
        for (id, h) in self.hosts().iter() {
            let used: u64 = h.vms.iter().filter(|p| p.role != Role::Ended).map(|p| p.spec.memory_mib).sum();
            let record = HostRecord {
                id: id.clone(),
                api: format!("https://{id}"),
                address: id.clone(),
                cores: 2,
                memory_bytes: h.memory_mib << 20,
                free_memory_bytes: h.memory_mib.saturating_sub(used) << 20,
                vms: h
                    .vms
                    .iter()
                    .map(|p| HostVm {
                        name: p.spec.name.clone(),
                        role: p.role,
                        protect: p.spec.protect,
                        memory_mib: p.spec.memory_mib,
                    })
                    .collect(),
                version: String::new(),
                images: vec![HostImage { name: ftvm_image::IMAGE_NAME.into(), disk_bytes: 1 << 30 }],
            };
            let json = serde_json::to_vec(&record).expect("a record serializes");
            self.inner.store.put(&store::host_key(id), &json).expect("in memory");
        }
    }
}

impl Agents for FakeHosts {
    fn agent(&self, host: &HostRecord, _deadline: Option<std::time::Duration>) -> Box<dyn AgentApi> {
        Box::new(FakeAgent { hosts: self.clone(), id: host.id.clone() })
    }
}

/// One host's agent.
struct FakeAgent {
    hosts: FakeHosts,
    id: String,
}

fn refused(e: ApiError) -> ClientError {
    ClientError::Api(e)
}

impl FakeAgent {
    /// Runs `change` on this host's processes and the other hosts (a
    /// host that vanished does not answer), then writes the records.
    fn with<T>(
        &self,
        call: &str,
        vm: &str,
        change: impl FnOnce(&mut BTreeMap<String, Host>) -> Result<T, ApiError>,
    ) -> Result<T, ClientError> {
        self.hosts.inner.calls.lock().unwrap_or_else(|e| e.into_inner()).push(format!("{} {call} {vm}", self.id));
        let mut hosts = self.hosts.hosts();
        if !hosts.contains_key(&self.id) {
            return Err(ClientError::Transport { url: format!("https://{}", self.id), problem: "no route".into() });
        }
        let result = change(&mut hosts).map_err(refused);
        drop(hosts);
        self.hosts.publish();
        result
    }

    fn info(&self, p: &Process) -> VmInfo {
        VmInfo {
            name: p.spec.name.clone(),
            host: self.id.clone(),
            spec: p.spec.clone(),
            role: p.role,
            pid: Some(1),
            control: String::new(),
            status: None,
            ended: (p.role == Role::Ended).then(|| "exited".into()),
        }
    }

    /// Whether `memory_mib` more fits on this host.
    fn room(host: &Host, memory_mib: u64) -> Result<(), ApiError> {
        let used: u64 = host.vms.iter().filter(|p| p.role != Role::Ended).map(|p| p.spec.memory_mib).sum();
        if used + memory_mib > host.memory_mib {
            return Err(ApiError::Conflict("too little memory".into()));
        }
        Ok(())
    }
}

/// The live process of VM `vm` on `host`, if it has one.
fn live<'a>(host: &'a mut Host, vm: &str) -> Option<&'a mut Process> {
    host.vms.iter_mut().find(|p| p.spec.name == vm && p.role != Role::Ended)
}

fn done(message: String) -> Done {
    Done { message }
}

impl AgentApi for FakeAgent {
    fn vms(&self) -> Result<Vec<VmInfo>, ClientError> {
        self.with("vms", "-", |hosts| Ok(hosts[&self.id].vms.iter().map(|p| self.info(p)).collect()))
    }

    fn vm(&self, name: &str) -> Result<VmInfo, ClientError> {
        self.with("vm", name, |hosts| {
            let vms = &hosts[&self.id].vms;
            let p = vms
                .iter()
                .find(|p| p.spec.name == name && p.role != Role::Ended)
                .or_else(|| vms.iter().find(|p| p.spec.name == name));
            p.map(|p| self.info(p)).ok_or_else(|| ApiError::NotFound(format!("no VM {name}")))
        })
    }

    fn create(&self, spec: &VmSpec) -> Result<VmInfo, ClientError> {
        self.with("create", &spec.name, |hosts| {
            let host = hosts.get_mut(&self.id).expect("checked");
            if live(host, &spec.name).is_some() {
                return Err(ApiError::Conflict("exists".into()));
            }
            FakeAgent::room(host, spec.memory_mib)?;
            host.vms.push(Process { spec: spec.clone(), role: Role::Unprotected, peer: None });
            Ok(self.info(host.vms.last().expect("pushed")))
        })
    }

    fn delete(&self, name: &str) -> Result<Done, ClientError> {
        self.with("delete", name, |hosts| {
            let host = hosts.get_mut(&self.id).expect("checked");
            host.vms.retain(|p| p.spec.name != name);
            Ok(done(format!("{name} deleted")))
        })
    }

    fn delete_ended(&self, name: &str) -> Result<Done, ClientError> {
        self.with("delete_ended", name, |hosts| {
            let host = hosts.get_mut(&self.id).expect("checked");
            if live(host, name).is_some() {
                return Err(ApiError::Conflict(format!("{name} runs")));
            }
            host.vms.retain(|p| p.spec.name != name);
            Ok(done(format!("{name} forgotten")))
        })
    }

    fn start_backup(&self, req: &BackupRequest) -> Result<BackupStarted, ClientError> {
        self.with("start_backup", &req.spec.name, |hosts| {
            let host = hosts.get_mut(&self.id).expect("checked");
            if live(host, &req.spec.name).is_some() {
                return Err(ApiError::Conflict("exists".into()));
            }
            FakeAgent::room(host, req.spec.memory_mib)?;
            host.vms.retain(|p| p.spec.name != req.spec.name);
            host.vms.push(Process { spec: req.spec.clone(), role: Role::Backup, peer: None });
            Ok(BackupStarted { listen: format!("{}:7700", self.id), heartbeat_port: 7701 })
        })
    }

    fn protect(&self, name: &str, req: &ProtectRequest) -> Result<Done, ClientError> {
        let to = req.backup.rsplit_once(':').map_or(req.backup.clone(), |(h, _)| h.to_string());
        self.with("protect", name, |hosts| {
            let old = {
                let p = live(hosts.get_mut(&self.id).expect("checked"), name)
                    .filter(|p| matches!(p.role, Role::Unprotected | Role::Primary))
                    .ok_or_else(|| ApiError::Conflict(format!("{name} runs no live side here")))?;
                p.peer.clone()
            };
            let backup = hosts
                .get_mut(&to)
                .and_then(|h| live(h, name))
                .filter(|b| b.role == Role::Backup)
                .ok_or_else(|| ApiError::Refused(format!("no backup of {name} at {to}")))?;
            backup.peer = Some(self.id.clone());
            // Its backup moved: the old one is let go once the new one
            // holds the VM.
            if let Some(b) = old.and_then(|o| hosts.get_mut(&o)).and_then(|h| live(h, name)) {
                b.role = Role::Ended;
            }
            let p = live(hosts.get_mut(&self.id).expect("checked"), name).expect("found above");
            p.role = Role::Primary;
            p.peer = Some(to.clone());
            Ok(done(format!("{name} protected by {to}")))
        })
    }

    fn unprotect(&self, name: &str) -> Result<Done, ClientError> {
        self.with("unprotect", name, |hosts| {
            let p = live(hosts.get_mut(&self.id).expect("checked"), name)
                .ok_or_else(|| ApiError::NotFound(format!("no VM {name}")))?;
            p.role = Role::Unprotected;
            let peer = p.peer.take();
            if let Some(b) = peer.and_then(|b| hosts.get_mut(&b)).and_then(|h| live(h, name)) {
                b.role = Role::Ended;
            }
            Ok(done(format!("{name} unprotected")))
        })
    }

    fn handover(&self, name: &str) -> Result<Done, ClientError> {
        self.with("handover", name, |hosts| {
            let p = live(hosts.get_mut(&self.id).expect("checked"), name)
                .filter(|p| p.role == Role::Primary)
                .ok_or_else(|| ApiError::Conflict(format!("{name} has no backup to hand over to")))?;
            p.role = Role::Ended;
            let to = p.peer.take().expect("a primary has its backup");
            let b = hosts.get_mut(&to).and_then(|h| live(h, name)).expect("its backup");
            b.role = Role::Unprotected;
            b.peer = None;
            Ok(done(format!("{name} handed over to {to}")))
        })
    }
}
