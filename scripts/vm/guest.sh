#!/usr/bin/env bash
# The stock-kernel suite, inside the guest that scripts/vm/vmtest.py boots: the image's
# testbed-vmtest.service runs this file from the tree disk (mounted at /opt/testbed, where the
# image's editable install points) with the results folder as its argument. Every step is
# timed; everything goes to that folder, whose "status" file the service writes from this
# script's exit status (pytest's: 0 passed, 1 a test failed; 3 a step before it failed; 124
# the suite ran out of its budget). There is no network: nothing here may need one.
#
#   bash scripts/vm/guest.sh /mnt/results/out
set -uo pipefail

OUT=${1:?usage: guest.sh RESULTS_FOLDER}
TREE=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$TREE"
# This run's settings, written by the host (scripts/vm/vmtest.py): TESTBED_VM_RUN_ID,
# TESTBED_VM_SUITE_BUDGET_S, TESTBED_VM_PYTEST_ARGS, TESTBED_VENV and TESTBED_EXTRAS.
# shellcheck source=/dev/null
. "$TREE/.vmtest-run.env"
export TESTBED_VENV TESTBED_EXTRAS
export TESTBED_IN_VM=1 PIP_NO_INDEX=1 PYTHONDONTWRITEBYTECODE=1
export PATH="$TESTBED_VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PYTHON="$TESTBED_VENV/bin/python"

say() { printf '[vm-guest] %s\n' "$*"; }

# step NAME COMMAND...: run it with its output in $OUT/NAME.log and on the console's log,
# say how long it took, return its status.
step() {
  local name=$1 start rc
  shift
  start=$(date +%s)
  say "$name ..."
  "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  say "$name: exit $rc after $(( $(date +%s) - start )) s"
  return $rc
}

say "run $TESTBED_VM_RUN_ID: kernel $(uname -r), up $(cut -d' ' -f1 /proc/uptime) s," \
    "$(nproc) CPUs, suite budget $TESTBED_VM_SUITE_BUDGET_S s"

# The image ran install.sh once; here it must find everything current without a network
# (PIP_NO_INDEX: a pin that changed would fail at once instead of waiting for one).
if ! step install bash scripts/install.sh; then
  tail -n 20 "$OUT/install.log"
  say "install.sh found the image out of date with this tree; rebuild it (vmtest.py --rebuild)"
  exit 3
fi
step doctor testbed doctor --no-probe
cat "$OUT/doctor.log"

# The suite: this folder's tests, then the integration tests marked for the stock kernel.
# timeout ends it (status 124) while the host's own timeout still has room for the results.
# The host wrote them shell-quoted (Python's shlex.join): eval splits them as a shell would.
eval "extra_args=(${TESTBED_VM_PYTEST_ARGS:-})"
start=$(date +%s)
say "pytest: tests/vm, and tests/integration marked stock_kernel"
timeout --kill-after=60 "$TESTBED_VM_SUITE_BUDGET_S" \
  "$PYTHON" -m pytest tests/vm tests/integration -m stock_kernel -v -rA --durations=0 \
    -p no:cacheprovider --basetemp="$OUT/pytest-tmp" --junitxml="$OUT/junit.xml" \
    "${extra_args[@]}" 2>&1 | tee "$OUT/pytest.log"
status=${PIPESTATUS[0]}
say "pytest: exit $status after $(( $(date +%s) - start )) s"
[ "$status" -eq 124 ] && say "the suite ran out of its $TESTBED_VM_SUITE_BUDGET_S s budget"

# What the machine looked like afterwards, for reading the results.
{
  echo "# uname -a"; uname -a
  echo "# lsmod"; lsmod
  echo "# rdma system show"; rdma system show 2>&1
  echo "# ovs-vsctl show"; ovs-vsctl --timeout=5 show 2>&1
  echo "# ip -br link"; ip -br link
  echo "# ip netns list"; ip netns list
} > "$OUT/machine.txt" 2>&1
journalctl -b --no-pager > "$OUT/journal.txt" 2>&1
dmesg > "$OUT/dmesg.txt" 2>&1
exit "$status"
