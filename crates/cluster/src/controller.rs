//! The cluster's controller: one at a time, elected by a key held under a
//! lease (`/ftvm/controller`, written only if nobody holds it; an agent
//! that stops renewing loses it a lease's time later and another takes
//! over). Every agent runs this loop; only the holder acts.
//!
//! What it does (VMware FT §3.1, "redundancy restored automatically"):
//! each VM whose spec wants protection and that runs without a backup gets
//! one, on the host with the most memory free among those that can take it
//! (never the VM's own host, never one short of memory; of equals, the one
//! with the fewest VMs, to spread pairs). A failed attempt is tried again
//! with a backoff (2 s doubling to 60 s), on another host first. A VM that
//! failed over runs alone on its former backup's host, so it is protected
//! again this way without anyone asking, and a host that joins is a
//! candidate at the next pass.

use crate::agent::HOSTS_PREFIX;
use crate::model::{HostRecord, Role};
use crate::session::Leased;
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The controller's key.
pub const CONTROLLER_KEY: &str = "/ftvm/controller";
/// Its lease.
const LEASE: Duration = Duration::from_secs(10);
/// Time between passes.
const PASS: Duration = Duration::from_secs(2);
const BACKOFF_FIRST: Duration = Duration::from_secs(2);
const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// A VM's failed attempts: when to try again, and the host that failed.
struct Retry {
    at: Instant,
    wait: Duration,
    failed_on: String,
}

/// Runs the controller loop until `stop`.
pub async fn run(id: String, etcd: String, token: String, mut stop: tokio::sync::watch::Receiver<bool>) {
    let endpoints = ftvm_etcd::client::parse_endpoints(&etcd).unwrap_or_default();
    let mut session: Option<Leased> = None;
    let mut leading = false;
    let mut retries: HashMap<String, Retry> = HashMap::new();
    loop {
        let pass = async {
            if session.is_none() {
                session = Some(Leased::open(&endpoints, LEASE).await?);
            }
            let s = session.as_mut().expect("made above");
            s.renew().await?;
            let (client, lease) = (&mut s.client, &s.lease);
            // Take the key if nobody holds it; then see who does.
            let txn = Txn::new()
                .when([Compare::create_revision(CONTROLLER_KEY, CompareOp::Equal, 0)])
                .and_then([TxnOp::put(CONTROLLER_KEY, id.clone(), Some(PutOptions::new().with_lease(*lease)))]);
            client.txn(txn).await?;
            let holder = client.get(CONTROLLER_KEY, None).await?;
            let holder = holder.kvs().first().map(|kv| (kv.lease(), String::from_utf8_lossy(kv.value()).into_owned()));
            let mine = matches!(&holder, Some((l, _)) if *l == *lease);
            let hosts: Vec<HostRecord> = if mine {
                let r = client.get(HOSTS_PREFIX, Some(GetOptions::new().with_prefix())).await?;
                r.kvs().iter().filter_map(|kv| serde_json::from_slice(kv.value()).ok()).collect()
            } else {
                Vec::new()
            };
            Ok::<_, etcd_client::Error>((mine, hosts))
        };
        match tokio::time::timeout(PASS * 3, pass).await {
            Ok(Ok((mine, hosts))) => {
                if mine != leading {
                    eprintln!("ftvm agent: {} the cluster's controller", if mine { "now" } else { "no longer" });
                    leading = mine;
                }
                if mine {
                    restore_redundancy(&etcd, &token, &hosts, &mut retries).await;
                }
            }
            _ => {
                session = None;
                if leading {
                    eprintln!("ftvm agent: no longer the cluster's controller (etcd does not answer)");
                    leading = false;
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(PASS) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    if let Some(s) = session {
        s.revoke().await;
    }
}

/// The host for a backup of a VM of `memory_mib` running on `running_on`
/// (and not on `avoid`, where the last attempt failed, unless it is the
/// only one): the most memory free, then the fewest VMs. None: no host can
/// take it.
pub fn place<'a>(
    hosts: &'a [HostRecord],
    vm: &str,
    running_on: &str,
    memory_mib: u64,
    avoid: Option<&str>,
) -> Option<&'a HostRecord> {
    let fits = |h: &&HostRecord| {
        h.id != running_on && h.free_memory_bytes >= memory_mib << 20 && !h.vms.iter().any(|v| v.name == vm)
    };
    let best = |skip: Option<&str>| {
        hosts
            .iter()
            .filter(fits)
            .filter(|h| Some(h.id.as_str()) != skip)
            .max_by_key(|h| (h.free_memory_bytes, std::cmp::Reverse(h.vms.len()), std::cmp::Reverse(h.id.clone())))
    };
    best(avoid).or_else(|| best(None))
}

/// One pass: every VM that wants protection and runs alone is given a
/// backup (one attempt each, at most, by its backoff).
async fn restore_redundancy(etcd: &str, token: &str, hosts: &[HostRecord], retries: &mut HashMap<String, Retry>) {
    // The VMs that run alone, from the hosts' records; a VM that has a
    // backup anywhere is left alone.
    let with_backup: Vec<&str> =
        hosts.iter().flat_map(|h| h.vms.iter()).filter(|v| v.role == Role::Backup).map(|v| v.name.as_str()).collect();
    for host in hosts {
        for vm in host.vms.iter().filter(|v| v.role == Role::Unprotected && !with_backup.contains(&v.name.as_str())) {
            let Some(mode) = vm.protect.clone() else { continue };
            let now = Instant::now();
            if retries.get(&vm.name).is_some_and(|r| r.at > now) {
                continue;
            }
            let avoid = retries.get(&vm.name).map(|r| r.failed_on.clone());
            let Some(target) = place(hosts, &vm.name, &host.id, vm.memory_mib, avoid.as_deref()) else {
                continue;
            };
            eprintln!("ftvm agent: controller: protecting {} (on {}) with a backup on {}", vm.name, host.id, target.id);
            let (etcd, token, name, on) = (etcd.to_string(), token.to_string(), vm.name.clone(), target.id.clone());
            let result =
                tokio::task::spawn_blocking(move || crate::ops::protect(&etcd, &token, &name, &on, &mode)).await;
            match result {
                Ok(Ok(done)) => {
                    eprintln!("ftvm agent: controller: {}: {}", vm.name, done.message);
                    retries.remove(&vm.name);
                }
                Ok(Err(e)) => {
                    let wait = retries.get(&vm.name).map_or(BACKOFF_FIRST, |r| (r.wait * 2).min(BACKOFF_MAX));
                    eprintln!(
                        "ftvm agent: controller: protecting {} failed ({e}); again in {} s",
                        vm.name,
                        wait.as_secs()
                    );
                    retries.insert(
                        vm.name.clone(),
                        Retry { at: Instant::now() + wait, wait, failed_on: target.id.clone() },
                    );
                }
                Err(e) => eprintln!("ftvm agent: controller: {}: {e}", vm.name),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::HostVm;

    fn host(id: &str, free_mib: u64, vms: &[&str]) -> HostRecord {
        HostRecord {
            id: id.into(),
            api: String::new(),
            address: String::new(),
            cores: 2,
            memory_bytes: 8 << 30,
            free_memory_bytes: free_mib << 20,
            vms: vms
                .iter()
                .map(|n| HostVm { name: n.to_string(), role: Role::Unprotected, protect: None, memory_mib: 0 })
                .collect(),
            version: String::new(),
        }
    }

    #[test]
    fn a_backup_goes_where_there_is_room_never_on_its_primarys_host() {
        let hosts = [host("a", 8000, &["v"]), host("b", 300, &[]), host("c", 2000, &["x", "y"]), host("d", 2000, &[])];
        // The most free memory: the primary's own host, never.
        assert_eq!(place(&hosts, "v", "a", 512, None).unwrap().id, "d");
        // Too little memory on every other host: nowhere.
        assert!(place(&hosts, "v", "a", 4000, None).is_none());
        // Of equals, the one with fewer VMs; a host that failed last is
        // tried after the others.
        assert_eq!(place(&hosts, "v", "a", 512, Some("d")).unwrap().id, "c");
        assert_eq!(place(&hosts[..2], "v", "a", 100, Some("b")).unwrap().id, "b");
    }
}
