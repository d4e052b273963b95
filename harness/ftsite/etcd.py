"""A real etcd cluster (Debian's etcd-server) on the site's hosts: one
member in each host namespace, on the host's own address, as a cluster of
real hosts would run it. A member is stopped with SIGKILL (a crash) and
started again with its data, so a test can take the quorum away and give
it back; everything is stopped at cleanup."""

import shutil
import time
from pathlib import Path

from .errors import SetupError, TrialFailed
from .proc import Proc
from .site import Site

CLIENT_PORT = 2379
PEER_PORT = 2380


class EtcdCluster:
    """Members on the site's hosts `roles` (e.g. primary, backup, spare),
    data under `work`."""

    def __init__(self, site, work, roles=("primary", "backup", "spare")):
        if not shutil.which("etcd"):
            raise SetupError("etcd not found on the host: install Debian's etcd-server "
                             "(apt-get install etcd-server, or scripts/install-deps.sh)")
        self.site, self.work, self.roles = site, Path(work), list(roles)
        self.ips = {role: Site.HOSTS[role][1] for role in self.roles}
        self.members = {}
        self.initial = ",".join(f"{role}=http://{ip}:{PEER_PORT}" for role, ip in self.ips.items())
        for role in self.roles:
            self.start(role)
        self.wait_ready()

    @property
    def endpoints(self):
        """The client endpoints, comma-separated (ftvm's --etcd)."""
        return ",".join(f"http://{ip}:{CLIENT_PORT}" for ip in self.ips.values())

    def start(self, role):
        """Starts (or restarts, with its data) the member on host `role`."""
        ip = self.ips[role]
        argv = ["etcd", "--name", role, "--data-dir", str(self.work / f"etcd-{role}"),
                "--listen-client-urls", f"http://{ip}:{CLIENT_PORT}",
                "--advertise-client-urls", f"http://{ip}:{CLIENT_PORT}",
                "--listen-peer-urls", f"http://{ip}:{PEER_PORT}",
                "--initial-advertise-peer-urls", f"http://{ip}:{PEER_PORT}",
                "--initial-cluster", self.initial, "--initial-cluster-state", "new",
                "--initial-cluster-token", f"ftvm-{self.site.tag}", "--logger", "zap", "--log-outputs", "stderr"]
        log = self.work / f"etcd-{role}.log"
        self.members[role] = Proc(f"etcd on {role}", self.site, role, argv, log)

    def kill(self, role):
        """Stops the member on host `role` at once (SIGKILL)."""
        self.members.pop(role).kill9()

    def wait_ready(self, timeout=60):
        """Waits until the cluster takes a write (a quorum answers), asked
        from the first member's host."""
        role = self.roles[0]
        deadline = time.monotonic() + timeout
        while True:
            r = self.site.run(role, ["etcdctl", "--endpoints", self.endpoints, "--command-timeout=2s",
                                     "put", "/ftvm/ready", "1"], check=False)
            if r.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise TrialFailed(f"etcd did not form a quorum within {timeout} s: {r.stderr.strip()} "
                                  f"(logs in {self.work})")
            time.sleep(0.5)
