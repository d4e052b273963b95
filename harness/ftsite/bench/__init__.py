"""The benchmarks, one module each; bench/README.md tells what each
measures and how to read it. Each runs as

    harness/run ftsite.bench.NAME [OPTIONS]     (python3 -m ftsite.bench.NAME with harness/ on PYTHONPATH)
    bench/NAME [OPTIONS]                        (the same, through a three-line wrapper)

with NAME one of failover, ft_overhead, ft_network, lag_control,
epoch_table, checkpoint (fault tolerance, on ftsite's two-host site),
cluster_redundancy (three hosts with etcd and agents) and
vs_qemu, cpu_core, redis, dirty_tracking, record_replay, record_overhead,
clock_drift (one VM); `--help` gives each one's options.
"""
