"""A real etcd cluster (Debian's etcd-server) on the site's hosts: one
member in each host namespace, on the host's own address, as a cluster of
real hosts would run it: with `pki` (ftsite.pki), speaking TLS to its
clients and peers and asking each for a certificate of the cluster's
authority, as a cluster's etcd does (it holds the pairs' keys); without,
plain (a bare pair's arbiter). A member is stopped with SIGKILL (a crash)
and started again with its data, so a test can take the quorum away and
give it back; everything is stopped at cleanup.

The members run with the timing the README gives a cluster (TUNING, the
same as crates/etcd/src/local.rs): a heartbeat every 100 ms and an election
after 1000 ms without one (etcd's defaults, given so that they are a
choice), and pre-vote, so a member that comes back after being cut off
cannot depose the leader (off by default in Debian's etcd 3.4).
docs/ARCHITECTURE.md ("The arbiter's store") says why not a shorter
election timeout: on this shared host the leader's loop was seen 710 ms
late."""

import shutil
import time
from pathlib import Path

from .errors import SetupError, TrialFailed
from .proc import Proc
from .site import Site

CLIENT_PORT = 2379
PEER_PORT = 2380
TUNING = ["--heartbeat-interval", "100", "--election-timeout", "1000", "--pre-vote"]
# The TLS 1.2 suites a cluster's etcd offers (the README's flags): ECDHE
# and AEAD only. Go's defaults also take CBC suites (ECDHE-ECDSA-AES128-SHA
# and -AES256-SHA: MAC-then-encrypt, the padding-oracle family); issue 68
# found them accepted on the client and peer ports. TLS 1.3's suites are
# all AEAD and not set by this flag.
CIPHER_SUITES = ",".join(["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
                          "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                          "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305"])


class EtcdCluster:
    """Members on the site's hosts `roles` (e.g. primary, backup, spare),
    data under `work`."""

    def __init__(self, site, work, roles=("primary", "backup", "spare"), pki=None):
        if not shutil.which("etcd"):
            raise SetupError("etcd not found on the host: install Debian's etcd-server "
                             "(apt-get install etcd-server, or scripts/install-deps.sh)")
        self.site, self.work, self.roles, self.pki = site, Path(work), list(roles), pki
        self.scheme = "https" if pki else "http"
        self.ips = {role: Site.HOSTS[role][1] for role in self.roles}
        self.members = {}
        self.initial = ",".join(f"{role}={self.scheme}://{ip}:{PEER_PORT}" for role, ip in self.ips.items())
        for role in self.roles:
            self.start(role)
        self.wait_ready()

    @property
    def endpoints(self):
        """The client endpoints, comma-separated (ftvm's --etcd)."""
        return ",".join(self.url(role) for role in self.roles)

    def url(self, role):
        """The client URL of host `role`'s member."""
        return f"{self.scheme}://{self.ips[role]}:{CLIENT_PORT}"

    def etcdctl(self, *args, endpoints=None):
        """An etcdctl command line (TLS flags included) for `args`."""
        tls = self.pki.etcdctl() if self.pki else []
        return ["etcdctl", "--endpoints", endpoints or self.endpoints, *tls, *args]

    def start(self, role):
        """Starts (or restarts, with its data) the member on host `role`."""
        ip = self.ips[role]
        scheme = self.scheme
        argv = ["etcd", "--name", role, "--data-dir", str(self.work / f"etcd-{role}"),
                "--listen-client-urls", f"{scheme}://{ip}:{CLIENT_PORT}",
                "--advertise-client-urls", f"{scheme}://{ip}:{CLIENT_PORT}",
                "--listen-peer-urls", f"{scheme}://{ip}:{PEER_PORT}",
                "--initial-advertise-peer-urls", f"{scheme}://{ip}:{PEER_PORT}",
                "--initial-cluster", self.initial, "--initial-cluster-state", "new",
                "--initial-cluster-token", f"ftvm-{self.site.tag}", *TUNING,
                "--logger", "zap", "--log-outputs", "stderr"]
        if self.pki:
            creds = self.pki.host(role)
            cert, key, ca = (str(creds / f) for f in ("cert.pem", "key.pem", "ca.pem"))
            argv += ["--cert-file", cert, "--key-file", key, "--trusted-ca-file", ca, "--client-cert-auth",
                     "--peer-cert-file", cert, "--peer-key-file", key, "--peer-trusted-ca-file", ca,
                     "--peer-client-cert-auth", "--cipher-suites", CIPHER_SUITES]
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
            r = self.site.run(role, self.etcdctl("--command-timeout=2s", "put", "/ftvm/ready", "1"), check=False)
            if r.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise TrialFailed(f"etcd did not form a quorum within {timeout} s: {r.stderr.strip()} "
                                  f"(logs in {self.work})")
            time.sleep(0.5)
