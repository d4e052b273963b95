//! The store on the cluster's etcd: each of [`Store`]'s writes one etcd
//! transaction (a conditional one compares the key's create or
//! modification revision), through `ftvm_etcd`'s blocking client, which
//! gives every request a deadline and retries it across a leader change.
//! Its calls block: the agent's async tasks make them on the blocking
//! pool.

use super::{Entry, Store, StoreError};
use etcd_client::{Compare, CompareOp, DeleteOptions, Txn, TxnOp};
use ftvm_etcd::{Endpoints, Etcd};

/// The cluster's etcd as a [`Store`].
pub struct EtcdStore {
    /// Its blocking client has a runtime of its own, which may not be
    /// dropped on an async thread: an owner on one keeps it for good (or
    /// drops it on the blocking pool).
    etcd: Etcd,
}

impl EtcdStore {
    /// The store at `endpoints`; nothing is contacted yet.
    pub fn new(endpoints: Endpoints) -> Result<EtcdStore, StoreError> {
        Ok(EtcdStore { etcd: Etcd::new(endpoints)? })
    }

    /// Runs `txn`: whether its comparisons held.
    fn txn(&self, txn: Txn) -> Result<bool, StoreError> {
        Ok(self.etcd.txn(txn)?.succeeded())
    }
}

impl Store for EtcdStore {
    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        Ok(self.etcd.get_versioned(key)?.map(|(value, revision)| Entry { key: key.into(), value, revision }))
    }

    fn range(&self, prefix: &str) -> Result<Vec<Entry>, StoreError> {
        // Everything written after revision 0 is everything there.
        let mut entries = self.range_since(prefix, 0)?;
        entries.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(entries)
    }

    fn range_since(&self, prefix: &str, after: i64) -> Result<Vec<Entry>, StoreError> {
        Ok(self
            .etcd
            .get_prefix_since(prefix, after)?
            .into_iter()
            .map(|(key, value, revision)| Entry { key, value, revision })
            .collect())
    }

    fn keys(&self, prefix: &str) -> Result<Vec<(String, i64)>, StoreError> {
        Ok(self.etcd.keys_prefix(prefix)?)
    }

    fn create(&self, key: &str, value: &[u8]) -> Result<bool, StoreError> {
        self.txn(
            Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key, value, None)]),
        )
    }

    fn replace(&self, key: &str, value: &[u8], revision: i64) -> Result<bool, StoreError> {
        self.txn(
            Txn::new()
                .when([Compare::mod_revision(key, CompareOp::Equal, revision)])
                .and_then([TxnOp::put(key, value, None)]),
        )
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.txn(Txn::new().and_then([TxnOp::put(key, value, None)])).map(|_| ())
    }

    fn remove(&self, key: &str) -> Result<bool, StoreError> {
        self.txn(
            Txn::new()
                .when([Compare::create_revision(key, CompareOp::Greater, 0)])
                .and_then([TxnOp::delete(key, None)]),
        )
    }

    fn remove_all(&self, keys: &[String]) -> Result<(), StoreError> {
        let ops: Vec<TxnOp> = keys.iter().map(|k| TxnOp::delete(k.as_str(), None::<DeleteOptions>)).collect();
        self.txn(Txn::new().and_then(ops)).map(|_| ())
    }
}
