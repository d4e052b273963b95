"""The figures in docs/PERFORMANCE.md's current table and the README's
opening paragraph are what bench/results/*.json renders (ftsite.figures),
so a table edited by hand, or data changed without rendering, fails here;
and every results file keeps to the schema of ftsite/bench/results.py.
Needs no root, no ftvm binary and no guest image."""

import copy
import difflib
import re

import pytest

from ftsite import figures
from ftsite.bench import results


@pytest.fixture(scope="module")
def docs():
    d = results.read_all()
    assert d, f"no results file in {results.DIR}"
    return d


def test_the_committed_docs_are_what_the_data_renders(docs):
    for path, want in figures.rendered(docs).items():
        have = path.read_text()
        diff = "".join(difflib.unified_diff(have.splitlines(True), want.splitlines(True), str(path), "rendered", n=0))
        assert have == want, f"{path} is not what bench/results renders: run scripts/render-figures\n{diff[:4000]}"


def test_rendering_again_changes_nothing(docs):
    for path, text in figures.rendered(docs).items():
        body = figures.table(docs) if path == figures.PERFORMANCE else figures.readme_text(docs)
        assert figures.render(text, body) == text


def test_a_changed_figure_shows_in_the_table_and_the_readme(docs):
    changed = copy.deepcopy(docs)
    fig = next(f for f in changed["vs-qemu"]["figures"] if f["id"] == "vs-qemu.boot")
    fig["ratio"] = 9.99
    assert "| 9.99 |" in figures.table(changed) and "| 9.99 |" not in figures.table(docs)
    assert "9.99 times QEMU's time" in figures.readme_text(changed)


def test_the_markers_must_be_there_once():
    with pytest.raises(ValueError):
        figures.render("no markers here", "x")
    twice = f"{figures.BEGIN}\na\n{figures.END}\n{figures.BEGIN}\nb\n{figures.END}\n"
    with pytest.raises(ValueError):
        figures.render(twice, "x")


def test_every_results_file_keeps_to_the_schema(docs):
    ids = set()
    for bench, doc in docs.items():
        assert doc.get("bench") == bench and isinstance(doc.get("figures"), list) and doc["figures"], bench
        for f in doc["figures"]:
            assert set(f) <= set(results.FIGURE_KEYS), (f["id"], set(f) - set(results.FIGURE_KEYS))
            missing = [k for k in results.FIGURE_KEYS if k != "note" and k not in f]
            assert not missing, (f["id"], missing)
            assert f["id"] not in ids, f"figure id {f['id']} twice"
            ids.add(f["id"])
            assert f["name"] and f["command"], f["id"]
            assert re.fullmatch(r"\d{4}-\d\d-\d\d(T[\d:]+[+-]\d{4})?", f["date"]), (f["id"], f["date"])
            assert isinstance(f["stale"], bool) and f["met"] in (True, False, None), f["id"]
            assert f["value"] is not None or f["ratio"] is not None, f"{f['id']}: neither a value nor a ratio"
            if f["peer"] is not None:
                assert set(f["peer"]) == {"name", "value", "unit"}, f["id"]
