//! The agent's Prometheus metrics (`GET /metrics`, the text exposition
//! format): per host, its VMs and memory; per VM, its part, mode and the
//! figures of its pair (lag, log bandwidth, outputs held, checkpoint rate
//! and pause quantiles). Made afresh at each scrape from the VMs' status
//! (a registry built then, encoded by the `prometheus-client` crate, the
//! Prometheus project's own), so no figure is ever stale by more than the
//! scrape.

use crate::control::events::History;
use crate::model::{HostRecord, VmInfo};
use ftvm_api::{PairStatus, PrimaryMode};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;

type Labels = Vec<(String, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

fn vm_label(vm: &str) -> Labels {
    vec![("vm".into(), vm.into())]
}

/// The metrics of a host and its VMs, in the text format. `history`:
/// each VM's failovers and re-protections from the cluster's event log
/// (None: the log could not be read, and those counters are left out
/// rather than shown as 0).
pub fn render(host: &HostRecord, vms: &[VmInfo], history: Option<&HashMap<String, History>>) -> String {
    let mut reg = Registry::with_prefix("ftvm");
    let gauge = |reg: &mut Registry, name: &str, help: &str, v: i64| {
        let g = Gauge::<i64>::default();
        g.set(v);
        reg.register(name, help, g);
    };
    gauge(&mut reg, "host_vms", "VM processes on this host (primaries, backups, unprotected)", vms.len() as i64);
    gauge(&mut reg, "host_memory_bytes", "This host's memory (RAM and swap)", host.memory_bytes as i64);
    gauge(&mut reg, "host_free_memory_bytes", "This host's memory not promised to a VM", host.free_memory_bytes as i64);
    gauge(&mut reg, "host_cores", "This host's CPUs", host.cores as i64);

    let info = Family::<Labels, Gauge>::default();
    let lag = Family::<Labels, FloatGauge>::default();
    let log_bits = Family::<Labels, FloatGauge>::default();
    let held = Family::<Labels, Gauge>::default();
    let held_total = Family::<Labels, Gauge>::default();
    let icount = Family::<Labels, Gauge>::default();
    let generation = Family::<Labels, Gauge>::default();
    let ckpt_rate = Family::<Labels, FloatGauge>::default();
    let ckpt_total = Family::<Labels, Gauge>::default();
    let pause = Family::<Labels, FloatGauge>::default();
    for vm in vms {
        let mode = vm.mode();
        let mut l = vm_label(&vm.name);
        l.push(("role".into(), vm.role.word().into()));
        l.push(("mode".into(), mode));
        info.get_or_create(&l).set(1);
        let Some(status) = &vm.status else { continue };
        icount.get_or_create(&vm_label(&vm.name)).set(status.icount as i64);
        match &status.pair {
            Some(PairStatus::Primary(p)) => {
                let v = vm_label(&vm.name);
                generation.get_or_create(&v).set(p.generation as i64);
                match &p.mode {
                    PrimaryMode::Lockstep(log) | PrimaryMode::Epoch { log, .. } => {
                        lag.get_or_create(&v).set(log.lag_ms as f64 / 1000.0);
                        log_bits.get_or_create(&v).set(log.log_mbit_s * 1e6);
                        held.get_or_create(&v).set(log.held as i64);
                        held_total.get_or_create(&v).set(log.outputs_held_total as i64);
                    }
                    PrimaryMode::Checkpoint(c) => {
                        held.get_or_create(&v).set(c.held as i64);
                        held_total.get_or_create(&v).set(c.outputs_held_total as i64);
                        ckpt_rate.get_or_create(&v).set(c.rate);
                        ckpt_total.get_or_create(&v).set(c.checkpoints as i64);
                        for (q, us) in [("0.5", c.pause_median_us), ("0.99", c.pause_p99_us)] {
                            let mut ql = v.clone();
                            ql.push(("quantile".into(), q.into()));
                            pause.get_or_create(&ql).set(us as f64 / 1e6);
                        }
                    }
                    PrimaryMode::Transfer(_) => {}
                }
            }
            Some(PairStatus::Backup(b)) => {
                let v = vm_label(&vm.name);
                generation.get_or_create(&v).set(b.generation as i64);
                log_bits.get_or_create(&v).set(b.log_mbit_s * 1e6);
            }
            _ => {}
        }
    }
    if let Some(history) = history {
        // Counted from the cluster's event log, not by this agent: a
        // failover is seen on the host the VM went to, and a count kept
        // in an agent would start again from 0 when the agent does.
        // Gauges, not counters: the log keeps its newest events only, so
        // the count of a VM with a long history can fall when it is
        // trimmed, which a counter must never do.
        let failovers = Family::<Labels, Gauge>::default();
        let handovers = Family::<Labels, Gauge>::default();
        let reprotections = Family::<Labels, Gauge>::default();
        let mut names: Vec<&str> = vms.iter().map(|v| v.name.as_str()).collect();
        names.dedup();
        for name in names {
            let h = history.get(name).copied().unwrap_or_default();
            failovers.get_or_create(&vm_label(name)).set(h.failovers as i64);
            handovers.get_or_create(&vm_label(name)).set(h.handovers as i64);
            reprotections.get_or_create(&vm_label(name)).set(h.reprotections as i64);
        }
        reg.register(
            "vm_failovers",
            "Times the VM's backup went live because its primary failed, as the cluster's event log holds",
            failovers,
        );
        reg.register(
            "vm_handovers",
            "Times the VM was handed over on purpose (drain, move, handover), as the cluster's event log holds",
            handovers,
        );
        reg.register(
            "vm_reprotections",
            "Times the VM was protected again after a failover or its backup's failure, as the cluster's event log holds",
            reprotections,
        );
    }
    reg.register("vm_info", "A VM process on this host: its part (role) and mode", info);
    reg.register("vm_instructions", "Instructions the VM has executed (a backup: replayed)", icount);
    reg.register("vm_generation", "The VM's pair generation at the arbiter", generation);
    reg.register("vm_lag_seconds", "How far the backup's replay is behind the primary", lag);
    reg.register("vm_log_bits_per_second", "Logging channel bandwidth lately", log_bits);
    reg.register("vm_outputs_held", "Outputs the Output Rule holds now", held);
    reg.register("vm_outputs_held_total", "Outputs held in all", held_total);
    reg.register("vm_checkpoints_per_second", "Checkpoints a second lately (checkpoint mode)", ckpt_rate);
    reg.register("vm_checkpoints_total", "Checkpoints taken (checkpoint mode)", ckpt_total);
    reg.register("vm_checkpoint_pause_seconds", "The guest's pause per checkpoint, quantiles", pause);
    let mut out = String::new();
    encode(&mut out, &reg).expect("writing to a String does not fail");
    out
}
