//! A VM's pair key across the cluster: both hosts of a pair must hold the
//! same key (it authenticates and encrypts their channel and heartbeats),
//! so the cluster keeps one per VM in etcd (`/ftvm/keys/<vm>`). The first
//! agent that needs it makes it (a transaction that writes only if there
//! is none, so two agents racing agree); each agent writes it to a file of
//! its own, mode 0600, for its ftvm processes.
//!
//! Whoever can read etcd can read these keys: the cluster's etcd takes
//! clients by a certificate of the cluster's authority only, over TLS
//! (etcd's `--client-cert-auth`; [`crate::credentials`]).

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use ftvm_replication::pair_key::PairKey;
use std::path::Path;

/// Where the VMs' keys live.
pub const KEYS_PREFIX: &str = "/ftvm/keys/";

/// Writes the VM's key to `path`, from etcd, making it first if the
/// cluster has none. Err: why, in one line.
pub async fn ensure(endpoints: &ftvm_etcd::Endpoints, vm: &str, path: &Path) -> Result<(), String> {
    let etcd_err = |e: etcd_client::Error| format!("cannot get VM {vm}'s pair key from etcd: {e}");
    // Each member in turn until one answers (a dead one fails its try).
    let mut result = Err("no etcd member".to_string());
    for _ in 0..endpoints.urls().len() {
        let mut client = crate::session::connect(endpoints).await.map_err(etcd_err)?;
        result = fetch(&mut client, vm, path).await;
        if result.is_ok() {
            break;
        }
        crate::session::next_member();
    }
    result
}

async fn fetch(client: &mut etcd_client::Client, vm: &str, path: &Path) -> Result<(), String> {
    let etcd_err = |e: etcd_client::Error| format!("cannot get VM {vm}'s pair key from etcd: {e}");
    let key = format!("{KEYS_PREFIX}{vm}");
    // A fresh key, written only if the cluster has none yet.
    let fresh = path.with_extension("new");
    let _ = std::fs::remove_file(&fresh);
    PairKey::create(&fresh).map_err(|e| e.to_string())?;
    let line = std::fs::read_to_string(&fresh).map_err(|e| e.to_string());
    let _ = std::fs::remove_file(&fresh);
    let txn = Txn::new().when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)]).and_then([TxnOp::put(
        key.clone(),
        line?,
        None,
    )]);
    client.txn(txn).await.map_err(etcd_err)?;
    let got = client.get(key, None).await.map_err(etcd_err)?;
    let value = got.kvs().first().map(|kv| kv.value().to_vec()).ok_or("the pair key vanished from etcd")?;
    let _ = std::fs::remove_file(path);
    crate::credentials::create(path, &value, 0o600).map_err(|e| e.to_string())?;
    // What etcd held must be a key.
    PairKey::read(path).map(|_| ()).map_err(|e| e.to_string())
}
