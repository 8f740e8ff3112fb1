"""One harness for every experiment: the run lifecycle (lock, run ids, signals, results
folder, provenance), the scenario schema, the experiment protocol, the stored calibration,
verdicts and reports. It knows no experiment: testbed.experiments.registry lists them and
loads scenarios against them."""
