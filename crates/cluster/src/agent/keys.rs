//! A VM's pair key across the cluster: both hosts of a pair must hold the
//! same key (it authenticates and encrypts their channel and heartbeats),
//! so the cluster keeps one per VM in etcd (`/ftvm/keys/<vm>`,
//! [`crate::store`]). The first
//! agent that needs it makes it (a transaction that writes only if there
//! is none, so two agents racing agree); each agent writes it to a file of
//! its own, mode 0600, for its ftvm processes.
//!
//! Whoever can read etcd can read these keys: the cluster's etcd takes
//! clients by a certificate of the cluster's authority only, over TLS
//! (etcd's `--client-cert-auth`; [`crate::authority::credentials`]).

use crate::store::session::{self, CreateOrReadError};
use ftvm_replication::pair_key::PairKey;
use std::path::Path;

/// Writes the VM's key to `path`, from etcd, making it first if the
/// cluster has none. Err: why, in one line.
pub async fn ensure(endpoints: &ftvm_etcd::Endpoints, vm: &str, path: &Path) -> Result<(), String> {
    // A fresh key, written only if the cluster has none yet.
    let fresh = path.with_extension("new");
    let _ = std::fs::remove_file(&fresh);
    PairKey::create(&fresh).map_err(|e| e.to_string())?;
    let line = std::fs::read_to_string(&fresh).map_err(|e| e.to_string());
    let _ = std::fs::remove_file(&fresh);
    let value = session::create_or_read(endpoints, &crate::store::pair_key_key(vm), line?.as_bytes()).await.map_err(
        |e| match e {
            CreateOrReadError::Vanished => "the pair key vanished from etcd".to_string(),
            e => format!("cannot get VM {vm}'s pair key from etcd: {e}"),
        },
    )?;
    let _ = std::fs::remove_file(path);
    crate::authority::files::create(path, &value, 0o600).map_err(|e| e.to_string())?;
    // What etcd held must be a key.
    PairKey::read(path).map(|_| ()).map_err(|e| e.to_string())
}
