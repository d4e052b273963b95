"""A cluster of three hosts on the site (primary, backup, spare: each a
network namespace with its own etcd member and `ftvm agent`), driven the
way a person drives one: `ftvm cluster` from the client's namespace,
agents found in etcd. Used by harness/tests/test_cluster.py and
bench/cluster-redundancy.

A host dies as a real one does (`kill_host`: its switch port down, then
every process in its namespace killed: agent, VMs, etcd member) and comes
back (`revive`: port up, its etcd member restarted on its data, a fresh
agent with the same identity and state directory), so a bench can kill
host after host and always have three.
"""

import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from .errors import TrialFailed
from .etcd import EtcdCluster
from .pki import Pki
from .proc import Proc
from .site import Site, in_netns

HOSTS = ("primary", "backup", "spare")


def wait_for(what, within, f, every=1.0):
    """f()'s first true value, asked every `every` s; TrialFailed after
    `within` s."""
    t0 = time.monotonic()
    while True:
        v = f()
        if v:
            return v
        if time.monotonic() - t0 > within:
            raise TrialFailed(f"{what} did not happen within {within} s")
        time.sleep(every)


class Cluster:
    """The site with a spare host, the cluster's credentials (its
    authority, each host's, the operator's), a three-member etcd speaking
    TLS and an agent on each host; files under `work`. `token` is the
    operator's token file."""

    def __init__(self, ftvm, work, tag, agent_options=None):
        self.ftvm, self.work = ftvm, Path(work)
        # {role: [extra `ftvm agent` options]}
        self.agent_options = agent_options or {}
        self.site = Site(tag, spare=True)
        self.pki = Pki(ftvm, self.work, HOSTS)
        self.etcd = EtcdCluster(self.site, self.work, pki=self.pki)
        self.token = self.pki.operator / "token"
        self.env = [f"FTVM_ETCD={self.etcd.endpoints}", f"FTVM_CREDENTIALS={self.pki.operator}"]
        self.agents = {}
        self.lives = {role: 0 for role in HOSTS}  # agents started per host, for their logs' names
        for role in HOSTS:
            self.start_agent(role)

    def start_agent(self, role):
        """Starts (again) the agent of host `role`, with its state directory."""
        ip = Site.HOSTS[role][1]
        self.lives[role] += 1
        argv = [self.ftvm, "agent", "--host-id", role, "--etcd", self.etcd.endpoints, "--address", ip,
                "--state-dir", str(self.work / f"agent-{role}"),
                "--credentials", str(self.pki.host(role)), *self.agent_options.get(role, [])]
        log = self.work / f"agent-{role}-{self.lives[role]}.log"
        self.agents[role] = Proc(f"agent on {role}", self.site, role, argv, log)
        return self.agents[role]

    def cli(self, *args, timeout=330, lines=False):
        """`ftvm cluster ARGS` from the client's host; its JSON with --json
        (a list of what each line holds, with `lines`). TrialFailed with
        its one-line error if it fails."""
        r = subprocess.run(self.site.argv("client", "env", *self.env, self.ftvm, "cluster", *args),
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise TrialFailed(f"ftvm cluster {' '.join(args)}: {r.stderr.strip()}")
        if "--json" not in args:
            return r.stdout
        return [json.loads(line) for line in r.stdout.splitlines()] if lines else json.loads(r.stdout)

    def events(self, vm):
        """VM `vm`'s events in the cluster's log (`ftvm cluster events`),
        oldest first, each as (kind, host, event): kind the pair event's
        name, or "controller " and the action's."""
        out = []
        for e in self.cli("--json", "events", "--vm", vm, lines=True):
            what = e["what"]
            kind = what["event"]["event"] if what["source"] == "pair" else "controller " + what["action"]["action"]
            out.append((kind, e["host"], e))
        return out

    def hosts(self):
        """The ids of the hosts etcd lists."""
        return sorted(h["id"] for h in self.cli("--json", "host", "list"))

    def wait_hosts(self, want=HOSTS, within=60):
        return wait_for(f"hosts {', '.join(want)} in etcd", within, lambda: self.hosts() == sorted(want))

    def views(self, name):
        """The VM's processes as their agents show them (`vm show --json`),
        [] if none answers."""
        try:
            return self.cli("--json", "vm", "show", name, timeout=60)
        except (TrialFailed, subprocess.TimeoutExpired):
            return []

    def records(self):
        """The hosts' records as etcd has them ({id: record})."""
        return {h["id"]: h for h in self.cli("--json", "host", "list")}

    def sides(self, name):
        """{host: role} of the VM's processes the agents answer for."""
        return {v["host"]: v["role"] for v in self.views(name)}

    def protected(self, name):
        """(primary's host, backup's host) once the VM runs protected: its
        primary's status names a pair in its mode (not still the transfer
        to a new backup) and a backup answers on another host; else None."""
        views = self.views(name)
        primary = [v for v in views if v["role"] == "primary"]
        backup = [v for v in views if v["role"] == "backup"]
        if len(primary) != 1 or len(backup) != 1:
            return None
        pair = (primary[0].get("status") or {}).get("pair") or {}
        if pair.get("role") != "primary" or pair.get("mode", {}).get("name") == "transfer":
            return None
        return primary[0]["host"], backup[0]["host"]

    def kill_host(self, role):
        """The host vanishes: its switch port goes down, then every process
        in its namespace is killed. Returns the moment of the port's fall."""
        self.site.port_down(role)
        died = time.monotonic()
        pids = subprocess.run(["ip", "netns", "pids", self.site.ns[role]], capture_output=True,
                              text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.etcd.members.pop(role, None)
        self.agents.pop(role, None)
        return died

    def revive(self, role):
        """Host `role` comes back: its port up, its etcd member restarted
        on its own data (it rejoins and catches up), a fresh agent."""
        self.site.port_up(role)
        self.etcd.start(role)
        self.etcd.wait_ready()
        # The member itself healthy (caught up with the others), not only a
        # quorum: the next death must leave two members that answer.
        wait_for(f"etcd on {role} healthy", 60, lambda: self.site.run(
            role, self.etcd.etcdctl("--command-timeout=2s", "endpoint", "health", endpoints=self.etcd.url(role)),
            check=False).returncode == 0, every=0.5)
        return self.start_agent(role)

    def metrics(self, role):
        """Host `role`'s agent's /metrics, as text."""
        api = self.records()[role]["api"]
        return self.https(f"{api}/metrics", timeout=30).read().decode()

    def https(self, url, method="GET", headers=None, data=None, timeout=30):
        """A request to an agent from the client's host, as the operator
        (the cluster's authority trusted, the token shown); the response.
        urllib's HTTPError for a refusal."""
        req = urllib.request.Request(url, method=method, data=data,
                                     headers={"Authorization": f"Bearer {self.pki.token}", **(headers or {})})
        ctx = self.pki.ssl_context()
        return in_netns(self.site.ns["client"], lambda: urllib.request.urlopen(req, timeout=timeout, context=ctx))

    def etcd_metrics(self, role):
        """The etcd member of host `role`'s /metrics, as {sample: value}
        (`name{labels}` as written)."""
        url = f"{self.etcd.url(role)}/metrics"
        ctx = self.pki.ssl_context(client_cert=True)
        text = in_netns(self.site.ns["client"],
                        lambda: urllib.request.urlopen(url, timeout=10, context=ctx).read().decode())
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                sample, _, value = line.rpartition(" ")
                try:
                    out[sample] = float(value)
                except ValueError:
                    pass
        return out


class EventStream:
    """The cluster's event log as an agent streams it (`GET /v1/events`,
    server-sent events), read from the client's namespace on a thread of
    its own: `events` is every event received so far, in order."""

    def __init__(self, cl, role):
        api = cl.records()[role]["api"]
        # Connected in the client's namespace; the socket stays there.
        self.response = cl.https(f"{api}/v1/events", headers={"Accept": "text/event-stream"}, timeout=600)
        ctype = self.response.headers.get("Content-Type", "")
        assert ctype.startswith("text/event-stream"), f"GET /v1/events answered {ctype}"
        self.events, self.ids = [], []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        data, event_id = [], None
        try:
            for raw in self.response:
                line = raw.decode().rstrip("\n").rstrip("\r")
                if line.startswith("id:"):
                    event_id = int(line[3:].strip())
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip())
                elif line == "" and data:
                    event = json.loads("\n".join(data))
                    with self.lock:
                        self.events.append(event)
                        self.ids.append(event_id)
                    data, event_id = [], None
        except Exception:  # noqa: BLE001 - closed under it (close()), or a broken stream: what came is kept
            pass

    def of(self, vm):
        """The events of VM `vm` received so far."""
        with self.lock:
            return [e for e in self.events if e.get("vm") == vm]

    def close(self):
        self.response.close()
