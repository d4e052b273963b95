//! Cluster operations a client runs against the agents (the `ftvm
//! cluster` command line, and the controller to come): the hosts as etcd
//! lists them, finding a VM's hosts, and giving a VM a backup on another
//! host (the backup's agent starts it, then the primary's agent protects
//! the VM toward it).

use crate::agent::HOSTS_PREFIX;
use crate::client::{AgentClient, ClientError};
use crate::model::{ApiError, BackupRequest, Done, HostRecord, ProtectRequest, Role, VmInfo};

#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error("{0}")]
    Etcd(#[from] ftvm_etcd::EtcdError),
    #[error("{0}")]
    Agent(#[from] ClientError),
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
}

/// The hosts whose agents are alive (their records in etcd), by id.
pub fn hosts(etcd: &str) -> Result<Vec<HostRecord>, OpsError> {
    let etcd = ftvm_etcd::Etcd::new(etcd)?;
    let records = etcd.get_prefix(HOSTS_PREFIX, 0)?;
    Ok(records.into_iter().filter_map(|(_, v)| serde_json::from_slice(&v).ok()).collect())
}

/// Every VM process of the cluster, with its host, from the agents.
pub fn vms(hosts: &[HostRecord], token: &str) -> Vec<(HostRecord, Result<Vec<VmInfo>, ClientError>)> {
    hosts.iter().map(|h| (h.clone(), AgentClient::new(&h.api, token).vms())).collect()
}

/// The host and view of VM `name`'s running side (its primary, or the VM
/// itself if unprotected), and of its backup if it has one.
pub fn find(hosts: &[HostRecord], token: &str, name: &str) -> Result<(VmSide, Option<VmSide>), OpsError> {
    let mut running = None;
    let mut backup = None;
    for h in hosts.iter().filter(|h| h.vms.iter().any(|v| v.name == name)) {
        let info = match AgentClient::new(&h.api, token).vm(name) {
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

/// A VM's process on a host.
#[derive(Debug, Clone)]
pub struct VmSide {
    pub host: HostRecord,
    pub info: VmInfo,
}

/// Gives VM `name` a backup on host `on`: that host's agent starts one
/// (waiting for its primary), then the VM's agent protects the VM toward
/// it in `mode`. A backup that the protection did not take is stopped.
pub fn protect(etcd: &str, token: &str, name: &str, on: &str, mode: &str) -> Result<Done, OpsError> {
    let hosts = hosts(etcd)?;
    let (running, backup) = find(&hosts, token, name)?;
    if let Some(b) = backup {
        return Err(OpsError::HasBackup { vm: name.into(), host: b.host.id });
    }
    if running.host.id == on {
        return Err(OpsError::SameHost { vm: name.into(), host: on.into() });
    }
    let target = hosts.iter().find(|h| h.id == on).ok_or_else(|| OpsError::NoHost(on.into()))?;
    let backup_agent = AgentClient::new(&target.api, token);
    let started = backup_agent.start_backup(&BackupRequest { spec: running.info.spec.clone() })?;
    let primary_agent = AgentClient::new(&running.host.api, token);
    match primary_agent.protect(name, &ProtectRequest { backup: started.listen, mode: mode.into() }) {
        Ok(done) => Ok(done),
        Err(e) => {
            let _ = backup_agent.delete(name);
            Err(e.into())
        }
    }
}
