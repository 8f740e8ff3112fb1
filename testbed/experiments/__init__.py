"""One folder per experiment, each a config, a run on fabrics, its checks and plots, listed in
testbed.experiments.registry (which loads scenarios against them) and indexed in the docs by
testbed.experiments.pages (from each folder's README); roce_common/ holds what the RoCE
experiments share and is not an experiment."""
