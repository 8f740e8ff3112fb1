#!/usr/bin/env bash
# Install everything the testbed needs, idempotently: distribution packages (Open vSwitch,
# Mininet, traffic and capture tools, the eBPF toolchain), then a venv made from the system
# Python (the one Debian's and Ubuntu's Mininet is built for) that also sees system
# site-packages, with the pinned PyPI dependencies and this project installed editable.
# The Makefile, .ci/run and the Vagrant provisioning all call this one script.
# A second run installs nothing and takes a few seconds.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${TESTBED_VENV:-$ROOT/.venv}
SYSTEM_PYTHON=/usr/bin/python3

APT_PACKAGES=(
  openvswitch-switch mininet iperf3 iputils-ping ethtool iproute2 tcpdump tshark
  clang llvm libbpf-dev python3-venv python3-pip procps fping
)
# bpftool writes and reads the eBPF ECN marker's pinned maps. Debian packages it on its own;
# Ubuntu only per kernel release (linux-tools-<release>), so there it is not installed here.
if grep -qx 'ID=debian' /etc/os-release 2>/dev/null; then
  APT_PACKAGES+=(bpftool)
fi

say() { printf '[install] %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
  echo "install.sh: run as root (sudo make install): it installs distribution packages" >&2
  exit 1
fi

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$pkg")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing packages: ${missing[*]}"
  # tshark asks whether non-root users may capture; answer it so the install never blocks.
  echo 'wireshark-common wireshark-common/install-setuid boolean false' | debconf-set-selections
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  say "distribution packages present"
fi

if [ ! -x "$VENV/bin/python" ]; then
  say "creating venv $VENV from $SYSTEM_PYTHON (with system site-packages, for Mininet)"
  "$SYSTEM_PYTHON" -m venv --system-site-packages "$VENV"
fi

# Reinstall only when the pins or the package metadata changed.
stamp="$VENV/.testbed-install.sha256"
want=$(cat "$ROOT/requirements.txt" "$ROOT/setup.cfg" "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  say "installing pinned Python dependencies"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r "$ROOT/requirements.txt"
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-build-isolation --no-deps -e "$ROOT"
  echo "$want" > "$stamp"
else
  say "venv up to date"
fi

"$VENV/bin/python" -c 'import mininet.net, os_ken, scapy, pyroute2, networkx, numpy, matplotlib, yaml' \
  || { echo "install.sh: the venv cannot import its dependencies" >&2; exit 1; }
say "ready: $VENV/bin/testbed"
