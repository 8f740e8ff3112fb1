"""The link rate this machine emulates faithfully, as ``testbed calibrate`` stored it
(testbed.capacity.calibrate searches for it): read back for runs whose scenario fixes no rate,
which take the calibrated rate times its margin, or, without a calibration for this machine,
say so and take the experiment's safe rate. A calibration holds for one machine only
(``machine_description``)."""
from __future__ import annotations

import json
import os
import platform as pyplatform
from dataclasses import asdict, dataclass
from pathlib import Path

from testbed.apply.ovs import allocator_preload
from testbed.harness.provenance import ovs_version

DEFAULT_CALIBRATION_PATH = Path("/var/lib/testbed/calibration.json")


def machine_description(platform) -> dict:
    """What a calibration holds for: the CPU, its count, the kernel, Open vSwitch, the
    datapath path and ovs-vswitchd's allocator. A run on a machine that differs in any of
    them does not use it."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu_model": model, "cpus": os.cpu_count(), "kernel": platform.kernel_release,
            "ovs_version": ovs_version(), "machine": pyplatform.machine(),
            "ovs_datapath": platform.paths.ovs_datapath,
            "ovs_offload": getattr(platform.paths, "ovs_offload", None),
            "ovs_allocator": ("tcmalloc" if platform.paths.ovs_datapath != "kernel"
                              and allocator_preload() else "glibc")}


@dataclass
class Calibration:
    rate_mbit: float
    margin: float
    machine: dict
    trials: list[dict]
    measured_at: str

    @property
    def run_rate_mbit(self) -> float:
        return round(self.rate_mbit * self.margin, 1)


def calibration_path() -> Path:
    """Where the calibration is kept: TESTBED_CALIBRATION, else /var/lib/testbed."""
    return Path(os.environ.get("TESTBED_CALIBRATION", DEFAULT_CALIBRATION_PATH))


def load_calibration(machine: dict, path: Path | None = None
                     ) -> tuple[Calibration | None, str]:
    """The stored calibration if it is for this machine, and a sentence saying why or why
    not."""
    path = path or calibration_path()
    try:
        data = json.loads(path.read_text())
        calibration = Calibration(**data)
    except FileNotFoundError:
        return None, f"no calibration ({path} missing: run `sudo testbed calibrate`)"
    except (OSError, ValueError, TypeError) as exc:
        return None, f"the calibration in {path} cannot be read ({exc})"
    differs = [k for k, v in machine.items() if calibration.machine.get(k) != v]
    if differs:
        return None, (f"the calibration in {path} is for another machine (differs in "
                      f"{', '.join(differs)}); run `sudo testbed calibrate`")
    return calibration, (f"calibrated: {calibration.rate_mbit:g} Mbit/s held by the k=4 ring on "
                         f"{calibration.measured_at}, times the margin {calibration.margin:g}")


def default_rate(platform, safe_mbit: float, cap_mbit: float | None = None,
                 path: Path | None = None) -> tuple[float, str]:
    """The link rate a run takes when its scenario names none, and why."""
    calibration, why = load_calibration(machine_description(platform), path)
    if calibration is None:
        return safe_mbit, f"the safe default {safe_mbit:g} Mbit/s: {why}"
    rate = calibration.run_rate_mbit
    if cap_mbit is not None and rate > cap_mbit:
        return cap_mbit, f"{why}, capped at {cap_mbit:g} Mbit/s by the experiment"
    return rate, why


def save_calibration(calibration: Calibration, path: Path | None = None) -> Path:
    path = path or calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(calibration), indent=1))
    return path
