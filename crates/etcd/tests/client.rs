//! The blocking client on a real etcd cluster (Debian's etcd-server,
//! started here on loopback) whose leader vanishes: frozen (SIGSTOP), it
//! keeps its connections and answers nothing, as a host whose switch port
//! went down. A write must go through as soon as the other two have
//! elected a new leader, not at the end of a try spent on the frozen
//! member or on a follower that forwarded it there.

use ftvm_etcd::local::LocalEtcd;
use ftvm_etcd::{Endpoints, Etcd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ftvm-etcd-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// What the member at `url` says: (its id, the leader's id), or None if it
/// does not answer within 200 ms.
fn status(rt: &tokio::runtime::Runtime, url: &str) -> Option<(u64, u64)> {
    rt.block_on(async {
        let ask = async {
            let mut c = etcd_client::Client::connect([url], None).await.ok()?;
            let r = c.status().await.ok()?;
            Some((r.header()?.member_id(), r.leader()))
        };
        tokio::time::timeout(Duration::from_millis(200), ask).await.ok().flatten()
    })
}

fn put(key: &str) -> etcd_client::Txn {
    etcd_client::Txn::new().and_then([etcd_client::TxnOp::put(key, "x", None)])
}

#[test]
fn a_write_goes_through_right_after_a_vanished_leaders_successor_is_elected() {
    let dir = scratch("client");
    let mut cluster = LocalEtcd::start(3, &dir).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let urls: Vec<String> = (0..3).map(|i| cluster.member_endpoint(i)).collect();
    // The leader, and its id.
    let until = Instant::now() + Duration::from_secs(20);
    let (leader, leader_id) = loop {
        let found = (0..3).find_map(|i| status(&rt, &urls[i]).filter(|(me, l)| me == l).map(|(me, _)| (i, me)));
        if let Some(found) = found {
            break found;
        }
        assert!(Instant::now() < until, "no leader in 20 s (logs in {})", dir.display());
        std::thread::sleep(Duration::from_millis(100));
    };
    // The client asks the leader first (as a backup's client asks its own
    // host's member, which may have been the dead host's leader).
    let order: Vec<String> =
        std::iter::once(urls[leader].clone()).chain((0..3).filter(|&i| i != leader).map(|i| urls[i].clone())).collect();
    let etcd = Etcd::new(Endpoints::parse(&order.join(","), None).unwrap()).unwrap();
    etcd.txn(put("/t/before")).unwrap();

    cluster.freeze_member(leader);
    let frozen = Instant::now();
    // When a survivor first says it leads (asked every 10 ms).
    let survivors: Vec<String> = (0..3).filter(|&i| i != leader).map(|i| urls[i].clone()).collect();
    let watcher = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        while frozen.elapsed() < Duration::from_secs(15) {
            if survivors.iter().any(|u| status(&rt, u).is_some_and(|(me, l)| me == l && me != leader_id)) {
                return Some(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    });
    // As the arbiter does: a request that found no leader by its deadline
    // (an election that took two rounds) is made again.
    let written = loop {
        match etcd.txn(put("/t/after")) {
            Err(e) if frozen.elapsed() < Duration::from_secs(15) => eprintln!("not yet: {e}"),
            done => break done,
        }
    };
    let done = Instant::now();
    let elected = watcher.join().unwrap().expect("the survivors elected no leader in 15 s");
    cluster.thaw_member(leader);
    let took = done - frozen;
    let after_election = done.saturating_duration_since(elected);
    eprintln!(
        "the leader frozen; a new one seen after {:?}; the write answered after {took:?} ({after_election:?} after it)",
        elected - frozen
    );
    written.unwrap_or_else(|e| panic!("the write failed after {took:?}: {e} (logs in {})", dir.display()));
    // The new leader is found by asking every 50 ms (plus an answer's
    // time on a loaded host); a try left to its end would cost up to
    // 0.4-1.2 s more.
    assert!(after_election < Duration::from_millis(300), "answered {after_election:?} after the election");
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}
