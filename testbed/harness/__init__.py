"""One harness for every experiment: the run lifecycle (lock, run ids, signals, results folder, provenance), scenarios, the experiment protocol and registry, verdicts and reports."""
