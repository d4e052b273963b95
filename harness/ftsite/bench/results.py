"""A bench's result as a JSON file beside what it prints.

No bench wrote one before issue 69 (issue 64's step 5 asks for them, to
build docs/PERFORMANCE.md's table from data); the convention started here:
`bench/results/<name>.json`, one file per bench, rewritten by each run, with
what every result needs to be read later (the bench, when, which build, how
loaded the host was) around the bench's own figures under "results".
"""

import json
import os
import subprocess
import time
from pathlib import Path

from ftsite.host import REPO

DIR = REPO / "bench" / "results"


def commit():
    """The repository's HEAD (short), and whether the tree had changes."""
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return head + ("+changes" if dirty else "")


def write(name, command, results, path=None, ftvm=None):
    """Writes `results` (anything JSON takes) for bench `name`, run as
    `command` (its argv), to `path` (default bench/results/NAME.json);
    returns the path written."""
    path = Path(path) if path else DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "bench": name,
        "command": command,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "commit": commit(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "results": results,
    }
    if ftvm is not None:
        st = Path(ftvm).stat()
        doc["ftvm"] = {"path": str(ftvm), "built": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(st.st_mtime))}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)
    return path
