"""The dashboard's other actions (issue 30) in a real browser, each done
only through the page (its button, the confirmation with the host the
page offers, "Confirm") on a three-host cluster running a redis VM, a
client writing keys to it throughout. The VM itself is made from the
page's "New VM…" form (issue 63): the default image and the first host
picked among those offered, redis as its command on the hosts' bridge.

0. "protect…" of the VM running alone, with its backup on the host
   picked in the confirmation: the job running, then done; the card
   protected with its backup there, the protection on the timeline, as
   the agents say too;
1. "move backup…" to the host that runs neither side: the page shows the
   job running, then done; the timeline the new pair's protection (its
   backup's address on that host); the card the VM protected with its
   backup there, as the agents say too;
2. "move VM…" to the host that runs neither side (a backup moved there,
   then a handover to it): the job done, the handover on the timeline,
   the card's primary on that host, as the agents say; the controller
   then protects it again;
3. "drain" of the host that now runs the primary: its row shows it
   drained, the job running until the host is empty, then done; the
   host's row lists no VM, the card shows the VM protected on the two
   other hosts and offers the drained host to no move; a screenshot of
   that page is saved (its path printed). "undrain": its row shows it up
   and drainable again, and the cards offer it again as a target.

At the end every acknowledged key reads back over the client's one
connection (0 lost), which held throughout.

As test_dashboard.py, the page is read from what the server renders for
this (`data-` attributes: a VM's `data-state`, a job's `data-done`, a
timeline row's `data-kind`, a button's offered hosts in `data-host`), and
from the texts a person reads on the cards and host rows."""

import json
import os
import time
from pathlib import Path

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

import ftsite
from ftsite import REDIS_FT, wait_for_redis
from ftsite.browser import Browser
from ftsite.cluster import HOSTS, Cluster, wait_for
from ftsite.site import Site
from ftsite.trial import KeyWriter, stop_and_check

# The bounds below are for a shared, loaded 2-core host: each action
# moves a 512 MiB guest's memory (a pre-copy to a new backup) or waits for
# a controller's pass (every few seconds) and the page's look (every 2 s).
# A hang is what they bound, not speed.
PROTECTED_WITHIN = 240  # as test_dashboard: boot, transfer, a controller's pass
# A backup started on the third host and the whole machine copied to it
# while the old pair goes on.
MOVE_BACKUP_WITHIN = 180
# The same copy, then a handover.
MOVE_WITHIN = 180
# A drain: the controller's handover to the backup, the old primary's end.
DRAIN_WITHIN = 180
# A controller's pass, then a new backup's copy (test_dashboard's bound).
REPROTECTED_WITHIN = 150
# Something already done in etcd (a mark set or cleared) reaching the page.
SHOWN_WITHIN = 60
ARTIFACTS = Path(os.environ.get("FTVM_ARTIFACTS", ftsite.REPO / "target" / "artifacts"))

CARD = 'article.vm[data-vm="redis"]'


def card_state(b):
    """(state, primary, backup) of the redis VM as the page shows it."""
    return (b.attr(f"{CARD} .protection", "data-state"), b.text(f"{CARD} dd.primary"), b.text(f"{CARD} dd.backup"))


def host_row(b, host):
    """(health text, VMs text, its button's action) of `host`'s row."""
    row = f'#hosts tr[data-host="{host}"]'
    return (b.text(f"{row} td.health"), b.text(f"{row} td:nth-child(6)"),
            b.attr(f"{row} button.action", "data-action"))


def offered(b, action):
    """The hosts the redis card's `action` button offers, or None if the
    card has no such button."""
    hosts = b.attr(f'{CARD} button[data-action="{action}"]', "data-host")
    return None if hosts is None else sorted(filter(None, hosts.split(",")))


def timeline_rows(b, after):
    """The timeline's rows newer than event id `after`: [(id, kind, host,
    VM, what)], read in one go."""
    rows = js(b, "return [...document.querySelectorAll('#events tr')].map(r =>"
                 " [Number(r.dataset.id), r.dataset.kind, ...[...r.cells].slice(1).map(c => c.textContent)])")
    return [tuple(r) for r in rows if r[0] > after]


def last_event_id(b):
    return max((r[0] for r in timeline_rows(b, -1)), default=0)


def js(b, script, *args):
    """`script`'s value in the page (read in one go: the feed replaces
    the elements every look, so no element is held across calls)."""
    return b.do(lambda d: d.execute_script(script, *args))


def jobs(b):
    """The jobs panel: [(id, data-done, text)], newest first."""
    return [tuple(j) for j in js(b, "return [...document.querySelectorAll('#jobs li.job')].map(j =>"
                                    " [Number(j.dataset.job), j.dataset.done, j.textContent])")]


def last_job(b):
    return max((j[0] for j in jobs(b)), default=0)


def act(b, selector, host=None, offers=None):
    """Clicks the action button `selector`, checks the confirmation (the
    hosts it offers are `offers`, if given), picks `host` in it and
    confirms. Returns (the moment of the confirmation, the id the job
    will have at least)."""
    before = last_job(b)
    b.click(selector)
    wait_for("the confirmation", 10, lambda: b.attr("#confirm", "hidden") is None, every=0.2)
    sentence = b.text("#confirm-text")
    if host is not None:
        def options(d):
            return [o.get_attribute("value") for o in Select(d.find_element(By.CSS_SELECTOR, "#confirm-host")).options]
        choices = b.do(options)
        if offers is not None:
            assert sorted(choices) == sorted(offers), f"the confirmation offers {choices}, not {offers}"
        assert host in choices, f"the confirmation offers {choices}, not {host}"
        b.do(lambda d: Select(d.find_element(By.CSS_SELECTOR, "#confirm-host")).select_by_value(host))
    else:
        assert b.attr("#confirm-host", "hidden") is not None, "a host is asked for an action that takes none"
    print(f"confirming: {sentence!r} {host or ''}")
    b.click("#confirm-yes")
    return time.monotonic(), before + 1


def pair_shown(b, cl, since, pair):
    """After an action that gives the VM its backup on pair[1]: the
    timeline's protection (newer than event `since`) naming that host's
    address, then the card protected on `pair` (primary, backup), as the
    agents say too. Returns the card's state."""
    ip = Site.HOSTS[pair[1]][1]
    row = wait_for(f"the protection with its backup on {pair[1]} on the timeline", SHOWN_WITHIN,
                   lambda: next((r for r in timeline_rows(b, since) if r[3] == "redis"
                                 and r[4].startswith("protected") and f"backup {ip}:" in r[4]), None),
                   every=0.5)
    print(f"the timeline: {row}")
    shown = wait_for(f"the VM protected on {pair} on the page", SHOWN_WITHIN,
                     lambda: (s := card_state(b)) == ("protected", *pair) and s, every=0.5)
    assert cl.protected("redis") == pair, cl.views("redis")
    return shown


def job_result(b, first_id, within, expect_running=True):
    """Follows the job (the first with an id from `first_id` on) on the
    page to its end: (its text when done, the texts seen while it ran).
    Fails unless it ended well (and, with `expect_running`, was seen
    running: the action takes seconds, so a page that shows only the end
    shows no progress)."""
    job = wait_for("the action's job on the page", 15,
                   lambda: next((j[0] for j in jobs(b) if j[0] >= first_id), None), every=0.2)
    running = []

    def ended():
        done, text = next(((j[1], j[2]) for j in jobs(b) if j[0] == job), (None, None))
        if done == "running" and text not in running:
            running.append(text)
        return done not in (None, "running") and (done, text)
    done, text = wait_for("the action's result on the page", within, ended, every=0.5)
    assert done == "ok", f"the action failed on the page: {text}"
    if expect_running:
        assert running and all("running for" in t for t in running), f"no progress shown: {running}"
    return text, running


def select_options(b, selector):
    return b.do(lambda d: [o.get_attribute("value")
                           for o in Select(d.find_element(By.CSS_SELECTOR, selector)).options])


def create_from_the_form(b, name, image, host, command, bridge, ip, ssh_key):
    """"New VM…", the form filled as a person would (the image and host
    picked among those offered: each host's images, the hosts up; a key
    for root), then "Create": the job runs until the VM's process does.
    Returns the job's text when done."""
    before = last_job(b)
    b.click("#create-open")
    wait_for("the new VM's form", 10, lambda: b.attr("#create", "hidden") is None, every=0.2)
    images = select_options(b, "#create-image")
    assert image in images, f"the form offers images {images}, not {image}"
    hosts = select_options(b, "#create-host")
    assert hosts == ["", *sorted(HOSTS)], f"the form offers hosts {hosts}"
    b.type("#create-form input[name=name]", name)
    b.type("#create-form input[name=command]", command)
    b.type("#create-form input[name=bridge]", bridge)
    b.type("#create-form input[name=ip]", ip)
    b.type("#create-form textarea[name=ssh_keys]", ssh_key + "\n")
    for select, value in (("#create-image", image), ("#create-host", host)):
        b.do(lambda d: Select(d.find_element(By.CSS_SELECTOR, select)).select_by_value(value))
    b.click("#create-yes")
    done, _ = job_result(b, before + 1, ftsite.BOOT_TIMEOUT, expect_running=False)
    return done


def test_the_dashboard_moves_a_backup_and_a_vm_and_drains_a_host(ftvm, scratch):
    cl = Cluster(ftvm, scratch, "da")
    cl.wait_hosts()
    a, b_host, c = "primary", "backup", "spare"
    # Draining does not stop a host's agent: the page may be on any; the
    # one of the VM's first host, which is drained never.
    api = cl.records()[a]["api"]
    token = cl.token.read_text().strip()
    figures = {}

    b = Browser(cl.site, pins=cl.pki.spki_pins())
    try:
        b.get(api + "/ui")
        b.type("#token", token)
        b.click("#login")
        wait_for("the page", 30, lambda: b.css("#view"), every=0.2)
        # Created from the page's form, unprotected: it is protected from
        # the page next.
        key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKo5Zm9yLXRoZS1kYXNoYm9hcmQ operator@dashboard"
        done = create_from_the_form(b, "redis", ftsite.image_dir(ftvm).name, a, REDIS_FT, "br0",
                                    f"{ftsite.GUEST_IP}/24", key)
        assert f"create redis on {a} — done: redis created on {a}" in done, done
        # The key typed is the VM's seed's, as the cluster keeps its spec.
        kept = cl.site.run(a, cl.etcd.etcdctl("get", "/ftvm/vms/redis", "--print-value-only")).stdout
        assert json.loads(kept)["spec"]["ssh_keys"] == [key], kept
        print(f"the page created the VM: {done!r}")
        conn = wait_for_redis(cl.site, list(cl.agents.values()), ftsite.BOOT_TIMEOUT)
        assert cl.sides("redis") == {a: "unprotected"}, cl.sides("redis")
        writer = KeyWriter(conn)
        writer.start()
        shown = wait_for("the VM running alone on the page", SHOWN_WITHIN,
                         lambda: (s := card_state(b))[:2] == ("unprotected", a) and s, every=0.5)
        print(f"the page shows redis {shown}")

        # 0. Protect it with its backup on the host picked: the other two
        # hosts are offered, and the controller's choice.
        assert offered(b, "protect") == sorted([b_host, c]), offered(b, "protect")
        since = last_event_id(b)
        t0, job = act(b, f'{CARD} button[data-action="protect"]', b_host, offers=["", b_host, c])
        done, running = job_result(b, job, PROTECTED_WITHIN)
        figures["protect: job done"] = time.monotonic() - t0
        print(f"protect: {len(running)} progress texts ({running[-1]!r}), then {done!r}")
        shown = pair_shown(b, cl, since, (a, b_host))
        figures["protect: shown protected"] = time.monotonic() - t0
        print(f"the page shows redis {shown}; hosts {a}, {b_host}, {c}")
        assert writer.error is None, writer.error

        # 1. Move the backup to the third host: the one host offered.
        assert offered(b, "move_backup") == [c], offered(b, "move_backup")
        since = last_event_id(b)
        t0, job = act(b, f'{CARD} button[data-action="move_backup"]', c, offers=[c])
        done, running = job_result(b, job, MOVE_BACKUP_WITHIN)
        figures["move backup: job done"] = time.monotonic() - t0
        print(f"move backup: {len(running)} progress texts ({running[-1]!r}), then {done!r}")
        assert f"move redis's backup to {c}" in done, done
        pair_shown(b, cl, since, (a, c))
        figures["move backup: shown protected"] = time.monotonic() - t0
        assert b_host not in cl.sides("redis"), cl.sides("redis")
        assert writer.error is None, writer.error

        # 2. Move the VM to the host that runs neither side (b_host, its
        # first backup's): both other hosts are offered.
        assert offered(b, "move") == sorted([b_host, c]), offered(b, "move")
        since = last_event_id(b)
        t0, job = act(b, f'{CARD} button[data-action="move"]', b_host, offers=[b_host, c])
        done, running = job_result(b, job, MOVE_WITHIN)
        figures["move VM: job done"] = time.monotonic() - t0
        print(f"move VM: {len(running)} progress texts ({running[-1]!r}), then {done!r}")
        assert f"moved from {a} to {b_host}" in done, done
        row = wait_for("the handover on the timeline", SHOWN_WITHIN,
                       lambda: next((r for r in timeline_rows(b, since) if r[1] == "handover" and r[3] == "redis"),
                                    None), every=0.5)
        print(f"the timeline: {row}")
        shown = wait_for("the VM's primary on its new host, on the page", SHOWN_WITHIN,
                         lambda: (s := card_state(b))[1] == b_host and s, every=0.5)
        figures["move VM: shown moved"] = time.monotonic() - t0
        print(f"the page shows {shown}")
        # The agents' view (`vm show`) too: the new primary answers its
        # agent's first status once it has gone live (in CI once not
        # within 3 s of the page's showing it, its agent then calling it
        # the backup it was started as: the VM had no running side).
        wait_for("the VM's primary on its new host, in `vm show`", SHOWN_WITHIN,
                 lambda: cl.sides("redis").get(b_host) in ("primary", "unprotected"), every=0.5)
        # The controller gives it a backup again (its record wants
        # protection), on one of the two other hosts.
        shown = wait_for("the VM protected again after the move, on the page", REPROTECTED_WITHIN,
                         lambda: (s := card_state(b))[:2] == ("protected", b_host) and s, every=0.5)
        figures["move VM: shown protected again"] = time.monotonic() - t0
        assert shown[2] in (a, c), shown
        assert cl.protected("redis") == (b_host, shown[2]), cl.views("redis")
        assert writer.error is None, writer.error

        # 3. Drain the host that runs the primary: no host to pick.
        assert host_row(b, b_host)[2] == "drain", host_row(b, b_host)
        since = last_event_id(b)
        t0, job = act(b, f'#hosts tr[data-host="{b_host}"] button[data-action="drain"]')
        health = wait_for("the host shown drained", SHOWN_WITHIN,
                          lambda: (r := host_row(b, b_host))[0] == "up, drained" and r, every=0.5)
        figures["drain: shown drained"] = time.monotonic() - t0
        print(f"the page shows host {b_host}: {health}")
        assert health[2] == "undrain", health
        done, running = job_result(b, job, DRAIN_WITHIN)
        figures["drain: job done"] = time.monotonic() - t0
        print(f"drain: {len(running)} progress texts ({running[-1]!r}), then {done!r}")
        assert f"host {b_host} is drained: it runs no VM" in done, done
        wait_for("the drain's handover on the timeline", SHOWN_WITHIN,
                 lambda: any(r[1] == "handover" for r in timeline_rows(b, since)), every=0.5)
        others = sorted(h for h in HOSTS if h != b_host)
        shown = wait_for("the VM protected on the two other hosts, on the page", REPROTECTED_WITHIN,
                         lambda: (s := card_state(b))[0] == "protected" and sorted(s[1:]) == others and s,
                         every=0.5)
        figures["drain: shown protected elsewhere"] = time.monotonic() - t0
        print(f"the page shows {shown}")
        # The row lists none of the VM's running sides (an ended process
        # may linger in its agent's list a while).
        vms = wait_for("the drained host's row without the VM", SHOWN_WITHIN,
                       lambda: (r := host_row(b, b_host)) and not any(
                           f"redis ({role})" in (r[1] or "") for role in ("primary", "backup", "unprotected"))
                       and r, every=0.5)
        print(f"host {b_host}'s row: {vms}")
        assert vms[0] == "up, drained", vms
        # The drained host is no target: the page offers it nowhere; and
        # as it was the only host that could take the backup, "move
        # backup…" is not offered at all (a confirmation with no host to
        # pick could only be refused).
        assert b_host not in (offered(b, "move") or []), offered(b, "move")
        assert offered(b, "move_backup") is None, f"move backup offered to {offered(b, 'move_backup')}"
        assert cl.protected("redis") in ((others[0], others[1]), (others[1], others[0])), cl.views("redis")
        assert cl.sides("redis").get(b_host) in (None, "ended"), cl.sides("redis")
        assert [v for v in cl.records()[b_host]["vms"] if v["role"] != "ended"] == []
        time.sleep(4)  # a look or two more, for the charts
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = b.screenshot(ARTIFACTS / f"dashboard-after-drain-{int(time.time())}.png")
        print(f"screenshot after the drain: {shot}")
        assert writer.error is None, writer.error

        # Undrain: shown up and drainable again, and a target again.
        t0, job = act(b, f'#hosts tr[data-host="{b_host}"] button[data-action="undrain"]')
        done, _ = job_result(b, job, SHOWN_WITHIN, expect_running=False)
        assert f"host {b_host} is in use again" in done, done
        health = wait_for("the host shown in use again", SHOWN_WITHIN,
                          lambda: (r := host_row(b, b_host))[0] == "up" and r[2] == "drain" and r, every=0.5)
        wait_for("the host offered as a target again", SHOWN_WITHIN,
                 lambda: b_host in (offered(b, "move") or []) and offered(b, "move_backup") == [b_host], every=0.5)
        figures["undrain: shown in use"] = time.monotonic() - t0
        print(f"the page shows host {b_host}: {health}")

        errors = b.console_errors()
        assert not errors, f"the page's console: {errors}"
    finally:
        b.quit()
    stop_and_check(writer, conn)
    print(f"{writer.acked} keys acknowledged through a protection, a backup's move, a VM's move, a drain and an undrain: "
          f"all read back")
    print("seconds from the confirmation: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))
