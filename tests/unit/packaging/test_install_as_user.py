"""scripts/install.sh run by a user who is not root (what `make doctor`, `make test-unit` and
`make topo` do before their command): with everything installed it checks, changes nothing
and succeeds; when something would have to be installed it stops, naming what, and still
changes nothing. Run here as the ``nobody`` user (through setpriv when the tests run as root)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
VENV = Path(sys.prefix)  # the venv these tests run in, made by scripts/install.sh
NOBODY = 65534
TIMEOUT_S = 120


def install_as_user(venv: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "TESTBED_VENV": str(venv), "HOME": "/nonexistent",
           "LANG": "C.UTF-8"}
    argv = ["bash", str(REPO / "scripts" / "install.sh")]
    if os.geteuid() == 0:
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


def test_a_user_passes_when_everything_is_installed():
    stamp = VENV / ".testbed-install.sha256"
    before = stamp.read_text()
    done = install_as_user(VENV)
    assert done.returncode == 0, done.stderr
    assert "venv up to date" in done.stdout and "ready in" in done.stdout
    assert "run as root" not in done.stderr
    assert stamp.read_text() == before


def test_a_user_is_told_what_would_need_root(tmp_path):
    done = install_as_user(tmp_path / "no-venv")
    assert done.returncode == 1
    assert done.stderr.strip() == (f"install.sh: run as root (sudo make install): no venv at "
                                   f"{tmp_path / 'no-venv'} yet")
    assert not (tmp_path / "no-venv").exists()
