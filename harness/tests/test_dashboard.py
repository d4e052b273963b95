"""The dashboard (issue 30) in a real browser: Debian's headless chromium
(ftsite.browser) opens /ui on the agent of the host that runs neither side
of a protected redis VM (any agent shows the whole cluster). Without
logging in, nothing of the cluster is shown (the feed refuses, a wrong
token is refused in one line); logged in, the page shows the VM protected
with a live lag. The primary's host dies: within a bound the timeline
shows the failover and the VM shows protected again, its backup on the
third host; a screenshot of that page is saved (its path printed). Then
"handover", confirmed on the page, hands the VM over: the action's result
and the new primary are shown.

The page's state is read from the elements the server renders with
`data-` attributes for this (a VM's `data-state`, a timeline row's
`data-kind`), so a change of wording does not break the test but a wrong
state does."""

import json
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import ftsite
from ftsite import REDIS_FT, wait_for_redis
from ftsite.browser import Browser
from ftsite.cluster import HOSTS, Cluster, wait_for
from ftsite.site import in_netns

PROTECTED_WITHIN = 240  # as test_cluster: boot, transfer, a controller's pass
# From the host's death to the page: the failover and re-protection
# (test_cluster's bound) plus the page's look every 2 s.
FAILOVER_SHOWN_WITHIN = 60
REPROTECTED_SHOWN_WITHIN = 150
HANDOVER_SHOWN_WITHIN = 120
ARTIFACTS = Path(os.environ.get("FTVM_ARTIFACTS", ftsite.REPO / "target" / "artifacts"))

CARD = 'article.vm[data-vm="redis"]'


def card_state(b):
    """(state, primary, backup, lag text) of the redis VM as the page shows it."""
    return (b.attr(f"{CARD} .protection", "data-state"), b.text(f"{CARD} dd.primary"),
            b.text(f"{CARD} dd.backup"), b.text(f"{CARD} dd.lag"))


def post_from_page(b, body, csrf):
    """POST /ui/actions from the page's own origin with its cookie, the
    CSRF header only if `csrf`: (status, JSON answer)."""
    script = """
        const [body, csrf, done] = arguments;
        const headers = {"Content-Type": "application/json"};
        if (csrf) headers["X-Ftvm-Csrf"] = csrf;
        fetch("/ui/actions", {method: "POST", headers, body})
            .then(async (r) => done([r.status, await r.text()]))
            .catch((e) => done([0, String(e)]));
    """
    status, text = b.do(lambda d: d.execute_async_script(script, json.dumps(body), csrf))
    return status, json.loads(text) if text.startswith("{") else text


def test_the_dashboard_shows_a_failover_and_hands_over(ftvm, scratch):
    cl = Cluster(ftvm, scratch, "db")
    cl.wait_hosts()
    cl.cli("vm", "create", "redis", "--on", "primary", "--memory", "512", "--command", REDIS_FT,
           "--bridge", "br0", "--ip", f"{ftsite.GUEST_IP}/24", "--protect", "checkpoint")
    wait_for_redis(cl.site, list(cl.agents.values()), ftsite.BOOT_TIMEOUT)
    # The backup's host is the controller's choice: the page is opened on
    # a host that will be neither side (the spare is chosen among the two
    # others only if it is the backup's).
    backup_host = wait_for("a backup host chosen", PROTECTED_WITHIN,
                           lambda: next((h for h, r in cl.sides("redis").items() if r == "backup"), None), every=1)
    third = next(h for h in HOSTS if h not in ("primary", backup_host))
    api = cl.records()[third]["api"]
    token = cl.token.read_text().strip()

    # Nothing of the cluster without a login: the feed and the actions
    # refuse, whatever a cookie or header says.
    for path, method, headers in (("/ui/stream", "GET", {}), ("/ui/actions", "POST", {"Cookie": "ftvm_session=x"}),
                                  ("/ui/stream", "GET", {"Cookie": "ftvm_session=" + "0" * 64})):
        req = urllib.request.Request(api + path, method=method, headers=headers, data=b"{}" if method == "POST" else None)
        try:
            in_netns(cl.site.ns["client"],
                     lambda: urllib.request.urlopen(req, timeout=10, context=cl.pki.ssl_context()))
            raise AssertionError(f"{method} {path} answered without a login")
        except urllib.error.HTTPError as e:
            assert e.code == 401, (path, e.code)
            assert json.loads(e.read())["error"] == "unauthorized"

    b = Browser(cl.site, pins=cl.pki.spki_pins())
    try:
        b.get(api + "/ui")
        assert b.css("#token") and not b.css(CARD), "the login page shows the cluster"
        b.type("#token", "not-the-token-0123456789")
        b.click("#login")
        refusal = wait_for("the refusal", 10, lambda: b.text("#refusal"), every=0.2)
        assert "wrong token" in refusal and "\n" not in refusal, refusal
        assert not b.css(CARD)
        b.type("#token", token)
        b.click("#login")
        b.console_errors()  # the wrong token's refusal is not the page's
        wait_for("the page", 30, lambda: b.css("#view"), every=0.2)

        # With the session's cookie but not the page's CSRF header, an
        # action is refused; with it, a thing that is no action is too.
        csrf = b.attr("meta[name=ftvm-csrf]", "content")
        assert csrf and len(csrf) == 64, csrf
        status, answer = post_from_page(b, {"action": "handover", "vm": "redis"}, None)
        assert (status, answer["error"]) == (403, "unauthorized"), (status, answer)
        status, answer = post_from_page(b, {"action": "format_disks", "vm": "redis"}, csrf)
        assert (status, answer["error"]) == (400, "bad_request"), (status, answer)
        assert not b.css("#jobs li.job"), "a refused action became a job"
        b.console_errors()  # those refusals were the test's

        # The page opened while the backup takes the machine: protected,
        # with a lag that is a figure, and live: the view's time moves on.
        seen = set()
        shown = wait_for("the VM protected on the page", PROTECTED_WITHIN,
                         lambda: (s := card_state(b))[0] == "protected" or seen.add(s[0]), every=0.5)
        shown = card_state(b)
        print(f"the page showed redis as {sorted(filter(None, seen))} before it was protected")
        assert shown[1:3] == ("primary", backup_host), shown
        assert re.fullmatch(r"\d+ ms", shown[3]), f"the lag is not a figure: {shown}"
        asof = b.text("#asof")
        wait_for("the page to update", 15, lambda: b.text("#asof") != asof, every=0.5)
        assert b.text("#live") == "live"
        hosts = [r.get_attribute("data-host") for r in b.css("#hosts tbody tr")]
        assert sorted(hosts) == sorted(HOSTS), hosts
        print(f"the page on {third}'s agent: redis {shown}")

        died = cl.kill_host("primary")
        wait_for("the failover on the page's timeline", FAILOVER_SHOWN_WITHIN,
                 lambda: b.css('#events tr[data-kind="failover"]'), every=0.5)
        failover_at = time.monotonic() - died
        again = wait_for("the VM protected again on the page", REPROTECTED_SHOWN_WITHIN,
                         lambda: (s := card_state(b))[:3] == ("protected", backup_host, third) and s, every=0.5)
        reprotected_at = time.monotonic() - died
        assert re.fullmatch(r"\d+ ms", again[3]), again
        wait_for("the re-protection on the timeline", 30,
                 lambda: b.css('#events tr[data-kind="reprotection"]'), every=0.5)
        lost = b.text('#hosts tr[data-host="primary"] td.health')
        assert lost and lost.startswith("lost"), f"the dead host shows as {lost!r}"
        time.sleep(10)  # a few looks more, for the charts
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = b.screenshot(ARTIFACTS / f"dashboard-after-failover-{int(time.time())}.png")
        print(f"the page showed the failover {failover_at:.1f} s and the VM protected again {reprotected_at:.1f} s "
              f"after the primary's host died; screenshot: {shot}")

        # Handover, confirmed on the page.
        b.click(f'{CARD} button[data-action="handover"]')
        wait_for("the confirmation", 5, lambda: b.attr("#confirm", "hidden") is None, every=0.2)
        b.click("#confirm-yes")
        t0 = time.monotonic()
        wait_for("the handover's job on the page", 10, lambda: b.css("#jobs li.job"), every=0.2)
        done = wait_for("the handover's result", HANDOVER_SHOWN_WITHIN,
                        lambda: b.attr("#jobs li.job", "data-done") != "running" and b.text("#jobs li.job"),
                        every=0.5)
        assert b.attr("#jobs li.job", "data-done") == "ok", done
        wait_for("the handover on the timeline", 30, lambda: b.css('#events tr[data-kind="handover"]'), every=0.5)
        moved = wait_for("the VM's primary on the third host on the page", 60,
                         lambda: (s := card_state(b))[1] == third and s, every=0.5)
        print(f"handover from the page: {done!r}; {time.monotonic() - t0:.1f} s later the page shows {moved}")
        assert cl.sides("redis").get(third) in ("primary", "unprotected"), cl.sides("redis")
        # The controller gives it a backup again (the VM's record wants
        # protection), and the page shows it.
        after = wait_for("the VM protected again after the handover on the page", REPROTECTED_SHOWN_WITHIN,
                         lambda: (s := card_state(b))[:2] == ("protected", third) and s, every=0.5)
        print(f"{time.monotonic() - t0:.1f} s after the handover was confirmed the page shows {after}")
        errors = b.console_errors()
        assert not errors, f"the page's console: {errors}"
    finally:
        b.quit()
