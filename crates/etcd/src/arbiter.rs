//! The split-brain arbiter on etcd (VMware FT §4.1's "third-party server",
//! here a majority of etcd's members): one VM's generations under a prefix
//! of its own, each step one transaction, so the cluster's quorum decides
//! exactly once per pair and generation. While etcd has no quorum every
//! request fails after its deadline, and the side that wants to go live
//! waits ([`ftvm_replication::arbiter::Arbiter::go_live`] retries), as it
//! would for an unreachable shared directory.
//!
//! Keys, under `<prefix>` (`/ftvm/arbiter/<vm>` for a VM named `vm`):
//! - `gen/<N>`: generation N claimed; `{"pair": ..., "token": ...}`
//! - `started/<N>`: generation N's pair started
//! - `live/<N>`: the test-and-set; the winner's name
//!
//! N is written with 20 digits, so keys sort as numbers and "no newer
//! generation started" is one comparison over a key range.

use crate::client::{Etcd, EtcdError};
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use ftvm_replication::arbiter::{ArbiterError, ArbiterStore, Attempt, CLAIM_TRIES};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where the arbiter keys of all VMs live.
pub const ARBITER_ROOT: &str = "/ftvm/arbiter";

/// How long a claim rides out an etcd that does not answer (see
/// `claim_next` below); beyond it, the start fails with etcd's
/// last error.
const CLAIM_PATIENCE: Duration = Duration::from_secs(20);

/// A generation's claim as recorded.
#[derive(Serialize, Deserialize)]
struct Claim {
    pair: String,
    token: String,
}

/// One VM's arbiter in etcd.
pub struct EtcdArbiter {
    etcd: Arc<Etcd>,
    vm: String,
    prefix: String,
}

/// Whether `name` can name a VM: 1 to 64 of `[A-Za-z0-9._-]`, not
/// starting with `-`. The one grammar of VM names, for every entry point
/// (the API, the dashboard, `--vm-name`): a name becomes etcd keys, file
/// names under the agent's state directory and arguments of the VM's
/// command line, where a leading `-` would be read as an option (issue
/// 68: the name `-ci` was accepted and its process died of `-c`).
pub fn valid_vm_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && !name.starts_with('-')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && name != "."
        && name != ".."
}

impl EtcdArbiter {
    /// The arbiter of the VM named `vm` in the cluster `etcd`.
    pub fn new(etcd: Arc<Etcd>, vm: &str) -> Result<EtcdArbiter, EtcdError> {
        if !valid_vm_name(vm) {
            return Err(EtcdError::Request {
                endpoints: etcd.endpoints(),
                problem: format!("{vm:?} is not a VM name (1 to 64 of A-Z a-z 0-9 . _ -)"),
            });
        }
        Ok(EtcdArbiter { prefix: format!("{ARBITER_ROOT}/{vm}"), vm: vm.to_string(), etcd })
    }

    fn key(&self, what: &str, generation: u64) -> String {
        format!("{}/{what}/{generation:020}", self.prefix)
    }

    /// The highest generation claimed so far (0: none).
    fn highest(&self) -> Result<u64, EtcdError> {
        let last = self.etcd.get_prefix(&format!("{}/gen/", self.prefix), 1)?;
        Ok(last.first().and_then(|(k, _)| k.rsplit('/').next()?.parse().ok()).unwrap_or(0))
    }

    /// One claim of the next free generation: etcd's answer, or its error.
    fn try_claim_next(&self, pair: &str, token: &str) -> Result<u64, ArbiterError> {
        let unreachable = |e: EtcdError| ArbiterError::Unreachable { store: self.describe(), problem: e.to_string() };
        let first = self.highest().map_err(unreachable)? + 1;
        let value =
            serde_json::to_string(&Claim { pair: pair.into(), token: token.into() }).expect("a claim serializes");
        for generation in first..first + CLAIM_TRIES {
            let key = self.key("gen", generation);
            let txn = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key, value.clone(), None::<PutOptions>)]);
            let r = self.etcd.txn(txn).map_err(|e| ArbiterError::Claim {
                store: self.describe(),
                generation,
                problem: e.to_string(),
            })?;
            if r.succeeded() {
                return Ok(generation);
            }
        }
        Err(ArbiterError::AllTaken { store: self.describe(), first, tries: CLAIM_TRIES })
    }
}

/// The value of the first key a transaction's get returned.
fn first_value(op: Option<&TxnOpResponse>) -> Option<String> {
    match op {
        Some(TxnOpResponse::Get(r)) => r.kvs().first().map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
        _ => None,
    }
}

/// The generation in the first key a transaction's get returned.
fn first_generation(op: Option<&TxnOpResponse>) -> Option<u64> {
    match op {
        Some(TxnOpResponse::Get(r)) => {
            r.kvs().first().and_then(|kv| String::from_utf8_lossy(kv.key()).rsplit('/').next()?.parse().ok())
        }
        _ => None,
    }
}

impl ArbiterStore for EtcdArbiter {
    fn describe(&self) -> String {
        format!("etcd ({}) for VM {}", self.etcd.endpoints(), self.vm)
    }

    fn claim_next(&self, pair: &str, token: &str) -> Result<u64, ArbiterError> {
        let since = Instant::now();
        loop {
            match self.try_claim_next(pair, token) {
                // A request fails after etcd's request timeout; an election
                // on a loaded host can take longer than that, and a pair's
                // start should not fail for it. A retried claim whose first
                // try was recorded but not answered takes the next
                // generation: the skipped one never starts, so no side of
                // it can go live.
                Err(ArbiterError::Unreachable { .. } | ArbiterError::Claim { .. })
                    if since.elapsed() < CLAIM_PATIENCE => {}
                done => return done,
            }
        }
    }

    fn token(&self, generation: u64) -> Result<Option<String>, String> {
        let v = self.etcd.get(&self.key("gen", generation)).map_err(|e| e.to_string())?;
        Ok(v.and_then(|v| serde_json::from_slice::<Claim>(&v).ok()).map(|c| c.token))
    }

    fn mark_started(&self, generation: u64) -> Result<(), ArbiterError> {
        let key = self.key("started", generation);
        let txn = Txn::new().when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)]).and_then([TxnOp::put(
            key,
            "",
            None::<PutOptions>,
        )]);
        self.etcd.txn(txn).map(|_| ()).map_err(|e| ArbiterError::Start {
            store: self.describe(),
            generation,
            problem: e.to_string(),
        })
    }

    fn try_go_live(&self, generation: u64, me: &str) -> Result<Attempt, String> {
        let live = self.key("live", generation);
        let started = self.key("started", generation);
        // Every started generation after this one: [started/N+1, started0).
        let newer_from = self.key("started", generation + 1);
        let newer_end = format!("{}/started0", self.prefix);
        // One transaction: nobody won, this generation started, no newer
        // one has. Otherwise it reads why (in the same revision).
        let txn = Txn::new()
            .when([
                Compare::create_revision(live.clone(), CompareOp::Equal, 0),
                Compare::create_revision(started.clone(), CompareOp::Greater, 0),
                Compare::create_revision(newer_from.clone(), CompareOp::Equal, 0).with_range(newer_end.clone()),
            ])
            .and_then([TxnOp::put(live.clone(), me, None::<PutOptions>)])
            .or_else([
                TxnOp::get(live, None),
                TxnOp::get(started, None),
                TxnOp::get(
                    newer_from.clone(),
                    Some(
                        GetOptions::new()
                            .with_range(newer_end)
                            .with_sort(etcd_client::SortTarget::Key, etcd_client::SortOrder::Descend)
                            .with_limit(1),
                    ),
                ),
            ]);
        let r = self.etcd.txn(txn).map_err(|e| e.to_string())?;
        if r.succeeded() {
            return Ok(Attempt::Won);
        }
        let ops = r.op_responses();
        if let Some(winner) = first_value(ops.first()) {
            return Ok(Attempt::Lost(winner));
        }
        if let Some(n) = first_generation(ops.get(2)) {
            return Ok(Attempt::Lost(format!("generation {n}, a newer pair of this VM")));
        }
        if first_value(ops.get(1)).is_none() {
            return Ok(Attempt::Lost(format!("nobody: generation {generation} never started")));
        }
        // Nothing explains the refusal: another try decides.
        Ok(Attempt::Again)
    }

    fn winner(&self, generation: u64) -> Result<Option<String>, String> {
        let v = self.etcd.get(&self.key("live", generation)).map_err(|e| e.to_string())?;
        Ok(v.map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    fn abandon(&self, generation: u64) {
        let key = self.key("gen", generation);
        let started = self.key("started", generation);
        // Only a claim whose pair never started.
        let txn = Txn::new()
            .when([Compare::create_revision(started, CompareOp::Equal, 0)])
            .and_then([TxnOp::delete(key, None)]);
        let _ = self.etcd.txn(txn);
    }
}
