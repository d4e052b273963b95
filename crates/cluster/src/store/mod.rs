//! The cluster's store: what the cluster keeps in etcd, under which key,
//! and every read and transaction on it. No other module names a key or
//! speaks to etcd (the VMs' own arbiter is `ftvm_etcd::arbiter`'s, in
//! their processes).
//!
//! # The keys
//!
//! | key | value | written by | lease |
//! |---|---|---|---|
//! | `/ftvm/hosts/<host>` | the host's [`HostRecord`](crate::model::HostRecord), JSON | its agent, rewritten when it changed | the agent's, 10 s: the host leaves the cluster when its agent does |
//! | `/ftvm/controller` | the controlling agent's host id | the agent that takes it, only if nobody holds it | that agent's, 10 s |
//! | `/ftvm/vms/<vm>` | the VM's [`VmRecord`](crate::control::desired::VmRecord), JSON: its spec, wanted protection and phase | clients (the spec), the controller (the phase), each against the record's revision | none |
//! | `/ftvm/drain/<host>` | the Unix time the drain began | clients (`host drain`, `undrain`) | none |
//! | `/ftvm/events/<host>/<vm>/<pid>/<seq>` | a VM process's pair event ([`ClusterEvent`](crate::control::events::ClusterEvent)), JSON | the VM's agent, only if absent (a re-read event writes nothing) | none: the events of a host's death outlive it |
//! | `/ftvm/events/<host>/controller/<unix ms>-<n>` | an action of the controller, JSON | the controller | none |
//! | `/ftvm/keys/<vm>` | the VM's pair key (its file's line) | the first agent that needs it, only if absent | none |
//! | `/ftvm/arbiter/<vm>/...` | the pair's generations | the VM's processes (`ftvm_etcd::arbiter`, not this store) | none |
//!
//! # The store
//!
//! [`Store`] is what the control plane and the agent need of a key-value
//! store with revisions (etcd's model: every write gets the next revision
//! of the whole store, kept as the key's modification revision): reads by
//! key, by prefix and since a revision, and the few compare-and-swap
//! writes the cluster relies on ([`Store::create`], [`Store::replace`],
//! [`Store::remove`]). [`etcd::EtcdStore`] is the cluster's;
//! [`memory::MemoryStore`] keeps the same in a map, for tests of the
//! control plane without etcd. The keys held under a lease (a host's
//! record, the controller's key) are written through a [`session::Leased`]
//! session of the agent's loops, etcd's only.

pub mod etcd;
pub mod memory;
pub mod session;

pub use etcd::EtcdStore;
pub use memory::MemoryStore;

/// Where hosts record themselves: `/ftvm/hosts/<host>`.
pub const HOSTS: &str = "/ftvm/hosts/";
/// The lease of a host's record: it disappears this long after its agent
/// stops renewing it (the controller waits it out before it takes a
/// backup listed by a record for one no primary follows into).
pub const HOST_LEASE: std::time::Duration = std::time::Duration::from_secs(10);
/// The controller's key.
pub const CONTROLLER: &str = "/ftvm/controller";
/// Where the VMs' records live: `/ftvm/vms/<vm>`.
pub const VMS: &str = "/ftvm/vms/";
/// Where drained hosts are marked: `/ftvm/drain/<host>`.
pub const DRAIN: &str = "/ftvm/drain/";
/// Where the event log is kept.
pub const EVENTS: &str = "/ftvm/events/";
/// Where the VMs' pair keys live: `/ftvm/keys/<vm>`.
pub const PAIR_KEYS: &str = "/ftvm/keys/";

/// A host's record.
pub fn host_key(host: &str) -> String {
    format!("{HOSTS}{host}")
}

/// A VM's record.
pub fn vm_key(vm: &str) -> String {
    format!("{VMS}{vm}")
}

/// A drained host's mark.
pub fn drain_key(host: &str) -> String {
    format!("{DRAIN}{host}")
}

/// A VM's pair key.
pub fn pair_key_key(vm: &str) -> String {
    format!("{PAIR_KEYS}{vm}")
}

/// A VM process's event: the same for the same event read twice (a
/// follower that starts again), so writing it is idempotent.
pub fn pair_event_key(host: &str, vm: &str, pid: u32, seq: u64) -> String {
    format!("{EVENTS}{host}/{vm}/{pid}/{seq:010}")
}

/// A controller's event.
pub fn controller_event_key(host: &str, unix_ms: u64, n: u64) -> String {
    format!("{EVENTS}{host}/controller/{unix_ms:013}-{n}")
}

/// A key, its value and the revision that last wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub value: Vec<u8>,
    /// The store's revision at the key's last write: a transaction
    /// written only if nobody wrote since compares it ([`Store::replace`]).
    pub revision: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// etcd refused or did not answer in time.
    #[error("{0}")]
    Etcd(#[from] ftvm_etcd::EtcdError),
}

/// A key-value store with revisions, as the cluster uses etcd. Each write
/// is one transaction: it happens whole or not at all, and a conditional
/// one says whether its condition held.
pub trait Store: Send + Sync {
    /// The entry at `key`, if there is one.
    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError>;
    /// The entries under `prefix`, sorted by key.
    fn range(&self, prefix: &str) -> Result<Vec<Entry>, StoreError>;
    /// The entries under `prefix` last written after revision `after`,
    /// oldest write first.
    fn range_since(&self, prefix: &str, after: i64) -> Result<Vec<Entry>, StoreError>;
    /// The keys under `prefix` and their revisions, without their values
    /// (for deciding what to delete).
    fn keys(&self, prefix: &str) -> Result<Vec<(String, i64)>, StoreError>;
    /// Writes `value` at `key` only if there is no such key: whether it
    /// wrote.
    fn create(&self, key: &str, value: &[u8]) -> Result<bool, StoreError>;
    /// Writes `value` at `key` only if nobody wrote the key since revision
    /// `revision` (the one read with it): whether it wrote.
    fn replace(&self, key: &str, value: &[u8], revision: i64) -> Result<bool, StoreError>;
    /// Writes `value` at `key`, whatever is there.
    fn put(&self, key: &str, value: &[u8]) -> Result<(), StoreError>;
    /// Deletes `key`: whether it was there.
    fn remove(&self, key: &str) -> Result<bool, StoreError>;
    /// Deletes every one of `keys`, in one transaction.
    fn remove_all(&self, keys: &[String]) -> Result<(), StoreError>;
}
