"""The experiments' import rules as an import-linter contract type (setup.cfg's
[importlinter:contract:experiments]), so that a new experiment folder needs no edit of the
contracts.

Every package under the container (testbed.experiments) that holds an ``experiment`` module
is an experiment, found in the import graph on each run. The container's other children are
named once, in the contract: ``shared`` folders (what several experiments share; experiments
may import them) and ``loaders`` (the registry and the docs index, above the experiments: they
load them). A child that is none of these breaks the contract, so a folder without its
experiment.py, or a new shared folder, is written down rather than left unchecked.

The rules are import-linter's own contracts, applied to what was found:
- independence: no experiment imports another, directly or through a shared folder;
- forbidden: a shared folder imports no experiment;
- forbidden: ``experiment_free_modules`` (the capacity tools, the chaos suite) import no
  experiment and no shared folder (they may import the loaders).

scripts/lint_imports.py puts this folder on lint-imports' path.
"""
from __future__ import annotations

from collections.abc import Iterable

from importlinter import Contract, ContractCheck, fields, output
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.independence import IndependenceContract

EXPERIMENT_MODULE = "experiment"  # the module whose presence makes a folder an experiment


def children(container: str, modules: Iterable[str]) -> set[str]:
    """The container's direct children among ``modules`` (dotted names)."""
    prefix = f"{container}."
    return {prefix + name[len(prefix):].partition(".")[0] for name in modules
            if name.startswith(prefix)}


def classify(container: str, modules: Iterable[str], shared: Iterable[str],
             loaders: Iterable[str]) -> tuple[list[str], list[str]]:
    """(experiments, problems): the container's children that hold an ``experiment`` module,
    sorted, and one line for each child that is neither an experiment nor named in ``shared``
    or ``loaders``, or is named there while holding an ``experiment`` module."""
    modules = set(modules)
    named = set(shared) | set(loaders)
    found = {child for child in children(container, modules)
             if f"{child}.{EXPERIMENT_MODULE}" in modules}
    problems = [f"{child} is not an experiment (it has no {EXPERIMENT_MODULE}.py) and is not "
                f"named in the contract's shared or loaders"
                for child in sorted(children(container, modules) - found - named)]
    problems += [f"{child} holds an {EXPERIMENT_MODULE}.py but is named in the contract's "
                 f"shared or loaders" for child in sorted(found & named)]
    return sorted(found - named), problems


def names(modules) -> list[str]:
    """The dotted names of a module field's value (None when the option is left out)."""
    return sorted(module.name for module in modules or [])


class ExperimentFoldersContract(Contract):
    """No experiment imports another; shared folders import no experiment; the
    ``experiment_free_modules`` import neither. The experiments are found, not listed.

    Options: ``container`` (the experiments' package), ``shared`` and ``loaders`` (its children
    that are not experiments, see the module docstring), ``experiment_free_modules``."""

    container = fields.ModuleField()
    shared = fields.ListField(subfield=fields.ModuleField(), required=False)
    loaders = fields.ListField(subfield=fields.ModuleField(), required=False)
    experiment_free_modules = fields.ListField(subfield=fields.ModuleField(), required=False)

    def check(self, graph, verbose: bool) -> ContractCheck:
        container, shared = self.container.name, names(self.shared)
        loaders, free = names(self.loaders), names(self.experiment_free_modules)
        for module in [container, *shared, *loaders, *free]:
            if module not in graph.modules:
                raise ValueError(f"Module '{module}' does not exist.")
        experiments, problems = classify(container, graph.modules, shared, loaders)
        output.verbose_print(verbose, f"Experiments found under {container}: "
                                      f"{', '.join(experiments) or 'none'}")
        if not experiments:
            problems.append(f"{container} holds no experiment (no package with an "
                            f"{EXPERIMENT_MODULE}.py)")
        rules = self.rules(experiments, shared, free) if experiments else []
        broken, warnings = [], []
        for title, rule in rules:
            result = rule.check(graph, verbose)
            warnings += result.warnings
            if not result.kept:
                broken.append((title, rule, result))
        return ContractCheck(kept=not (problems or broken), warnings=warnings,
                             metadata={"problems": problems, "broken": broken})

    def rules(self, experiments: list[str], shared: list[str], free: list[str]) -> list:
        """(title, import-linter contract) for each rule that has modules to check."""
        def contract(kind, **options):
            return kind(self.name, self.session_options, options)

        rules = [("No experiment imports another",
                  contract(IndependenceContract, modules=experiments))]
        if shared:
            rules.append(("A shared folder imports no experiment",
                          contract(ForbiddenContract, source_modules=shared,
                                   forbidden_modules=experiments)))
        if free:
            rules.append((f"{', '.join(free)} import no experiment and no shared folder",
                          contract(ForbiddenContract, source_modules=free,
                                   forbidden_modules=experiments + shared)))
        return rules

    def render_broken_contract(self, check: ContractCheck) -> None:
        for problem in check.metadata["problems"]:
            output.print_error(problem)
            output.new_line()
        for title, rule, result in check.metadata["broken"]:
            output.print_heading(title, output.HEADING_LEVEL_THREE)
            rule.render_broken_contract(result)
