"""docs/PERFORMANCE.md's current table and the README's opening figures,
rendered from bench/results/*.json (the schema: ftsite/bench/results.py).

This module owns the text between `<!-- figures:begin -->` and
`<!-- figures:end -->` in those two files: it rewrites only that, so a
second run changes nothing (`scripts/render-figures`, issue 64 step 5).
`--check` writes nothing and exits 1 if either file is not what the data
renders (harness/tests/test_figures.py runs the same check).

    scripts/render-figures            rewrite both files from the data
    scripts/render-figures --check    say whether they are up to date
"""

import argparse
import re
import sys
import textwrap

from ftsite.bench import results
from ftsite.host import REPO

BEGIN, END = "<!-- figures:begin -->", "<!-- figures:end -->"
MARKED = re.compile(re.escape(BEGIN) + r"\n.*?" + re.escape(END), re.S)
PERFORMANCE = REPO / "docs" / "PERFORMANCE.md"
README = REPO / "README.md"

# The table's order, by file: the order the table had before it was
# rendered; a file not named here comes after these, by name.
ORDER = ("userland", "servers", "cluster-redundancy", "vs-qemu", "cpu-core", "redis", "dirty-tracking",
         "record-replay", "record-overhead", "recording", "failover", "ft-overhead", "issue25-ab", "ft-network",
         "lag-control", "false-alarms", "fencing", "epoch-table", "encryption-price", "handover", "protect",
         "checkpoint", "clock-drift", "snapshot")

# The README's opening figures: (figure id, the words; {value}, {ratio},
# {peer}, {note} are the figure's, {ratio} and {value} as the table shows
# them). A stale figure gets "(measured before the translation tier)".
README_FIGURES = (
    ("vs-qemu.boot", "it boots Linux in {ratio} times QEMU's time"),
    ("vs-qemu.job", "runs a CPU job in {ratio} times QEMU's"),
    ("userland.all.1", "and python3's own tests, sqlite3 and gzip/xz together in {ratio} times QEMU's"),
    ("failover.lockstep.crash", "A lockstep pair fails over from a crashed host in {value} (median)"),
    ("failover.checkpoint.crash", "a checkpoint pair in {value}"),
    ("ft-overhead.cpu", "Under lockstep a CPU job keeps {ratio} of its speed without FT"),
    ("lag-control.typical", "and the backup of a CPU-bound guest trails it by {value} (the median lag of each run)"),
    ("epoch-table.one-program-26ms.beaten",
     "Epoch mode beats {value} of Bressoud & Schneider's Table 1 in the paper's conditions"),
    ("epoch-table.dd-per-block-page-cache.beaten", "and {value} on the host's page cache"),
    ("checkpoint.overhead.40", "Checkpoint mode costs a CPU-and-memory job {value} at 40 checkpoints a second "
                               "(Remus, on a kernel compile: {peer})"),
    ("protect.lockstep", "A running VM is protected with a final pause of {value} (lockstep, median)"),
    ("cluster-redundancy.redundancy", "and a cluster has a VM whose host died protected again in {value} (median)"),
    ("fencing.isolated", "A primary cut off from the network left the VM to its backup in {value}"),
)


def num(x):
    """A value as the table shows it: a number as short as it reads, a
    list joined, a string as it is; None as a dash."""
    if x is None:
        return "–"
    if isinstance(x, list):
        return ", ".join(num(v) for v in x)
    if isinstance(x, float):
        return f"{x:g}"
    return str(x)


def with_unit(x, unit):
    if x is None:
        return "–"
    return f"{num(x)} {unit or ''}".strip()


def cell(text):
    """Table-safe: no line breaks, no bare pipes."""
    return str(text).replace("\n", " ").replace("|", "\\|")


def peer_text(peer):
    if not peer:
        return "–"
    if peer.get("value") is None:
        return peer["name"]
    return f"{peer['name']}: {with_unit(peer['value'], peer.get('unit'))}"


def target_text(f):
    if not f.get("target"):
        return "–"
    verdict = {True: "met", False: "missed"}.get(f.get("met"))
    return f"{f['target']}" + (f": **{verdict}**" if verdict else "")


def ordered(docs):
    """Every figure, in the table's order."""
    names = [n for n in ORDER if n in docs] + sorted(n for n in docs if n not in ORDER)
    return [f for n in names for f in docs[n].get("figures", [])]


def table(docs):
    """The current table: one line per figure."""
    lines = ["| figure | value | peer | ratio | target | command | date | commit |",
             "|---|---|---|---|---|---|---|---|"]
    for f in ordered(docs):
        name = ("† " if f.get("stale") else "") + f["name"] + (f" ({f['note']})" if f.get("note") else "")
        value = with_unit(f.get("value"), f.get("unit"))
        lines.append("| " + " | ".join(cell(c) for c in (
            name, f"**{value}**" if f.get("value") is not None else "–", peer_text(f.get("peer")),
            num(f.get("ratio")), target_text(f), f"`{f['command']}`" if f.get("command") else "–",
            (f.get("date") or "–")[:10], f.get("commit") or "not written down")) + " |")
    return "\n".join(lines)


def readme_text(docs):
    """The README's opening figures, one paragraph."""
    by_id = {f["id"]: f for f in ordered(docs)}
    parts = []
    for fid, words in README_FIGURES:
        f = by_id.get(fid)
        if f is None:
            continue
        text = words.format(value=with_unit(f.get("value"), f.get("unit")), ratio=num(f.get("ratio")),
                            peer=with_unit((f.get("peer") or {}).get("value"), (f.get("peer") or {}).get("unit")),
                            note=f.get("note") or "")
        if f.get("stale"):
            text += " (measured before the translation tier)"
        parts.append(text)
    # A part starting with a capital starts a new sentence.
    out = ""
    for p in parts:
        if not out:
            out = p[0].upper() + p[1:]
        elif p[0].isupper():
            out += ". " + p
        else:
            out += ", " + p
    out += (". Each figure's command, date and commit are in the current table of `docs/PERFORMANCE.md` "
            "(rendered, as this paragraph is, from `bench/results/*.json` by `scripts/render-figures`).")
    return textwrap.fill(out, width=74, break_long_words=False, break_on_hyphens=False)


def render(text, body):
    """`text` with the marked region's body replaced; ValueError if the
    markers are not there exactly once."""
    if len(MARKED.findall(text)) != 1:
        raise ValueError(f"want exactly one {BEGIN} ... {END} region")
    # Blank lines around the body: the markers are HTML blocks, which
    # must not run into the table or the paragraph in Markdown.
    return MARKED.sub(lambda _m: f"{BEGIN}\n\n{body}\n\n{END}", text)


def rendered(docs=None):
    """{path: what the file should hold} for both files."""
    docs = results.read_all() if docs is None else docs
    return {PERFORMANCE: render(PERFORMANCE.read_text(), table(docs)),
            README: render(README.read_text(), readme_text(docs))}


def main():
    ap = argparse.ArgumentParser(prog="render-figures", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is not up to date")
    args = ap.parse_args()
    stale = []
    for path, text in rendered().items():
        if path.read_text() != text:
            stale.append(path)
            if not args.check:
                path.write_text(text)
    rel = [str(p.relative_to(REPO)) for p in stale]
    if args.check:
        print(f"render-figures: {', '.join(rel)} not what bench/results renders: run scripts/render-figures"
              if stale else "render-figures: up to date")
        return 1 if stale else 0
    print(f"render-figures: rewrote {', '.join(rel)}" if stale else "render-figures: nothing to change")
    return 0


if __name__ == "__main__":
    sys.exit(main())
