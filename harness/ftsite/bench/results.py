"""The one way a bench records its figures: `bench/results/<bench>.json`.

This module owns that file's schema, which docs/PERFORMANCE.md's current
table and the README's opening figures are rendered from
(`ftsite.figures`, `scripts/render-figures`; issue 64 step 5). A file is

    {"bench": "vs-qemu",
     "figures": [FIGURE, ...],
     "last_run": {"command", "date", "commit", "load_average_at_end",
                  "ftvm", "details"}}          (only once a run wrote it)

and each FIGURE, one thing measured, one line of the table:

    id          stable key, "<bench>.<what>" (a later run replaces the
                figure with the same id, and leaves the others as they were)
    name        what it is, in words
    value, unit the figure: a number; a list (one per run, as a record gives
                them); a string (a range as a record gives it, "132-137");
                null where the figure is the ratio
    peer        what it is set beside: {"name", "value", "unit"} (value
                null where that record gives none), or null
    ratio       value / peer's value, or the figure's own ratio (FT / not)
    target      the goal in words ("≤ 1.0"), or null; met: true/false/null
    command     the command that measured it
    date        when ("YYYY-MM-DD", or with the time when a run wrote it)
    commit      the build measured (a run: the repository's HEAD, with
                "+changes" for a dirty tree), null where the record has none
    load        the host's load average ([1, 5, 15 min] at the run's end,
                or the record's words), null where unknown
    stale       true for a figure measured before a change that moved it
                (the table marks it †)
    note        optional, a few words the table shows after the name

    ratio, peer's value: a number, a list or a string, as value

A file may say more at the top (a "note": where figures that no run of
the bench wrote came from); a run keeps it. A run writes its figures
stamped with its command, date, commit and load (`write`); its whole
result, as the bench prints it, goes under "last_run"."details".
`read`/`read_all` give the files back.
"""

import json
import os
import shlex
import subprocess
import time
from pathlib import Path

from ftsite.host import REPO

DIR = REPO / "bench" / "results"

# The keys a figure may carry, in the order a file lists them.
FIGURE_KEYS = ("id", "name", "value", "unit", "peer", "ratio", "target", "met",
               "command", "date", "commit", "load", "stale", "note")


def commit():
    """The repository's HEAD (short), and whether the tree had changes."""
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return head + ("+changes" if dirty else "")


def peer(name, value=None, unit=None):
    """What a figure is set beside: QEMU, the paper, the unprotected VM."""
    return {"name": name, "value": value, "unit": unit}


def figure(id, name, value, unit="", *, peer=None, ratio=None, target=None, met=None, note=None):
    """One figure of a run (`write` stamps command, date, commit and load)."""
    fig = {"id": id, "name": name, "value": _num(value), "unit": unit, "peer": peer,
           "ratio": _num(ratio, 3), "target": target, "met": met}
    if peer is not None:
        peer["value"] = _num(peer.get("value"))
    if note:
        fig["note"] = note
    return fig


def _num(x, digits=4):
    """A float rounded to `digits` significant places (None and NaN: None;
    a list, each; a string, a range as written, as it is)."""
    if isinstance(x, list):
        return [_num(v, digits) for v in x]
    if x is None or isinstance(x, (int, str)):
        return x
    return None if x != x else float(f"{x:.{digits}g}")


def add_option(ap, bench):
    """The `--json PATH` option every bench takes."""
    ap.add_argument("--json", metavar="PATH",
                    help=f"where to write the figures (default bench/results/{bench}.json; "
                         "a run replaces the figures it measured and keeps the others)")


def read(path):
    """A results file as a dict (a missing or unreadable one: None)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_all(directory=DIR):
    """Every results file of `directory`, by bench name."""
    out = {}
    for p in sorted(Path(directory).glob("*.json")):
        doc = read(p)
        if doc is not None:
            out[doc.get("bench") or p.stem] = doc
    return out


def write(bench, command, figures, details=None, path=None, ftvm=None):
    """Records a run of `bench`, run as `command` (its argv): `figures`
    (from `figure`) replace those of the same id in `path` (default
    bench/results/BENCH.json), the others stay; `details` (anything JSON
    takes: the run's whole result) goes under "last_run". A figure whose
    value and ratio are both None (nothing measured: a `--qemu-only` run)
    is left out. Returns the path written."""
    path = Path(path) if path else DIR / f"{bench}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    cmd = shlex.join(command)
    stamp = {"command": cmd, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "commit": commit(),
             "load": [round(x, 2) for x in os.getloadavg()], "stale": False}
    new = [{k: v for k, v in {**f, **stamp}.items() if k in FIGURE_KEYS}
           for f in figures if f.get("value") is not None or f.get("ratio") is not None]
    for f in new:
        f.update({k: None for k in FIGURE_KEYS if k not in f and k != "note"})
    old = (read(path) or {}).get("figures", [])
    by_id = {f["id"]: f for f in new}
    merged = [by_id.pop(f["id"], f) for f in old] + [f for f in new if f["id"] in by_id]
    run = {"command": cmd, "date": stamp["date"], "commit": stamp["commit"],
           "load_average_at_end": stamp["load"], "details": details}
    if ftvm is not None and Path(ftvm).exists():
        built = time.localtime(Path(ftvm).stat().st_mtime)
        run["ftvm"] = {"path": str(ftvm), "built": time.strftime("%Y-%m-%dT%H:%M:%S%z", built)}
    doc = {**(read(path) or {}), "bench": bench, "figures": [{k: f[k] for k in FIGURE_KEYS if k in f} for f in merged],
           "last_run": run}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, ensure_ascii=False, default=str) + "\n")
    tmp.replace(path)
    return path
