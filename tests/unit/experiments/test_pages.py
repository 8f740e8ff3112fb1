"""The experiments' pages in docs/: the index (docs/experiments.md) and every page written
from a folder README are what the registry and the READMEs make now; each README opens with
its experiment's name and claim; links are rebased from the folder to docs/."""
from __future__ import annotations

import pytest

from testbed.experiments.pages import (
    DOCS,
    GENERATED_MARK,
    INDEX_PATH,
    experiment_index,
    experiment_pages,
    index_markdown,
    is_generated,
    page_markdown,
    rebase_links,
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


FIX = "rewrite them: .venv/bin/python -m testbed.experiments.pages --write"


def test_every_page_written_from_a_readme_is_current():
    pages = experiment_pages()
    in_the_way = sorted(f"{name}.md" for name in EXPERIMENTS if DOCS / f"{name}.md" not in pages)
    assert not in_the_way, (f"{', '.join(in_the_way)} written by hand, where the experiment's "
                            "page, written from its folder README, belongs")
    stale = [path.name for path, text in pages.items()
             if not path.exists() or path.read_text() != text]
    assert not stale, f"{', '.join(stale)} stale; {FIX}"


def test_a_page_is_its_readme_with_links_rebased_to_docs(tmp_path):
    docs, folder = tmp_path / "docs", tmp_path / "testbed" / "experiments" / "ping"
    docs.mkdir()
    folder.mkdir(parents=True)
    (folder / "README.md").write_text(
        "# ping: RTT\n\n[pfc](../../../docs/pfc.md#pause), [code](experiment.py), "
        "[web](https://example.org/a.md), [here](#ping)\n")
    page = page_markdown(folder / "README.md", docs)
    assert page.startswith(GENERATED_MARK.format(source="testbed/experiments/ping/README.md"))
    assert page.endswith("# ping: RTT\n\n[pfc](pfc.md#pause), "
                         "[code](../testbed/experiments/ping/experiment.py), "
                         "[web](https://example.org/a.md), [here](#ping)\n")


def test_rebasing_there_and_back_gives_the_text_again(tmp_path):
    text = "see [a](../x/a.md#b) and [c](c.md)"
    there = rebase_links(text, tmp_path / "docs", tmp_path / "t" / "e")
    assert rebase_links(there, tmp_path / "t" / "e", tmp_path / "docs") == text


def test_a_hand_written_page_is_left_alone(tmp_path):
    assert is_generated(tmp_path / "new.md")  # a new experiment's page is written
    (tmp_path / "old.md").write_text("# old: written by hand\n")
    assert not is_generated(tmp_path / "old.md")
    (tmp_path / "moved.md").write_text(GENERATED_MARK.format(source="x") + "# moved: y\n")
    assert is_generated(tmp_path / "moved.md")


def test_index_rows_follow_the_header_in_order():
    text = index_markdown([("b", "second", "b.md"), ("a", "first", "a.md")])
    assert text.endswith("| `b` | second | [b.md](b.md) |\n| `a` | first | [a.md](a.md) |\n")
