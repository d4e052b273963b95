"""Cluster VMs from any image (issue 63, part 5): each agent lists the
guest images it can boot (`ftvm agent --images`, here a directory per
host), the controller starts a VM only on a host that has its image, and a
backup needs none (protection sends it the disk and finds the boot files
by hash). The PostgreSQL image of the cargo tests (`ftvm-test-web`:
postgresql, nginx, openssh-server; ftsite.web_image) runs as `db` with a grown root disk and
checkpoint protection; the host's pgbench runs while the primary's host
dies; pgbench finishes with no error, `pgbench_history` holds every
transaction it counted, and the VM is protected again on the third host,
which has no such image either. The VM's seed makes an account with its
key (`--user`), and a seed naming root is refused."""

import os
import re
import subprocess
import time

import pytest

import ftsite
from ftsite.cluster import HOSTS, Cluster, wait_for
from ftsite.errors import TrialFailed

WEB = ftsite.WEB_IMAGE
# Boot of a systemd guest with PostgreSQL on a loaded 2-core host, and the
# copy of its disk and 1 GiB of RAM to a new backup.
PROTECTED_WITHIN = 600
REPROTECTED_WITHIN = 300
PGBENCH_SECONDS = 60
SSH = ["ssh", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
       "-o", "ConnectTimeout=30", "-o", "LogLevel=ERROR"]


def images_of(scratch, host, dirs):
    """A host's images directory: links to the cache's images `dirs`."""
    d = scratch / f"images-{host}"
    d.mkdir()
    for src in dirs:
        os.symlink(src, d / src.name)
    return d


def in_guest(cl, key, command, timeout=120, user="root"):
    """`command` run in the guest as `user` over ssh, from the client. A
    connection that fails (ssh's status 255: on a loaded host sshd may not
    finish its banner in time) is tried again, twice."""
    for attempt in range(3):
        r = subprocess.run(cl.site.argv("client", *SSH, "-i", str(key), f"{user}@{ftsite.GUEST_IP}", command),
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode != 255:
            break
        time.sleep(2)
    if r.returncode != 0:
        raise TrialFailed(f"ssh {command!r}: {r.stderr.strip()}")
    return r.stdout.strip()


def psql(cl, sql):
    r = subprocess.run(cl.site.argv("client", "psql", "-h", ftsite.GUEST_IP, "-U", "postgres", "-At", "-c", sql),
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise TrialFailed(f"psql {sql!r}: {r.stderr.strip()}")
    return r.stdout.strip()


def test_a_vm_boots_its_image_where_it_is_and_a_failover_loses_no_committed_transaction(ftvm, scratch):
    web, key = ftsite.web_image(ftvm)
    default = ftsite.image_dir(ftvm)
    with_web = images_of(scratch, "primary", [default, web])
    options = {"primary": ["--images", str(with_web)]}
    for host in ("backup", "spare"):
        options[host] = ["--images", str(images_of(scratch, host, [default]))]
    cl = Cluster(ftvm, scratch, "ci", agent_options=options)
    cl.wait_hosts()
    # Each host's record lists its images.
    listed = wait_for("the hosts' images in their records", 60, lambda: {
        h: sorted(i["name"] for i in r.get("images", [])) for h, r in cl.records().items()
    } if all(r.get("images") for r in cl.records().values()) else None)
    assert listed == {"primary": sorted([default.name, WEB]), "backup": [default.name], "spare": [default.name]}
    assert WEB in cl.cli("host", "list")

    # An image no host has: refused at once, in one line.
    with pytest.raises(TrialFailed, match="no host of the cluster has image nosuch"):
        cl.cli("vm", "create", "lost", "--image", "nosuch")
    with pytest.raises(TrialFailed, match="host backup has no image " + WEB):
        cl.cli("vm", "create", "lost", "--image", WEB, "--on", "backup")
    with pytest.raises(TrialFailed, match="smaller than image " + WEB):
        cl.cli("vm", "create", "lost", "--image", WEB, "--disk-size", "1G")

    # A seed's account: refused before anything is made when it is root.
    alice_key = scratch / "alice"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(alice_key)], check=True)
    with pytest.raises(TrialFailed, match="root is there already"):
        cl.cli("vm", "create", "lost", "--user", f"root:{alice_key}.pub")

    # No --on: the one host with the image, though the others have as much room.
    t0 = time.monotonic()
    cl.cli("vm", "create", "db", "--image", WEB, "--disk-size", "6G", "--memory", "1024", "--bridge", "br0",
           "--ip", f"{ftsite.GUEST_IP}/24", "--protect", "checkpoint", "--user", f"alice:{alice_key}.pub:sudo",
           "--wait", "300")
    # The guest as its seed and disk make it: its name, a 6 GiB root
    # filesystem (the image has 4), the image's key for root, and alice
    # with her key, in the group asked for.
    hostname = wait_for("ssh into the guest", ftsite.BOOT_TIMEOUT, lambda: _try(lambda: in_guest(cl, key, "hostname")),
                        every=2)
    assert hostname == "db"
    assert in_guest(cl, alice_key, "id -un; id -Gn", user="alice").split() == ["alice", "alice", "sudo"]
    size = int(in_guest(cl, key, "df --output=size -B1M / | tail -1"))
    assert 5600 < size <= 6144, f"the root filesystem has {size} MiB, not the 6 GiB asked for"
    # The image lets in the cargo tests' network only: the client's too.
    in_guest(cl, key, "echo 'host all all 10.201.0.0/24 trust' >> /etc/postgresql/17/main/pg_hba.conf"
                      " && systemctl reload postgresql")
    wait_for("psql", 60, lambda: _try(lambda: psql(cl, "select 1")) == "1")
    first = wait_for("a backup", PROTECTED_WITHIN, lambda: cl.protected("db"))
    assert first[0] == "primary", f"the VM runs on {first[0]}, the host without its image"
    backup_host = first[1]
    third = next(h for h in HOSTS if h not in ("primary", backup_host))
    print(f"db protected on {backup_host}, {time.monotonic() - t0:.0f} s after create")

    subprocess.run(cl.site.argv("client", "pgbench", "-h", ftsite.GUEST_IP, "-U", "postgres", "-i", "-s", "2",
                                "postgres"), check=True, capture_output=True, timeout=600)
    bench = subprocess.Popen(cl.site.argv("client", "pgbench", "-h", ftsite.GUEST_IP, "-U", "postgres", "-c", "4",
                                          "-j", "2", "-T", str(PGBENCH_SECONDS), "postgres"),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(PGBENCH_SECONDS / 3)
    died = cl.kill_host("primary")
    out, _ = bench.communicate(timeout=PGBENCH_SECONDS * 10)
    print(out)
    assert bench.returncode == 0, f"pgbench failed across the failover:\n{out}"
    assert not re.search(r"error|abort", out, re.I), out
    done = int(re.search(r"number of transactions actually processed: (\d+)", out).group(1))
    assert done > 0
    assert int(psql(cl, "select count(*) from pgbench_history")) == done
    assert in_guest(cl, key, "systemctl is-active postgresql nginx ssh").split() == ["active"] * 3
    wait_for("protected again", REPROTECTED_WITHIN,
             lambda: cl.sides("db") == {backup_host: "primary", third: "backup"})
    print(f"the primary's host died; pgbench counted {done} transactions, all in pgbench_history; "
          f"protected again on {third} {time.monotonic() - died:.0f} s after the death")


def _try(f):
    """f(), or None if it raised TrialFailed or timed out (not yet up)."""
    try:
        return f()
    except (TrialFailed, subprocess.TimeoutExpired):
        return None
