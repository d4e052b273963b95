"""Protecting a running VM (issue 28): FT VMotion.

A plain `ftvm run` of redis (its disk on the shared storage; in
checkpoint mode each host has its own copy, the backup's a fresh one that
the transfer makes the same while the guest writes), while a client
writes keys one at a time over one TCP connection: `protect` on
its control socket gives it a backup on the other host at a random
moment, without stopping the client. Then its host fails (kill -9): the
backup goes live, and every acknowledged key is there over the same
connection. Then the VM, now on host B, is protected again onto a third
host C, and B's ftvm is killed in turn: the VM lives on at C, still with
every key, still on the same connection.
In checkpoint mode the last copy of the disk passes e2fsck once the guest
has shut down.
"""

import random
import subprocess
import time
from pathlib import Path

import pytest

from ftsite import GUEST_IP, REDIS_PORT, ConnectionLost, Resp, RespError, event, status
from ftsite.observe import control
from ftsite.proc import CHANNEL_PORT, TIMEOUT_MS, Proc, rootfs, sparse_copy, start_plain
from ftsite.resp import BOOT_TIMEOUT, REDIS_FT, wait_for_redis
from ftsite.site import BACKUP_HOST_IP, PRIMARY_HOST_IP, SPARE_HOST_IP, Site
from ftsite.trial import KeyWriter, check_keys

MODES = {"lockstep": [], "epoch": ["--mode", "epoch"], "checkpoint": ["--mode", "checkpoint"]}


def backup_on(site, ftvm, work, role, shared, name, extra=()):
    """`ftvm ft backup` on host `role`, listening on that host's address."""
    ip = {"primary": PRIMARY_HOST_IP, "backup": BACKUP_HOST_IP, "spare": SPARE_HOST_IP}[role]
    sock, events = str(Path(work) / f"{name}.sock"), Path(work) / f"{name}.events"
    events.unlink(missing_ok=True)
    argv = [ftvm, "ft", "backup", "--listen", f"{ip}:{CHANNEL_PORT}", "--shared", str(shared),
            "--timeout", str(TIMEOUT_MS), "--net", "tap=t0", "--control", sock, "--events", str(events), *extra]
    p = Proc(name, site, role, argv, Path(work) / f"{name}.out")
    p.sock, p.events = sock, str(events)
    event(p, "listening", timeout=30)
    return p


def protect(vm, backup_ip, shared, mode_args, procs):
    """`protect` on the running VM's control socket; its answer."""
    answer = control(vm.sock, " ".join(["protect", "--backup", f"{backup_ip}:{CHANNEL_PORT}", "--shared",
                                        str(shared), "--timeout", str(TIMEOUT_MS), *mode_args]), timeout=300)
    assert answer.startswith("ok protected"), f"{answer}\n" + "\n".join(p.tail() for p in procs)
    return answer


def keys_written_meanwhile(writer, seconds):
    before = writer.acked
    time.sleep(seconds)
    assert writer.error is None, f"the client failed: {writer.error}"
    return writer.acked - before


@pytest.mark.parametrize("mode", list(MODES))
def test_a_running_vm_is_protected_fails_over_and_is_protected_again(ftvm, scratch, mode):
    site = Site(f"pr{mode[0]}", spare=True)
    shared = Path(scratch) / "shared"
    shared.mkdir()
    image = rootfs(ftvm)
    if mode == "checkpoint":
        # Each host its own copy: the backups' fresh from the image, the
        # guest's blocks written since its boot coming with the transfer.
        disk = sparse_copy(image, Path(scratch) / "a-disk.img")
        copies = [sparse_copy(image, Path(scratch) / f"{n}-disk.img") for n in ("b", "c")]
        extra1, extra2 = ["--disk", str(copies[0])], ["--disk", str(copies[1])]
    else:
        disk = sparse_copy(image, shared / "disk.img")
        extra1 = extra2 = []
    plain = start_plain(site, ftvm, scratch, REDIS_FT, disk=disk)
    conn = wait_for_redis(site, [plain], BOOT_TIMEOUT)
    writer = KeyWriter(conn)
    writer.start()
    time.sleep(1.0 + random.random() * 2.0)
    # Protected while the client writes, onto the other host.
    b = backup_on(site, ftvm, scratch, "backup", shared, "backup", extra1)
    answer = protect(plain, BACKUP_HOST_IP, shared, MODES[mode], [plain, b])
    print(f"{mode}, protecting: {answer}")
    event(b, "following", timeout=10, watch=[b])
    assert keys_written_meanwhile(writer, 2.0) > 0, "no key was acknowledged once protected"
    st = status(plain.sock)
    assert st.get("role") == "primary" and st.get("mode") == mode, st["_raw"]
    # The first host fails: the backup goes live, nothing lost.
    plain.kill9()
    event(b, "going-live", timeout=30, watch=[b])
    assert keys_written_meanwhile(writer, 3.0) > 0, f"no key acknowledged after the failover:\n{b.tail()}"
    # Protected again, onto a third host.
    b2 = backup_on(site, ftvm, scratch, "spare", shared, "backup2", extra2)
    answer = protect(b, SPARE_HOST_IP, shared, MODES[mode], [b, b2])
    print(f"{mode}, protecting again: {answer}")
    event(b2, "following", timeout=10, watch=[b2])
    assert keys_written_meanwhile(writer, 2.0) > 0, "no key acknowledged once protected again"
    b.kill9()
    event(b2, "going-live", timeout=30, watch=[b2])
    assert keys_written_meanwhile(writer, 3.0) > 0, f"no key acknowledged after the second failover:\n{b2.tail()}"
    writer.stop()
    assert writer.error is None, f"the client failed: {writer.error}"
    total = writer.acked
    assert conn.command("DBSIZE") == total
    assert check_keys(conn, total) == (0, 0)
    print(f"{mode}: {total} keys acknowledged over one connection across two protections and two failovers, "
          "none lost")
    if mode == "checkpoint":
        conn.close()
        conn = Resp(site.connect(GUEST_IP, REDIS_PORT, timeout=10), reply_timeout=30)
        try:
            conn.command("SHUTDOWN")  # the reply is the connection closing
        except (ConnectionLost, RespError):
            pass
        assert b2.wait(60) == 0, b2.output()
        fsck = subprocess.run(["e2fsck", "-fn", str(copies[1])], capture_output=True)
        assert fsck.returncode == 0, fsck.stdout.decode(errors="replace") + fsck.stderr.decode(errors="replace")
    b2.stop()
    site.close()


@pytest.mark.parametrize("mode", ["lockstep", "checkpoint"])
def test_protection_stopped_on_purpose_then_given_again(ftvm, scratch, mode):
    """`unprotect`: the backup stops following and exits 0 (it never goes
    live), the VM runs on unprotected without a pause a client notices;
    protected again onto a new backup, whose takeover keeps every key."""
    site = Site(f"up{mode[0]}")
    shared = Path(scratch) / "shared"
    shared.mkdir()
    image = rootfs(ftvm)
    if mode == "checkpoint":
        disk = sparse_copy(image, Path(scratch) / "a-disk.img")
        extra1 = ["--disk", str(sparse_copy(image, Path(scratch) / "b-disk.img"))]
        extra2 = ["--disk", str(sparse_copy(image, Path(scratch) / "c-disk.img"))]
    else:
        disk = sparse_copy(image, shared / "disk.img")
        extra1 = extra2 = []
    plain = start_plain(site, ftvm, scratch, REDIS_FT, disk=disk)
    conn = wait_for_redis(site, [plain], BOOT_TIMEOUT)
    writer = KeyWriter(conn)
    writer.start()
    b = backup_on(site, ftvm, scratch, "backup", shared, "backup", extra1)
    protect(plain, BACKUP_HOST_IP, shared, MODES[mode], [plain, b])
    assert keys_written_meanwhile(writer, 2.0) > 0
    answer = control(plain.sock, "unprotect", timeout=60)
    assert answer.startswith("ok unprotected"), answer
    assert b.wait(30) == 0, b.output()
    assert event(b, "going-live") is None, b.output()
    st = status(plain.sock)
    assert st.get("unprotected") is True, st["_raw"]
    assert keys_written_meanwhile(writer, 2.0) > 0, "no key acknowledged once unprotected"
    assert control(plain.sock, "unprotect").startswith("error the VM is not protected")
    b2 = backup_on(site, ftvm, scratch, "backup", shared, "backup2", extra2)
    protect(plain, BACKUP_HOST_IP, shared, MODES[mode], [plain, b2])
    assert keys_written_meanwhile(writer, 2.0) > 0
    plain.kill9()
    event(b2, "going-live", timeout=30, watch=[b2])
    assert keys_written_meanwhile(writer, 3.0) > 0, f"no key acknowledged after the failover:\n{b2.tail()}"
    writer.stop()
    assert writer.error is None, f"the client failed: {writer.error}"
    total = writer.acked
    assert conn.command("DBSIZE") == total
    assert check_keys(conn, total) == (0, 0)
    print(f"{mode}: unprotected and protected again; {total} keys, none lost")
    b2.stop()
    site.close()


@pytest.mark.parametrize("mode", list(MODES))
def test_the_backup_moves_under_load_and_the_new_one_takes_over(ftvm, scratch, mode):
    """`protect` onto host C of a VM protected on host B: the pair with B
    goes on while the machine goes to C, then B stops (exit 0, never
    live) and C follows; the primary fails and C goes live with every
    key (VMware FT §3.3, moving the backup)."""
    site = Site(f"mv{mode[0]}", spare=True)
    shared = Path(scratch) / "shared"
    shared.mkdir()
    image = rootfs(ftvm)
    if mode == "checkpoint":
        disk = sparse_copy(image, Path(scratch) / "a-disk.img")
        extra1 = ["--disk", str(sparse_copy(image, Path(scratch) / "b-disk.img"))]
        extra2 = ["--disk", str(sparse_copy(image, Path(scratch) / "c-disk.img"))]
    else:
        disk = sparse_copy(image, shared / "disk.img")
        extra1 = extra2 = []
    plain = start_plain(site, ftvm, scratch, REDIS_FT, disk=disk)
    conn = wait_for_redis(site, [plain], BOOT_TIMEOUT)
    writer = KeyWriter(conn)
    writer.start()
    b = backup_on(site, ftvm, scratch, "backup", shared, "backup", extra1)
    protect(plain, BACKUP_HOST_IP, shared, MODES[mode], [plain, b])
    assert keys_written_meanwhile(writer, 1.0 + random.random() * 2.0) > 0
    c = backup_on(site, ftvm, scratch, "spare", shared, "spare", extra2)
    answer = protect(plain, SPARE_HOST_IP, shared, MODES[mode], [plain, b, c])
    print(f"{mode}, moving the backup: {answer}")
    assert b.wait(30) == 0, b.output()
    assert event(b, "going-live") is None, b.output()
    event(c, "following", timeout=10, watch=[c])
    st = status(plain.sock)
    assert st.get("role") == "primary" and st.get("generation") == 2, st["_raw"]
    assert keys_written_meanwhile(writer, 2.0) > 0, "no key acknowledged once the backup moved"
    plain.kill9()
    event(c, "going-live", timeout=30, watch=[c])
    assert keys_written_meanwhile(writer, 3.0) > 0, f"no key acknowledged after the failover:\n{c.tail()}"
    writer.stop()
    assert writer.error is None, f"the client failed: {writer.error}"
    total = writer.acked
    assert conn.command("DBSIZE") == total
    assert check_keys(conn, total) == (0, 0)
    print(f"{mode}: the backup moved from B to C under load and C took over; {total} keys, none lost")
    c.stop()
    site.close()


def test_a_backup_on_the_primarys_own_host_is_refused(ftvm, scratch):
    """Anti-affinity: a backup on the VM's own host (by the hosts'
    identities, not their addresses) refuses to follow, the protection
    fails with that reason, and the VM runs on unprotected."""
    site = Site("aff")
    shared = Path(scratch) / "shared"
    shared.mkdir()
    disk = sparse_copy(rootfs(ftvm), shared / "disk.img")
    plain = start_plain(site, ftvm, scratch, REDIS_FT, disk=disk)
    conn = wait_for_redis(site, [plain], BOOT_TIMEOUT)
    same = backup_on(site, ftvm, scratch, "primary", shared, "same-host")
    answer = control(plain.sock, f"protect --backup {PRIMARY_HOST_IP}:{CHANNEL_PORT} --shared {shared}", timeout=120)
    assert answer.startswith("error protection failed") and "a backup must be on another host" in answer, answer
    assert event(same, "refusing-to-follow", timeout=10) is not None, same.output()
    st = status(plain.sock)
    assert st.get("role") is None or st.get("unprotected") is True, st["_raw"]
    assert conn.command("SET", "k", "v") == "OK"
    site.close()
