//! A VM's directory on a host belongs to the process that runs in it: the
//! controller clearing away an ended process of a VM (`forget_ended`, the
//! agent's `DELETE ...?ended_only=true`) while the same host starts a new
//! process of that VM (a move back to a host that held its old backup)
//! must not remove the new one's directory under it. Seen in the dashboard
//! test: "move redis to backup: cannot write the console log". Uses the
//! built image (`make image`): a start copies its root disk.

use ftvm_cluster::agent::vms::Vms;
use ftvm_cluster::model::{ApiError, VmSpec};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Clears away `name`'s ended process, waiting until it has ended: Ok once
/// forgotten.
fn forget_when_ended(vms: &Vms, name: &str) {
    let t0 = Instant::now();
    loop {
        match vms.forget_ended(name) {
            Ok(_) => return,
            Err(ApiError::Conflict(_)) => {}
            Err(e) => panic!("forgetting {name}: {e}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "{name}'s process did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_start_is_not_undone_by_clearing_away_the_ended_process_before_it() {
    let scratch = std::env::temp_dir().join(format!("ftvm-vm-directory-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    // The agent's VMs are tokio child processes: a runtime's reactor reaps them.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let _in_runtime = runtime.enter();
    let (events, _keep) = tokio::sync::mpsc::channel(64);
    // The VM's process is a script that ends after a second, as a backup
    // stopped after its move does; what matters is its directory.
    let process = scratch.join("vm-process");
    std::fs::write(&process, "#!/bin/sh\nexec sleep 1\n").unwrap();
    std::fs::set_permissions(&process, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let vms = Vms::new("host", &scratch, &process, &ftvm_image::images_dir(), 64 << 30, events);
    let spec: VmSpec = serde_json::from_str(r#"{"name": "redis", "memory_mib": 64}"#).unwrap();

    for round in 0..5 {
        vms.create(spec.clone()).unwrap_or_else(|e| panic!("round {round}: the first start: {e}"));
        // Let it end, then start it again while the controller clears
        // away the ended process (as it does each pass). The new process
        // runs on through the clearing away (an ended one may be cleared).
        let ended = Instant::now();
        while runtime.block_on(vms.info("redis")).expect("the VM is known").ended.is_none() {
            assert!(ended.elapsed() < Duration::from_secs(60), "the process did not end");
            std::thread::sleep(Duration::from_millis(10));
        }
        // The clearing away comes once the start is under way (the old
        // directory cleared, the mark gone, and the new disk being copied),
        // as the controller's did in the dashboard test.
        let mark = scratch.join("vms/redis/the-ended-process");
        std::fs::write(&mark, "").unwrap();
        let starting = AtomicBool::new(true);
        std::thread::scope(|s| {
            s.spawn(|| {
                let disk = scratch.join("vms/redis/disk.img");
                while (mark.exists() || !disk.exists()) && starting.load(Ordering::Relaxed) {
                    std::thread::yield_now();
                }
                match vms.forget_ended("redis") {
                    Ok(_) | Err(ApiError::Conflict(_)) | Err(ApiError::NotFound(_)) => {}
                    Err(e) => panic!("forgetting: {e}"),
                }
            });
            let started = vms.create(spec.clone());
            starting.store(false, Ordering::Relaxed);
            started.unwrap_or_else(|e| panic!("round {round}: a start beside the clearing away failed: {e}"));
        });
        assert!(scratch.join("vms/redis/disk.img").exists(), "round {round}: the new process's disk is gone");
        forget_when_ended(&vms, "redis");
    }
    let _ = std::fs::remove_dir_all(&scratch);
}
