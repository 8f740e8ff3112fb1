# Entry points. Every target that touches the network needs root: `sudo make run-fattree`.
# An experiment's target runs a bundled scenario (testbed/scenarios/, linked as scenarios/),
# the same file `testbed <experiment>` starts from; tests/unit/test_entry_points.py checks both.
VENV ?= .venv
TESTBED := $(VENV)/bin/testbed
PYTEST := $(VENV)/bin/python -m pytest
# The eBPF programs; testbed/plan/ecn_plan.py (BPF_CFLAGS, compile_command) uses the same
# flags. Debian keeps asm/types.h under the multiarch directory, which -target bpf misses.
BPF_BUILD ?= build/bpf
BPF_CFLAGS := -O2 -g -Wall -target bpf -I/usr/include/$(shell uname -m)-linux-gnu

.DEFAULT_GOAL := help
.PHONY: help install bpf chaos run-fattree run-spineleaf run-clos run-dragonfly run-nvswitch run-rail run-anycast test test-unit lint-imports test-integration vm-test bench dctcp incast pfc-demo lab doctor clean topo

help:  ## list the targets
	@echo "AI data-center fabric testbed"
	@echo
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

install:  ## install packages and the venv (idempotent; root to install, then any user; TESTBED_EXTRAS=torch adds torch)
	@bash scripts/install.sh

bpf: $(BPF_BUILD)/ecn_marker.o $(BPF_BUILD)/loss.o  ## compile-check the eBPF programs (clang; no root; runs build their own copy in the cache dir)

$(BPF_BUILD)/%.o: testbed/apply/bpf/%.c
	@mkdir -p $(@D)
	clang $(BPF_CFLAGS) -c $< -o $@

run-fattree: install  ## ring AllReduce on a k=4 fat-tree with ECMP (root)
	$(TESTBED) run scenarios/fattree-allreduce.yaml

run-spineleaf: install  ## ring AllReduce on a 4-leaf, 2-spine fabric (root)
	$(TESTBED) run scenarios/spineleaf-allreduce.yaml

run-clos: install  ## ring AllReduce on a 5-stage Clos (root)
	$(TESTBED) run scenarios/clos-allreduce.yaml

run-dragonfly: install  ## ring AllReduce on a small balanced dragonfly (root)
	$(TESTBED) run scenarios/dragonfly-allreduce.yaml

run-nvswitch: install  ## ring AllReduce over NVSwitch-like nodes on a spine-leaf (root)
	$(TESTBED) run scenarios/nvswitch-allreduce.yaml

run-rail: install  ## ring AllReduce over rail-optimised NVSwitch-like nodes (root)
	$(TESTBED) run scenarios/rail-allreduce.yaml

run-anycast: install  ## anycast failover on a k=4 fat-tree: cut the nearest replica's link, measure the move (root)
	$(TESTBED) run scenarios/fattree-anycast-failover.yaml

test: install  ## unit tests, then root integration tests on real namespaces
	$(PYTEST) tests/unit -q
	$(PYTEST) tests/integration -q

test-unit: install  ## unit tests only (no root needed after install)
	$(PYTEST) tests/unit -q

lint-imports:  ## the layering: import-linter's contracts (setup.cfg) on the installed layout
	$(VENV)/bin/python scripts/lint_imports.py

test-integration: install  ## integration tests only (root)
	$(PYTEST) tests/integration -q

vm-test:  ## the stock-kernel suite in a booted Debian 12 guest under qemu (root; docs/vm-test.md; ARGS="--timeout-min 30 ...")
	python3 scripts/vm/vmtest.py run $(ARGS)

bench: install  ## forwarding capacity and fabric bring-up vs plain Mininet (root)
	$(TESTBED) bench

incast: install  ## incast on the k=4 fat-tree, drop-tail vs ECN vs PFC, fan-in 1,3,7,15 (root; ARGS="--set params.modes=[ecn] ...")
	$(TESTBED) run scenarios/incast.yaml $(ARGS)

pfc-demo: install  ## PFC's costs: head-of-line blocking, congestion spreading, ECN cutting pauses (root)
	$(TESTBED) run scenarios/pfc-demo.yaml $(ARGS)

dctcp: install  ## DCTCP micro-benchmark: 2 and 8 senders, drop-tail vs ECN at K (root)
	$(TESTBED) run scenarios/dctcp.yaml $(ARGS)

lab: install  ## every teaching lab, then results/labs/index.html (root; LAB_SHORT=1 runs the shortened forms, as CI does)
	$(TESTBED) lab run all $(if $(filter 1,$(LAB_SHORT)),--short)

chaos: install  ## faults on purpose, every outcome checked (root; ARGS="--profile ci --seed N"; docs/reliability-faults.md)
	$(TESTBED) chaos $(ARGS)

doctor: install  ## what this machine can do, and the path each feature takes
	$(TESTBED) doctor

topo: install  ## describe a topology: make topo ARGS="fattree k=4"
	$(TESTBED) topo $(ARGS)

clean:  ## remove what an interrupted run left (namespaces, veths, bridges, processes)
	@if [ -x $(TESTBED) ]; then $(TESTBED) clean; else echo "nothing installed yet"; fi
