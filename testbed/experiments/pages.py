"""The experiments' docs index (docs/experiments.md), made from the registry and each
experiment's folder README, whose title line (``# name: what it shows``) names the claim: a
new experiment's folder and registry line put it in the index with no other edit. The file is
a build output, never edited: ``python -m testbed.experiments.pages --write`` rewrites it, and
tests/unit/experiments/test_pages.py checks it is current."""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

from testbed.experiments.registry import EXPERIMENTS, experiment_classes

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
INDEX_PATH = DOCS / "experiments.md"
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


def page_link(name: str, readme: Path, docs: Path = DOCS) -> str:
    """The experiment's page as the index links it: docs/<name>.md where it has one, else its
    folder README, relative to the docs folder."""
    page = docs / f"{name}.md"
    return page.name if page.exists() else os.path.relpath(readme, docs)


def index_markdown(rows: list[tuple[str, str, str]]) -> str:
    """The index from (name, claim, link) rows, in the order given."""
    return INDEX_HEADER + "".join(f"| `{name}` | {claim} | [{link}]({link}) |\n"
                                  for name, claim, link in rows)


def experiment_index() -> str:
    """docs/experiments.md as the registry and the folder READMEs make it now."""
    rows = []
    for name in sorted(experiment_classes()):
        readme = readme_path(name)
        rows.append((name, title_claim(name, readme.read_text()), page_link(name, readme)))
    return index_markdown(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {INDEX_PATH}")
    args = parser.parse_args(argv)
    text = experiment_index()
    if args.write:
        INDEX_PATH.write_text(text)
        print(f"wrote {INDEX_PATH}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
