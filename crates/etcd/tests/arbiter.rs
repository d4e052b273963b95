//! The arbiter on a real etcd cluster (Debian's etcd-server, started
//! here on loopback): one winner per generation, the started and
//! superseded rules, the storage token, and a side that waits while etcd
//! has no quorum and decides once it has.

use ftvm_etcd::local::LocalEtcd;
use ftvm_etcd::{Etcd, EtcdArbiter};
use ftvm_replication::arbiter::{Arbiter, ArbiterNote, ArbiterStore, StorageMismatch, Verdict};
use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ftvm-etcd-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn store(cluster: &LocalEtcd, vm: &str) -> Arc<dyn ArbiterStore> {
    let etcd = Arc::new(Etcd::new(cluster.client_endpoints().unwrap()).unwrap());
    Arc::new(EtcdArbiter::new(etcd, vm).unwrap())
}

#[test]
fn one_winner_per_generation_and_only_a_started_unsuperseded_one() {
    let dir = scratch("rules");
    let cluster = LocalEtcd::start(1, &dir).unwrap();
    let s = store(&cluster, "vm-a");
    let g1 = Arbiter::claim_generation(s.clone(), "primary on a").unwrap();
    assert_eq!(g1.generation(), 1);
    // Not started yet: nobody may go live.
    let v = Arbiter::new(s.clone(), 1).go_live("backup on b", |_| {});
    assert!(matches!(&v, Verdict::Lost(w) if w.contains("never started")), "{v:?}");
    g1.mark_started().unwrap();
    // Eight racers, one winner, and every loser names it.
    let barrier = Arc::new(Barrier::new(8));
    let racers: Vec<_> = (0..8)
        .map(|i| {
            let (s, barrier) = (s.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                Arbiter::new(s, 1).go_live(&format!("racer{i}"), |_| {})
            })
        })
        .collect();
    let verdicts: Vec<Verdict> = racers.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(verdicts.iter().filter(|v| **v == Verdict::Won).count(), 1, "{verdicts:?}");
    let who = g1.winner().unwrap();
    assert!(verdicts.iter().all(|v| *v == Verdict::Won || *v == Verdict::Lost(who.clone())), "{verdicts:?}");
    // A new pair of the VM: a fresh generation; once it starts, the old
    // generation's sides are superseded.
    let g2 = Arbiter::claim_generation(s.clone(), "primary on b").unwrap();
    assert_eq!(g2.generation(), 2);
    let g3 = Arbiter::claim_generation(s.clone(), "primary on b").unwrap();
    assert_eq!(g3.generation(), 3);
    g3.mark_started().unwrap();
    let v = Arbiter::new(s.clone(), 2).go_live("old backup", |_| {});
    assert!(matches!(&v, Verdict::Lost(w) if w.contains("generation 3")), "{v:?}");
    assert_eq!(Arbiter::new(s.clone(), 3).go_live("backup on c", |_| {}), Verdict::Won);
    // Another VM's generations are its own.
    let other = store(&cluster, "vm-b");
    assert_eq!(Arbiter::claim_generation(other, "p").unwrap().generation(), 1);
    // The token proves the store; another VM's record, or none, does not.
    Arbiter::check_storage(&*s, 3, g3.storage_token()).unwrap();
    assert!(matches!(Arbiter::check_storage(&*s, 3, "00"), Err(StorageMismatch::OtherToken { .. })));
    assert!(matches!(Arbiter::check_storage(&*s, 9, g3.storage_token()), Err(StorageMismatch::NoRecord { .. })));
    // A claim whose start failed before its header went out is taken back.
    let g4 = Arbiter::claim_generation(s.clone(), "p").unwrap();
    s.abandon(g4.generation());
    assert_eq!(Arbiter::claim_generation(s.clone(), "p").unwrap().generation(), 4);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_side_waits_while_etcd_has_no_quorum_and_decides_once_it_has() {
    let dir = scratch("quorum");
    let mut cluster = LocalEtcd::start(3, &dir).unwrap();
    let s = store(&cluster, "vm-q");
    let g = Arbiter::claim_generation(s.clone(), "primary").unwrap();
    g.mark_started().unwrap();
    // One member down: a majority remains, nothing changes.
    cluster.kill_member(2);
    let t0 = Instant::now();
    let one_down = Arbiter::claim_generation(s.clone(), "primary").unwrap();
    // An election on a loaded host may outlast a request: the claim rides it out.
    assert!(t0.elapsed() < Duration::from_secs(25), "{:?}", t0.elapsed());
    assert_eq!(one_down.generation(), 2);
    // Two down: no quorum. The side that wants to go live waits, told once.
    cluster.kill_member(1);
    let (tx, rx) = std::sync::mpsc::channel();
    let waiting = {
        let s = s.clone();
        std::thread::spawn(move || {
            Arbiter::new(s, 1).go_live("backup", |n| {
                let _ = tx.send(n);
            })
        })
    };
    let note = rx.recv_timeout(Duration::from_secs(30)).expect("told that etcd cannot be reached");
    assert!(matches!(&note, ArbiterNote::StorageUnreachable { store, .. } if store.contains("vm-q")), "{note:?}");
    std::thread::sleep(Duration::from_secs(3));
    assert!(!waiting.is_finished(), "decided without a quorum");
    // Quorum back: it wins (nobody else claimed), and was told only once.
    let back = Instant::now();
    cluster.start_member(1).unwrap();
    assert_eq!(waiting.join().unwrap(), Verdict::Won);
    assert!(back.elapsed() < Duration::from_secs(30), "{:?}", back.elapsed());
    assert!(rx.try_recv().is_err(), "told more than once");
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}
