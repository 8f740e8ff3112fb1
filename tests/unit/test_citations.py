"""What the code and docs cite is in the repository: no path outside it (an absolute path
into a developer's machine, a sibling folder) and none of the notes that do not ship with
the project; the facts they held are in docs/platforms.md and docs/references.md. Every
relative link between the docs leads to a file that exists."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Names of notes kept outside the repository, and paths that lead out of it; spelled in
# pieces so this file does not cite them itself.
OUTSIDE = [name + ".md" for name in ("PLATFORM", "ANCHORS", "STYLE")] + [
    "/" + "work/", ".." + "/shared"]
LINK = re.compile(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)")


def tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True,
                         check=True).stdout.decode()
    files = []
    for name in filter(None, out.split("\0")):
        path = REPO / name
        if path.is_file() and path.suffix in {".py", ".md", ".yaml", ".yml", ".txt", ".cfg",
                                              ".toml", ".sh", ".c", ".json", ""}:
            files.append(path)
    return files


def test_nothing_cites_a_file_outside_the_repository():
    found = []
    for path in tracked_text_files():
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for needle in OUTSIDE:
            if needle in text:
                found.append(f"{path.relative_to(REPO)}: {needle}")
    assert found == []


def test_the_docs_links_lead_to_files_in_the_repository():
    broken = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in LINK.findall(path.read_text()):
            if not (path.parent / target).resolve().exists():
                broken.append(f"{path.relative_to(REPO)} -> {target}")
    assert broken == []
