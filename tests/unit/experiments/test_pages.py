"""The experiments' docs index: docs/experiments.md is what the registry and the folder READMEs
make now, each README opens with its experiment's name and claim, and the index lists them."""
from __future__ import annotations

import pytest

from testbed.experiments.pages import (
    INDEX_PATH,
    experiment_index,
    index_markdown,
    page_link,
    title_claim,
)
from testbed.experiments.registry import EXPERIMENTS


def test_the_published_index_is_current():
    assert INDEX_PATH.read_text() == experiment_index(), (
        "docs/experiments.md is stale; rewrite it: "
        ".venv/bin/python -m testbed.experiments.pages --write")


def test_the_index_lists_every_registered_experiment_once():
    rows = [line for line in experiment_index().splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == sorted(EXPERIMENTS)


def test_the_claim_is_the_readme_title_after_the_name():
    assert title_claim("ping", "# ping: an idle fabric's RTT\n\nmore") == "an idle fabric's RTT"


@pytest.mark.parametrize("text", ["", "# pong: other\n", "ping: no heading\n", "# ping\n"])
def test_a_readme_without_its_title_line_is_refused_by_name(text):
    with pytest.raises(ValueError, match="ping's README must open with '# ping: "):
        title_claim("ping", text)


def test_an_experiment_without_a_docs_page_links_its_readme(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    readme = tmp_path / "testbed" / "experiments" / "ping" / "README.md"
    assert page_link("ping", readme, docs) == "../testbed/experiments/ping/README.md"
    (docs / "ping.md").write_text("# ping: x\n")
    assert page_link("ping", readme, docs) == "ping.md"


def test_index_rows_follow_the_header_in_order():
    text = index_markdown([("b", "second", "b.md"), ("a", "first", "a.md")])
    assert text.endswith("| `b` | second | [b.md](b.md) |\n| `a` | first | [a.md](a.md) |\n")
