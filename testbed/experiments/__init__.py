"""One folder per experiment, each a config, a run on fabrics, its checks and plots, registered in testbed.harness.registry."""
