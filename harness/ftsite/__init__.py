"""ftsite: the one harness for ftvm's multi-host site, used by the FT
integration tests (harness/tests), the benchmarks (ftsite.bench) and
`make demo` (ftsite.demo) alike.

The site: a switch namespace holding a bridge, a primary host, a backup
host and a client, each a network namespace; each host bridges its VM's
TAP onto its uplink, so the guest (10.201.0.100) sits on the switch's
network (ftsite.site has the picture).

Modules:
  site     Site: builds and tears down the namespaces; connect() from the
           client; port_down() (a host that vanishes without a FIN);
           capture() of an interface's frames.
  proc     Proc: an ftvm in a host namespace, pinned to a core if asked,
           every output line timestamped; start_backup, start_primary,
           start_plain; the guest's console (wait_console...).
  observe  the ONE place that reads what ftvm says: status(sock) -> dict
           (through the control socket) and event(proc, name, timeout)
           (lifecycle events: listening, protected, going-live, ...);
           control(sock, command) for pause, snapshot, quit.
  resp     Resp, a small RESP (redis) client; wait_for_redis, wait_for_port.
  trial    failover_trial: one whole failover under load.
  etcd     EtcdCluster: an etcd member per host, killed and restarted.
  pki      Pki: the cluster's credentials (authority, hosts', operator's)
           and the TLS the tests' own clients speak with.
  cluster  Cluster: three hosts each with an etcd member and an `ftvm
           agent`, `ftvm cluster` from the client; a host killed and
           brought back (test_cluster, bench/cluster-redundancy).
  fswatch  WriteWatch: who writes a file (a disk image), by process, from
           the kernel's fanotify.
  host     check_host, the ftvm binary (private_ftvm), the guest image,
           scratch directories, sh.
  cleanup  undo steps run on every exit path; session() for programs.
  demo     `make demo`.
  bench.*  the benchmarks, one module each (bench/README.md); the options
           they share in bench.options, the JSON each writes its figures
           to (bench/results/NAME.json) in bench.results.
  figures  docs/PERFORMANCE.md's current table and the README's opening
           figures, rendered from bench/results (scripts/render-figures).

Running things (from the repository; harness/run sets PYTHONPATH to
harness/ and runs a module; Debian's python3 is enough, pytest only for
the tests):

  make test                           cargo's tests, then the FT tests:
                                      PYTHONPATH=harness /usr/bin/python3 -m pytest -n 2 harness/tests
  PYTHONPATH=harness /usr/bin/python3 -m pytest harness/tests -k checkpoint    some of them
  make demo                           harness/run ftsite.demo
  bench/failover --kills 10           = harness/run ftsite.bench.failover --kills 10
  bench/ft-overhead --only cpu,idle,redis

Everything needs root (namespaces, bridges, TAPs), iproute2, the release
binary (target/release/ftvm, or $FTVM, or --ftvm) and the guest image
(`ftvm image build`). Everything made (namespaces, processes, files) is
removed however a run ends: normally, on an error, Ctrl-C, SIGTERM or
SIGHUP.
"""

from .cleanup import cleanup, forget, on_cleanup, session, undo_now
from .errors import ConnectionLost, SetupError, Terminated, TrialFailed
from .host import (REPO, WEB_IMAGE, Binary, check_ftvm, check_host, default_ftvm, image_dir, private_ftvm, rootfs, sh,
                   sparse_copy, web_image, work_dir)
from .observe import EVENTS, Event, control, event, journal, status, try_status
from .proc import (APPEND, TEST_MIN_TIMEOUT_MS, TIMEOUT_MS, Proc, disk_options, guest_start, start_backup, start_plain,
                   start_primary, two_copies)
from .resp import BOOT_TIMEOUT, REDIS_FT, Resp, RespError, wait_for_port, wait_for_redis
from .site import (BACKUP_HOST_IP, CHANNEL_PORT, CLIENT_IP, GUEST_IP, PRIMARY_HOST_IP, REDIS_PORT, Capture, Frame,
                   Site, in_netns)
from .trial import (KeyWriter, ProtectedRedis, TrialResult, aof_writes, check_keys, fail_primary, failover_trial, protected_redis,
                    random_delays)

# The CPU job of bench/vs-qemu, between console markers timed on the host.
JOB_START = "ftvm-bench-job-start"
JOB_END = "ftvm-bench-job-end"
CPU_JOB = "dd if=/dev/zero bs=1M count=64 2>/dev/null | sha256sum"
CPU_JOB_CMD = f"echo {JOB_START}; {CPU_JOB}; echo {JOB_END}"
