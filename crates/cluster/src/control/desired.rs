//! The cluster's desired state in etcd ([`crate::store`]), which the
//! controller makes real:
//! - `/ftvm/vms/<name>`: a [`VmRecord`] per VM: its spec (what it is and
//!   the protection it wants), the host asked for at its creation, and
//!   how far the cluster got with it ([`Phase`]);
//! - `/ftvm/drain/<host>`: a host being emptied for maintenance (its VMs
//!   leave it, and nothing new is placed on it).
//!
//! Clients (`ftvm cluster`) write the spec; only the controller moves the
//! phase. Every change is a transaction against the record's modification
//! revision, so a client's change and the controller's never overwrite
//! each other: the loser reads again and retries ([`update`]).

use crate::model::{ApiError, VmSpec};
use crate::store::{self, Store, StoreError};
use serde::{Deserialize, Serialize};

/// A VM the cluster is to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmRecord {
    pub spec: VmSpec,
    /// The host its creator asked for; None: the controller chooses.
    #[serde(default)]
    pub start_on: Option<String>,
    #[serde(default)]
    pub phase: Phase,
    /// An operation of a client holds the VM until this time (Unix
    /// seconds): the controller leaves it alone meanwhile (a move unprotects
    /// and protects again, which the controller would otherwise race).
    #[serde(default)]
    pub held_until: Option<u64>,
    /// What the last attempt to start or protect it found wrong, for
    /// `vm show` (the controller tries again meanwhile).
    #[serde(default)]
    pub problem: Option<String>,
}

/// How far the cluster got with a VM.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Phase {
    /// Not started yet: the controller places it.
    #[default]
    Pending,
    /// The controller asked `host` to start it at `at` (Unix seconds); if
    /// the host has not shown it running a while later, it is placed
    /// again.
    Placed { host: String, at: u64 },
    /// It has run. If it runs nowhere now (its hosts died with its
    /// disks), it is lost: never started afresh on its own, as that would
    /// be a different machine under its name.
    Running,
}

impl VmRecord {
    /// Whether a client's operation holds it now.
    pub fn held(&self, now: u64) -> bool {
        self.held_until.is_some_and(|t| t > now)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DesiredError {
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("VM {0} exists already in the cluster")]
    Exists(String),
    #[error("no VM {0} in the cluster")]
    NoVm(String),
    #[error("the record of VM {vm} in etcd is unreadable: {problem}")]
    Unreadable { vm: String, problem: String },
}

impl From<DesiredError> for ApiError {
    fn from(e: DesiredError) -> ApiError {
        match e {
            DesiredError::Store(_) => ApiError::Unavailable(e.to_string()),
            DesiredError::Exists(_) => ApiError::Conflict(e.to_string()),
            DesiredError::NoVm(_) => ApiError::NotFound(e.to_string()),
            DesiredError::Unreadable { .. } => ApiError::Internal(e.to_string()),
        }
    }
}

/// Unix time, seconds.
pub fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn encode(record: &VmRecord) -> String {
    serde_json::to_string(record).expect("a record serializes")
}

fn decode(vm: &str, bytes: &[u8]) -> Result<VmRecord, DesiredError> {
    serde_json::from_slice(bytes).map_err(|e| DesiredError::Unreadable { vm: vm.into(), problem: e.to_string() })
}

/// Adds a VM's record, unless one by its name exists.
pub fn create(store: &dyn Store, record: &VmRecord) -> Result<(), DesiredError> {
    let written = store.create(&store::vm_key(&record.spec.name), encode(record).as_bytes())?;
    // A retried request whose first try wrote finds its own record: the
    // same bytes count as created.
    if written || get(store, &record.spec.name)?.as_ref() == Some(record) {
        Ok(())
    } else {
        Err(DesiredError::Exists(record.spec.name.clone()))
    }
}

/// A VM's record, if the cluster has one.
pub fn get(store: &dyn Store, vm: &str) -> Result<Option<VmRecord>, DesiredError> {
    store.get(&store::vm_key(vm))?.map(|e| decode(vm, &e.value)).transpose()
}

/// Every VM's record, by name (an unreadable one is left out: it is no
/// VM anyone can run).
pub fn all(store: &dyn Store) -> Result<Vec<VmRecord>, DesiredError> {
    Ok(store.range(store::VMS)?.into_iter().filter_map(|e| serde_json::from_slice(&e.value).ok()).collect())
}

/// Changes a VM's record by `change` (given the record as it stands, it
/// may refuse), written only if nobody changed it since it was read;
/// else read and changed again. Returns the record written.
pub fn update<E: From<DesiredError>>(
    store: &dyn Store,
    vm: &str,
    mut change: impl FnMut(&mut VmRecord) -> Result<(), E>,
) -> Result<VmRecord, E> {
    let k = store::vm_key(vm);
    loop {
        let read = store.get(&k).map_err(DesiredError::from)?.ok_or_else(|| DesiredError::NoVm(vm.into()))?;
        let mut record = decode(vm, &read.value)?;
        change(&mut record)?;
        if store.replace(&k, encode(&record).as_bytes(), read.revision).map_err(DesiredError::from)? {
            return Ok(record);
        }
    }
}

/// Removes a VM's record: the cluster no longer runs it. False: it had
/// none.
pub fn remove(store: &dyn Store, vm: &str) -> Result<bool, DesiredError> {
    Ok(store.remove(&store::vm_key(vm))?)
}

/// Marks a host as drained (or not): its VMs are moved away, nothing new
/// goes there.
pub fn set_drain(store: &dyn Store, host: &str, drain: bool) -> Result<(), DesiredError> {
    let k = store::drain_key(host);
    if drain {
        store.put(&k, now().to_string().as_bytes())?;
    } else {
        store.remove(&k)?;
    }
    Ok(())
}

/// The hosts marked as drained.
pub fn drained(store: &dyn Store) -> Result<Vec<String>, DesiredError> {
    Ok(store.range(store::DRAIN)?.into_iter().map(|e| e.key[store::DRAIN.len()..].to_string()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_defaults_to_pending() {
        let r: VmRecord = serde_json::from_str(r#"{"spec": {"name": "v"}}"#).unwrap();
        assert_eq!(r.phase, Phase::Pending);
        assert!(!r.held(now()));
        let placed = VmRecord { phase: Phase::Placed { host: "a".into(), at: 5 }, held_until: Some(now() + 60), ..r };
        let text = encode(&placed);
        assert!(text.contains(r#""phase":{"phase":"placed","host":"a","at":5}"#), "{text}");
        assert_eq!(decode("v", text.as_bytes()).unwrap(), placed);
        assert!(placed.held(now()));
    }
}
