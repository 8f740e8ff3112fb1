#!/usr/bin/env bash
# Install everything the testbed needs, idempotently: distribution packages (Open vSwitch,
# Mininet, traffic and capture tools, the eBPF toolchain and bpftool, the verbs user space and
# perftest for softRoCE where the kernel has it), then a venv made from
# the system Python (the one Debian's and Ubuntu's Mininet is built for) that also sees system
# site-packages, with this project installed editable together with the pins for that Python
# (requirements.txt and requirements-<extra>.txt; environment markers choose the pin where
# Python versions differ; the package metadata declares only compatible ranges).
# The Makefile, .ci/run and the Vagrant provisioning all call this one script.
# A second run installs nothing and takes a few seconds. Installing needs root; a user who is
# not root may run it when everything is installed already (as `make doctor`, `make test-unit`
# and `make topo` do): it then checks, changes nothing and says so.
# It prints one line per step (what is installed, how long it took); apt's and pip's own
# output goes to a log file, whose last lines are printed when a step fails.
#
#   sudo bash scripts/install.sh                  # runtime and test dependencies
#   sudo bash scripts/install.sh --extras torch   # also the torch extra (comma-separated list)
#
# Environment: TESTBED_EXTRAS (same as --extras), TESTBED_VENV (default .venv),
# TESTBED_TORCH_INDEX_URL (where the torch extra's pin is fetched from, e.g. PyTorch's CPU index
# https://download.pytorch.org/whl/cpu; unset: pip's configured sources), TESTBED_INSTALL_LOG
# (the log, default /var/log/testbed-install.log; a user who is not root installs nothing and
# keeps no log unless this names one).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${TESTBED_VENV:-$ROOT/.venv}
SYSTEM_PYTHON=/usr/bin/python3
EXTRAS=${TESTBED_EXTRAS:-}
TORCH_INDEX_URL=${TESTBED_TORCH_INDEX_URL:-}
# bpftool and ovs-vswitchd live in sbin, which a non-login root shell may lack.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

while [ $# -gt 0 ]; do
  case "$1" in
    --extras) EXTRAS=${2:?install.sh: --extras needs a list, e.g. --extras torch}; shift 2 ;;
    --extras=*) EXTRAS=${1#--extras=}; shift ;;
    *) echo "install.sh: unknown argument '$1' (usage: install.sh [--extras torch])" >&2; exit 2 ;;
  esac
done

APT_PACKAGES=(
  openvswitch-switch mininet iperf3 iputils-ping ethtool iproute2 tcpdump tshark
  clang llvm libbpf-dev python3-venv python3-pip procps fping kmod
  # softRoCE (traffic/roce/rxe.py, testbed/apply/rxe_probe.py): the verbs library and
  # its rxe provider, perftest's ib_write_bw, and ibv_rc_pingpong and rping for the probe
  rdma-core ibverbs-providers ibverbs-utils rdmacm-utils perftest
)
# What the tests need beyond that (the test extra is always installed): a headless browser
# renders a run's report.html (tests/unit/harness/test_report_browser.py).
TEST_APT_PACKAGES=(chromium)
if [ "$(id -u)" -eq 0 ]; then
  LOG=${TESTBED_INSTALL_LOG:-/var/log/testbed-install.log}
else
  LOG=${TESTBED_INSTALL_LOG:-/dev/null}
fi
LOG_TAIL_LINES=40
STARTED=$SECONDS

say() { printf '[install] %s\n' "$*"; }

# Run one step quietly: a line saying what it does and how long it took; its output goes to
# the log, and when it fails the log's last lines are printed and the script exits with its
# status. Steps are single commands, so `set -e` needs no help inside them.
step() {
  local what=$1 t0=$SECONDS status=0
  shift
  printf '[install] %s ... ' "$what"
  printf '\n=== %s: %s\n' "$what" "$*" >>"$LOG"
  "$@" >>"$LOG" 2>&1 || status=$?
  if [ "$status" -ne 0 ]; then
    printf 'failed (exit %d)\n' "$status"
    echo "install.sh: $what failed; the last $LOG_TAIL_LINES lines of $LOG:" >&2
    tail -n "$LOG_TAIL_LINES" "$LOG" >&2
    exit "$status"
  fi
  printf 'done (%d s)\n' $((SECONDS - t0))
}

# Stop unless root, naming what would have to be installed.
need_root() {
  [ "$(id -u)" -eq 0 ] && return 0
  echo "install.sh: run as root (sudo make install): $*" >&2
  exit 1
}

if [ "$LOG" != /dev/null ]; then
  mkdir -p "$(dirname "$LOG")"
  : >"$LOG"
  say "full output: $LOG"
fi

# The test extra always; each other extra must have its pins file, requirements-<extra>.txt.
extras_list=test
for extra in ${EXTRAS//,/ }; do
  if [ ! -f "$ROOT/requirements-$extra.txt" ]; then
    echo "install.sh: unknown extra '$extra' (no requirements-$extra.txt)" >&2
    exit 2
  fi
  [ "$extra" = test ] || extras_list+=",$extra"
done

# --- distribution packages ----------------------------------------------------------------------

installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep 'install ok installed' >/dev/null
}
# grep reads the whole answer (no -q): quitting at the first match would end apt-cache with
# SIGPIPE while it still writes, which pipefail turns into a failed pipeline.
apt_has_candidate() { LC_ALL=C apt-cache policy "$1" 2>/dev/null | grep '^ *Candidate: [^(]' >/dev/null; }
# A test package is installed where apt offers it as a package of its own: Ubuntu's chromium
# is only a hand-over to a snap, which containers and CI machines cannot run.
is_snap_handover() {
  apt-cache show --no-all-versions "$1" 2>/dev/null | grep -i 'snap' >/dev/null
}
usable_test_package() { apt_has_candidate "$1" && ! is_snap_handover "$1"; }

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  installed "$pkg" || missing+=("$pkg")
done
for pkg in "${TEST_APT_PACKAGES[@]}"; do
  # known to be a snap hand-over: never asked for, and no reason to update apt's lists
  installed "$pkg" || { apt_has_candidate "$pkg" && is_snap_handover "$pkg"; } \
    || missing+=("$pkg")
done

# bpftool reads and writes the eBPF ECN marker's pinned maps. Debian packages it as `bpftool`,
# and so does Ubuntu since it moved the tool out of its per-kernel packages; before that Ubuntu
# ships it only per kernel release, in linux-tools-<release> (linux-tools-common's
# /usr/sbin/bpftool is a wrapper that fails without it). Whichever apt offers is installed.
bpftool_works() { command -v bpftool >/dev/null 2>&1 && bpftool version >/dev/null 2>&1; }

need_bpftool=0
bpftool_works || need_bpftool=1

if [ ${#missing[@]} -gt 0 ] || [ "$need_bpftool" -eq 1 ]; then
  need_root "distribution packages to install: ${missing[*]}${missing[*]:+ }$([ "$need_bpftool" -eq 0 ] || echo bpftool)"
  step "apt-get update" apt-get update
  for pkg in "${TEST_APT_PACKAGES[@]}"; do
    if [[ " ${missing[*]} " == *" $pkg "* ]] && ! usable_test_package "$pkg"; then
      say "no '$pkg' package from apt here: the tests that need it fail until one is installed"
      kept=()
      for other in "${missing[@]}"; do [ "$other" = "$pkg" ] || kept+=("$other"); done
      missing=("${kept[@]}")
    fi
  done
  if [ "$need_bpftool" -eq 1 ]; then
    kernel_tools="linux-tools-$(uname -r)"
    if apt_has_candidate bpftool; then
      bpftool_package=bpftool
    elif apt_has_candidate "$kernel_tools"; then
      bpftool_package=$kernel_tools
    else
      echo "install.sh: no bpftool for kernel $(uname -r): apt offers neither 'bpftool' nor '$kernel_tools'" >&2
      exit 1
    fi
    say "bpftool from package $bpftool_package"
    missing+=("$bpftool_package")
  fi
  # tshark asks whether non-root users may capture; answer it so the install never blocks.
  echo 'wireshark-common wireshark-common/install-setuid boolean false' | debconf-set-selections
  if [ ${#missing[@]} -gt 0 ]; then
    step "installing packages: ${missing[*]}" \
      env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
  fi
  bpftool_works || { echo "install.sh: bpftool still does not run after installing it" >&2; exit 1; }
else
  say "distribution packages present"
fi

# tcmalloc for the userspace datapath's ovs-vswitchd (testbed.apply.ovs.allocator_preload):
# faster forwarding, not needed for correctness, so a machine that cannot get it still
# installs (runs then say "allocator glibc"). Ubuntu 24.04 names the package ...4t64.
if ldconfig -p 2>/dev/null | grep 'libtcmalloc_minimal\.so\.4 ' >/dev/null; then
  :
elif [ "$(id -u)" -ne 0 ]; then
  say "tcmalloc not installed (optional: run as root to add it)"
else
  tcmalloc_package=libtcmalloc-minimal4
  apt_has_candidate libtcmalloc-minimal4t64 && tcmalloc_package=libtcmalloc-minimal4t64
  if DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      "$tcmalloc_package" >>"$LOG" 2>&1; then
    say "tcmalloc from package $tcmalloc_package"
  else
    say "tcmalloc not installed ($tcmalloc_package unavailable): ovs-vswitchd keeps glibc malloc"
  fi
fi

# --- the venv and the pinned Python dependencies ------------------------------------------------

if [ ! -x "$VENV/bin/python" ]; then
  need_root "no venv at $VENV yet"
  step "creating venv $VENV from $SYSTEM_PYTHON (with system site-packages, for Mininet)" \
    "$SYSTEM_PYTHON" -m venv --system-site-packages "$VENV"
fi
python_version=$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

# Reinstall only when the pins or the package metadata (setup.py: which folders install as
# which packages) changed, or an extra is asked for that
# the venv lacks; the stamp holds the pins' hash and the extras installed. Extras installed
# before stay (a plain `make doctor` after TESTBED_EXTRAS=torch reinstalls nothing).
stamp="$VENV/.testbed-install.sha256"
want=$( { cat "$ROOT"/requirements*.txt "$ROOT/pyproject.toml" "$ROOT/setup.cfg" "$ROOT/setup.py"
          echo "torch-index=$TORCH_INDEX_URL"; } | sha256sum | cut -d' ' -f1)
have= have_extras=
[ -f "$stamp" ] && read -r have have_extras < "$stamp" || true
if [ "$have" = "$want" ]; then
  for extra in ${have_extras//,/ }; do
    [[ ",$extras_list," == *",$extra,"* ]] || extras_list+=",$extra"
  done
fi
if [ "$have" != "$want" ] || [ "$have_extras" != "$extras_list" ]; then
  need_root "the venv's pins, package metadata or extras changed"
  pip=("$VENV/bin/pip" install --disable-pip-version-check)
  if [[ ",$extras_list," == *,torch,* ]] && [ -n "$TORCH_INDEX_URL" ]; then
    # Only torch itself from that index; its dependencies resolve from the usual sources below.
    step "installing torch from $TORCH_INDEX_URL" \
      "${pip[@]}" --no-deps --index-url "$TORCH_INDEX_URL" -r "$ROOT/requirements-torch.txt"
  fi
  pins=(-r "$ROOT/requirements.txt")
  for extra in ${extras_list//,/ }; do pins+=(-r "$ROOT/requirements-$extra.txt"); done
  step "installing the testbed and the pins for Python $python_version with extras [$extras_list]" \
    "${pip[@]}" -e "$ROOT[$extras_list]" "${pins[@]}"
  echo "$want $extras_list" > "$stamp"
else
  say "venv up to date (Python $python_version, extras [$extras_list])"
fi

modules=mininet.net,os_ken,scapy,pyroute2,networkx,numpy,matplotlib,yaml,pydantic,rich,pytest,hypothesis
[[ ",$extras_list," == *,torch,* ]] && modules+=",torch"
if ! import_output=$("$VENV/bin/python" -c "import $modules" 2>&1); then
  printf '%s\n' "$import_output" >>"$LOG"
  echo "install.sh: the venv cannot import its dependencies:" >&2
  printf '%s\n' "$import_output" | tail -n "$LOG_TAIL_LINES" >&2
  exit 1
fi
say "ready in $((SECONDS - STARTED)) s: $VENV/bin/testbed$([ "$LOG" = /dev/null ] || echo " (full output: $LOG)")"
