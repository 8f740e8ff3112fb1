"""The layering (docs/extending.md), enforced: import-linter's contracts in setup.cfg, run on
the installed layout by scripts/lint_imports.py, all kept and none ignoring an import; the
contracts name every experiment; host programs import only the standard library, numpy and
themselves, and scapy, torch and matplotlib only in the modules named below. Cycles and
imports inside functions are counted by test_import_graph.py."""
from __future__ import annotations

import ast
import configparser
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SETUP_CFG = REPO / "setup.cfg"
TRAFFIC = REPO / "traffic"
SHARED_EXPERIMENT_FOLDERS = {"roce_common"}  # what the RoCE experiments share: no experiment
# Host-program module -> the heavy optional package it may import, and why.
OPTIONAL = {
    "testbed.traffic.roce.wire": {"scapy"},  # RoCEv2's headers, built and parsed as packets
    "testbed.traffic.training.torch_ddp": {"torch"},  # the PyTorch DDP rank (the torch extra)
    "testbed.traffic.training.gantt": {"matplotlib"},  # a schedule drawn, off the hosts' path
}
HOST_PROGRAM_IMPORTS = {"numpy"}


def lint_imports():
    spec = importlib.util.spec_from_file_location("lint_imports", REPO / "scripts" /
                                                  "lint_imports.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def contracts() -> dict[str, configparser.SectionProxy]:
    config = configparser.ConfigParser()
    config.read(SETUP_CFG)
    prefix = "importlinter:contract:"
    return {name[len(prefix):]: config[name] for name in config.sections()
            if name.startswith(prefix)}


def listed(section: configparser.SectionProxy, key: str) -> set[str]:
    return set(section[key].split())


def experiment_folders() -> set[str]:
    return {p.name for p in (REPO / "testbed" / "experiments").iterdir()
            if (p / "__init__.py").exists()}


def test_every_contract_is_kept():
    done = lint_imports().run(capture=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Contracts: {len(contracts())} kept, 0 broken." in done.stdout, done.stdout


def test_an_import_against_the_layers_breaks_a_contract():
    # apply/ importing measure/ (siblings that must not know each other) fails the check
    done = lint_imports().run(capture=True, added={
        "testbed/apply/failures.py": "import testbed.measure.stats  # noqa"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "testbed.apply.failures -> testbed.measure.stats" in done.stdout


def test_no_contract_ignores_an_import():
    assert len(contracts()) == 7
    for name, section in contracts().items():
        assert "ignore_imports" not in section, name
        assert "unmatched_ignore_imports_alerting" not in section, name


def test_the_contracts_name_every_experiment():
    folders = {f"testbed.experiments.{name}" for name in experiment_folders()}
    shared = {f"testbed.experiments.{name}" for name in SHARED_EXPERIMENT_FOLDERS}
    assert listed(contracts()["experiments"], "modules") == folders - shared
    assert listed(contracts()["tools"], "forbidden_modules") == folders


def module_name(path: Path) -> str:
    parts = list(path.relative_to(TRAFFIC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["testbed", "traffic", *parts])


def external_imports(path: Path) -> set[str]:
    """The top-level names of every absolute import in a file that is not the project's."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names - {"testbed"}


def test_host_programs_import_the_standard_library_numpy_and_named_optionals_only():
    allowed = set(sys.stdlib_module_names) | HOST_PROGRAM_IMPORTS
    seen_optional = {}
    for path in sorted(TRAFFIC.rglob("*.py")):
        module = module_name(path)
        found = external_imports(path)
        assert found <= allowed | OPTIONAL.get(module, set()), (module, found - allowed)
        if found & OPTIONAL.get(module, set()):
            seen_optional[module] = found & OPTIONAL[module]
    assert seen_optional == OPTIONAL  # each allowance is still used
