"""The experiments' pages in docs/, made from the registry and each experiment's folder
README, which is the page: its title line (``# name: what it shows``) is the claim, written
once. ``docs/<name>.md`` is the README with its links rebased to docs/, and the index
(docs/experiments.md) lists every experiment with its claim, so a new experiment's folder and
registry line put it in both with no other edit. A docs page that does not open with
GENERATED_MARK is written by hand, and is left alone. These files are build
outputs, never edited: ``python -m testbed.experiments.pages --write`` rewrites them, and
tests/unit/experiments/test_pages.py checks they are current."""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
from pathlib import Path

from testbed.experiments.registry import EXPERIMENTS, experiment_classes

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
INDEX_PATH = DOCS / "experiments.md"
GENERATED_MARK = "<!-- written from {source} by python -m testbed.experiments.pages --write -->\n"
# A markdown link's target: a relative path (no scheme, not an anchor alone), then its anchor.
LINK = re.compile(r"\]\((?![a-z]+:|#|/)([^)#\s]+)(#[^)\s]*)?\)")
INDEX_HEADER = """\
# Experiments

Every registered experiment, with what it shows; the page of each says how to run it, what it
checks and what it has measured. Written from each experiment's folder README by
`python -m testbed.experiments.pages --write` (never by hand); how to add one:
[extending.md](extending.md#extending-it).

| experiment | what it shows | page |
|---|---|---|
"""


def readme_path(name: str) -> Path:
    """The README.md of the folder that holds experiment ``name``'s module."""
    module = EXPERIMENTS[name].partition(":")[0]
    return Path(importlib.util.find_spec(module).origin).parent / "README.md"


def title_claim(name: str, readme: str) -> str:
    """What the README's title line (``# name: claim``) says the experiment shows."""
    first = readme.lstrip().splitlines()[0] if readme.strip() else ""
    prefix = f"# {name}: "
    if not first.startswith(prefix):
        raise ValueError(f"{name}'s README must open with '{prefix}<what it shows>', "
                         f"not {first[:60]!r}")
    return first[len(prefix):].strip()


def claim(name: str) -> str:
    """What experiment ``name`` shows: its README's title line after the name (the one place
    the claim is written; ``testbed list`` and ``testbed NAME --help`` print it)."""
    return title_claim(name, readme_path(name).read_text())


def rebase_links(text: str, from_dir: Path, to_dir: Path) -> str:
    """``text``'s relative links, written from ``from_dir``, as ``to_dir`` must write them."""
    def rebased(match: re.Match) -> str:
        target = os.path.normpath(from_dir / match.group(1))
        return f"]({os.path.relpath(target, to_dir)}{match.group(2) or ''})"
    return LINK.sub(rebased, text)


def page_markdown(readme: Path, docs: Path = DOCS) -> str:
    """docs/<name>.md written from the experiment's folder README."""
    source = os.path.relpath(readme, docs.parent)
    return (GENERATED_MARK.format(source=source)
            + rebase_links(readme.read_text(), readme.parent, docs))


def is_generated(page: Path) -> bool:
    """Whether docs page ``page`` is written from its README: it is absent (a new
    experiment's) or opens with GENERATED_MARK."""
    return not page.exists() or page.read_text().startswith(GENERATED_MARK.partition("{")[0])


def experiment_pages(docs: Path = DOCS) -> dict[Path, str]:
    """Every generated docs page (path -> text) as the folder READMEs make it now."""
    pages = {}
    for name in sorted(experiment_classes()):
        page = docs / f"{name}.md"
        if is_generated(page):
            pages[page] = page_markdown(readme_path(name), docs)
    return pages


def index_markdown(rows: list[tuple[str, str, str]]) -> str:
    """The index from (name, claim, link) rows, in the order given."""
    return INDEX_HEADER + "".join(f"| `{name}` | {claim} | [{link}]({link}) |\n"
                                  for name, claim, link in rows)


def experiment_index() -> str:
    """docs/experiments.md as the registry and the folder READMEs make it now."""
    rows = []
    for name in sorted(experiment_classes()):
        rows.append((name, claim(name), f"{name}.md"))
    return index_markdown(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true",
                        help="write the index and the pages (else print the index)")
    args = parser.parse_args(argv)
    text = experiment_index()
    if not args.write:
        sys.stdout.write(text)
        return 0
    for path, page in {INDEX_PATH: text, **experiment_pages()}.items():
        path.write_text(page)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
