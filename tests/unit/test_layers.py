"""The layering (docs/extending.md), enforced: import-linter's contracts in setup.cfg, run on
the installed layout by scripts/lint_imports.py, all kept and none ignoring an import; the
experiments' contract (scripts/experiment_contract.py) finds every registered experiment by its
folder, with none listed by hand; host programs import only the standard library, numpy and
themselves, and scapy, torch and matplotlib only in the modules named below. Cycles and
imports inside functions are counted by test_import_graph.py."""
from __future__ import annotations

import ast
import configparser
import importlib.util
import sys
from pathlib import Path

from testbed.experiments.registry import EXPERIMENTS

REPO = Path(__file__).resolve().parents[2]
SETUP_CFG = REPO / "setup.cfg"
TRAFFIC = REPO / "traffic"
# Host-program module -> the heavy optional package it may import, and why.
OPTIONAL = {
    "testbed.traffic.roce.wire": {"scapy"},  # RoCEv2's headers, built and parsed as packets
    "testbed.traffic.training.torch_ddp": {"torch"},  # the PyTorch DDP rank (the torch extra)
    "testbed.traffic.training.gantt": {"matplotlib"},  # a schedule drawn, off the hosts' path
}
HOST_PROGRAM_IMPORTS = {"numpy"}


def script(name: str):
    """A module of scripts/, loaded from its file (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lint_imports():
    return script("lint_imports")


def contracts() -> dict[str, configparser.SectionProxy]:
    config = configparser.ConfigParser()
    config.read(SETUP_CFG)
    prefix = "importlinter:contract:"
    return {name[len(prefix):]: config[name] for name in config.sections()
            if name.startswith(prefix)}


def listed(section: configparser.SectionProxy, key: str) -> list[str]:
    return section[key].split()


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
    assert len(contracts()) == 6
    for name, section in contracts().items():
        assert "ignore_imports" not in section, name
        assert "unmatched_ignore_imports_alerting" not in section, name


def test_the_experiments_contract_finds_every_registered_experiment_and_names_no_folder():
    section = contracts()["experiments"]
    container = section["container"]
    modules = {module_name(path, REPO / "testbed", "testbed")
               for path in (REPO / "testbed" / "experiments").rglob("*.py")}
    experiments, problems = script("experiment_contract").classify(
        container, modules, listed(section, "shared"), listed(section, "loaders"))
    registered = {target.partition(":")[0].rpartition(".")[0] for target in EXPERIMENTS.values()}
    assert problems == []
    assert experiments == sorted(registered)
    by_hand = [(name, key) for name, contract in contracts().items() if name != "experiments"
               for key, value in contract.items() if f"{container}." in value]
    assert by_hand == []  # no other contract lists a folder under the container


def test_the_experiments_contract_classifies_the_container_s_children():
    classify = script("experiment_contract").classify
    modules = {"box", "box.one", "box.one.experiment", "box.two.experiment", "box.two.plots",
               "box.common", "box.common.util", "box.registry", "box.stray", "box.stray.x",
               "other.three.experiment"}
    experiments, problems = classify("box", modules, ["box.common"], ["box.registry"])
    assert experiments == ["box.one", "box.two"]
    assert problems == ["box.stray is not an experiment (it has no experiment.py) and is not "
                        "named in the contract's shared or loaders"]
    experiments, problems = classify("box", modules, ["box.common", "box.one"],
                                     ["box.registry", "box.stray"])
    assert experiments == ["box.two"]
    assert problems == ["box.one holds an experiment.py but is named in the contract's shared or "
                        "loaders"]


def module_name(path: Path, folder: Path = TRAFFIC, package: str = "testbed.traffic") -> str:
    """The installed module name of a file under ``folder``, which installs as ``package``."""
    parts = list(path.relative_to(folder).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([package, *parts])


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
