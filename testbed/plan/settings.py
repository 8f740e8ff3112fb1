"""What a run asks of its switch queues and of its hosts' TCP, checked and resolved.

A run's config carries an ``ecn`` section and two host fields (scenario YAML or RunConfig):

    ecn: {profile: step, k_bytes: 30000}                     # DCTCP-style step at K
    ecn: {profile: red, kmin_bytes: 5000, kmax_bytes: 200000, pmax: 0.01}
    ecn: {scheme: dctcp}             # K from the DCTCP anchors, scaled to the link rate
    ecn: {scheme: dcqcn, buffer_bytes: 625000, path: ebpf, sample_ms: 10}
    tcp_ecn: true                    # hosts ask for ECN (net.ipv4.tcp_ecn=1)
    tcp_cc: auto                     # dctcp where the kernel has it, else the best fallback

``ecn`` keys: ``profile`` (step or red) with its thresholds, or ``scheme`` (dctcp or dcqcn,
``testbed.plan.scaling``; ``rtt_s`` for dctcp's K > C*RTT/7); ``buffer_bytes`` (every marked
port's byte buffer; default ``testbed.plan.port_queue.default_buffer_bytes`` at the link rate);
``path`` (red-qdisc or ebpf, to take one the machine has instead of its default);
``sample_ms`` (queue-depth sampling interval, 0 for none). Thresholds are validated by the
profiles themselves; errors name the field as ``ecn.<key>``.

``tcp_cc``: ``auto`` takes the congestion control ``testbed.capabilities`` chooses (dctcp,
else cubic or reno with classic ECN) and turns ECN on, since reacting to marks is the point;
a name (dctcp, cubic, reno) is taken as asked or refused where the kernel lacks it, so an
experiment never silently runs a different algorithm. dctcp negotiates ECN by itself.

Pure: the machine enters only as a ``testbed.capabilities.Platform``.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from numbers import Real

from testbed.capabilities import Platform, missing_capabilities
from testbed.errors import ConfigError
from testbed.plan.ecn_plan import check_ecn_path
from testbed.plan.profiles import QueueConfig, RedEcn, StepEcn
from testbed.plan.scaling import SCHEMES, scaled_queue_config

PROFILE_KEYS = {"step": ("k_bytes",), "red": ("kmin_bytes", "kmax_bytes", "pmax")}
SCHEME_KEYS = ("rtt_s",)  # dctcp only
COMMON_KEYS = ("buffer_bytes", "path", "sample_ms")
SECTION_KEYS = ("profile", "scheme", *(k for keys in PROFILE_KEYS.values() for k in keys),
                *SCHEME_KEYS, *COMMON_KEYS)
# mininet-tests/dctcp sampled queue length at 10 ms; 0 turns sampling off.
DEFAULT_SAMPLE_MS = 10.0
MAX_SAMPLE_MS = 10_000.0

TCP_CC_AUTO = "auto"
TCP_CC_CHOICES = (TCP_CC_AUTO, "dctcp", "cubic", "reno")
CC_CAPABILITY = {"dctcp": "tcp_dctcp", "cubic": "tcp_cubic"}  # reno is always built in
CC_NEEDS_ECN = ("dctcp",)  # the kernel negotiates ECN for these whatever tcp_ecn says
SYSCTL_TCP_ECN = "net.ipv4.tcp_ecn"
SYSCTL_TCP_CC = "net.ipv4.tcp_congestion_control"
TCP_ECN_REQUEST = "1"  # request ECN on outgoing connections, accept it on incoming ones
SYSCTL_KEY = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+$")
SYSCTL_VALUE = re.compile(r"^[A-Za-z0-9_]+$")


# --- the ecn section --------------------------------------------------------------------------


@dataclass(frozen=True)
class EcnSettings:
    """The run's switch queue and how to mark and watch it."""

    queue: QueueConfig
    scaling: dict | None  # testbed.plan.scaling's record for a scheme; None for a profile
    prefer_path: str | None  # None: the machine's own choice
    sample_ms: float


def _in_section(err: ConfigError) -> ConfigError:
    """The same error with its field named inside the ``ecn`` section."""
    field = err.field if err.field == "ecn" or err.field.startswith("ecn.") else f"ecn.{err.field}"
    return ConfigError(field, err.problem)


def _check_keys(section: dict) -> None:
    for key in section:
        if key not in SECTION_KEYS:
            raise ConfigError(f"ecn.{key}", f"unknown key (known: {', '.join(SECTION_KEYS)})")
    if ("profile" in section) == ("scheme" in section):
        raise ConfigError("ecn", "give either profile (step or red, with its thresholds) or "
                                 "scheme (dctcp or dcqcn), not both or neither")


def _not_applicable(section: dict, allowed: tuple[str, ...], what: str) -> None:
    for key in section:
        if key not in allowed + COMMON_KEYS + ("profile", "scheme"):
            raise ConfigError(f"ecn.{key}", f"does not apply to {what}")


def _profile_queue(section: dict, buffer_bytes: int) -> QueueConfig:
    profile = section["profile"]
    if profile not in PROFILE_KEYS:
        raise ConfigError("ecn.profile", f"must be one of {', '.join(PROFILE_KEYS)}, "
                                         f"got {profile!r}")
    needed = PROFILE_KEYS[profile]
    _not_applicable(section, needed, f"profile {profile}")
    for key in needed:
        if key not in section:
            raise ConfigError(f"ecn.{key}", f"is needed by profile {profile}")
    ecn = (StepEcn(section["k_bytes"]) if profile == "step"
           else RedEcn(section["kmin_bytes"], section["kmax_bytes"], section["pmax"]))
    return QueueConfig(buffer_bytes=buffer_bytes, ecn=ecn)


def _scheme_queue(section: dict, rate_mbit: float, mtu_bytes: int,
                  buffer_bytes: int) -> tuple[QueueConfig, dict]:
    scheme = section["scheme"]
    if scheme not in SCHEMES:
        raise ConfigError("ecn.scheme", f"must be one of {', '.join(SCHEMES)}, got {scheme!r}")
    _not_applicable(section, SCHEME_KEYS if scheme == "dctcp" else (), f"scheme {scheme}")
    # PFC stays off: the fabric does not pause yet, so the queue must not claim it does.
    return scaled_queue_config(scheme, rate_mbit, mtu_bytes, buffer_bytes,
                               rtt_s=section.get("rtt_s"), pfc=False)


def _sample_ms(section: dict) -> float:
    value = section.get("sample_ms", DEFAULT_SAMPLE_MS)
    if isinstance(value, bool) or not isinstance(value, Real) or math.isnan(value) \
            or not 0 <= value <= MAX_SAMPLE_MS:
        raise ConfigError("ecn.sample_ms", f"must be a number in [0, {MAX_SAMPLE_MS:g}] "
                                           f"(0: no sampling), got {value!r}")
    return float(value)


def ecn_settings(section, rate_mbit: float, mtu_bytes: int,
                 default_buffer_bytes: int) -> EcnSettings | None:
    """The ``ecn`` section of a run, checked, as the queue every shaped switch port gets;
    None without a section. ``rate_mbit`` scales a scheme's thresholds."""
    if section is None:
        return None
    if not isinstance(section, dict):
        raise ConfigError("ecn", "must be a mapping such as {profile: step, k_bytes: 30000} "
                                 f"or {{scheme: dctcp}}, got {section!r}")
    try:
        _check_keys(section)
        buffer_bytes = section.get("buffer_bytes", default_buffer_bytes)
        path = section.get("path")
        check_ecn_path(path, "ecn.path")
        sample_ms = _sample_ms(section)
        if "profile" in section:
            queue, scaling = _profile_queue(section, buffer_bytes), None
        else:
            queue, scaling = _scheme_queue(section, rate_mbit, mtu_bytes, buffer_bytes)
    except ConfigError as err:
        raise _in_section(err) from None
    return EcnSettings(queue, scaling, path, sample_ms)


def queue_record(queue: QueueConfig) -> dict:
    """A queue as plain data for the run's results; a queue with other rates' queues
    (``QueueConfig.for_rate``) lists every rate's, with its PFC thresholds, under ``rates``."""
    record = {"buffer_bytes": queue.buffer_bytes, "ecn": _ecn_record(queue)}
    if queue.other_rates:
        record["rates"] = [{"rate_mbit": q.rate_mbit, "buffer_bytes": q.buffer_bytes,
                            "ecn": _ecn_record(q),
                            "pfc": None if q.pfc is None else asdict(q.pfc)}
                           for q in queue.by_rate]
    return record


def _ecn_record(queue: QueueConfig) -> dict | None:
    if queue.ecn is None:
        return None
    profile = "step" if isinstance(queue.ecn, StepEcn) else "red"
    return {"profile": profile, **asdict(queue.ecn)}


# --- host TCP ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TcpSettings:
    """The hosts' congestion control and ECN, as decided for this machine."""

    requested: str | None  # tcp_cc as configured
    congestion_control: str | None  # None: the hosts keep the kernel's default
    ecn: bool  # the hosts' connections negotiate ECN
    decided_by: str

    def sysctls(self) -> dict[str, str]:
        """What every host writes in its own namespace (gone with the namespace)."""
        values = {}
        if self.ecn:
            values[SYSCTL_TCP_ECN] = TCP_ECN_REQUEST
        if self.congestion_control is not None:
            values[SYSCTL_TCP_CC] = self.congestion_control
        return values

    def to_dict(self) -> dict:
        return {**asdict(self), "sysctls": self.sysctls()}


def check_tcp(tcp_ecn, tcp_cc) -> None:
    """The run's host TCP fields, without the machine."""
    if not isinstance(tcp_ecn, bool):
        raise ConfigError("tcp_ecn", f"must be true or false, got {tcp_ecn!r}")
    if tcp_cc is not None and tcp_cc not in TCP_CC_CHOICES:
        raise ConfigError("tcp_cc", f"must be one of {', '.join(TCP_CC_CHOICES)}, "
                                    f"got {tcp_cc!r}")


def tcp_settings(tcp_ecn: bool, tcp_cc: str | None, platform: Platform) -> TcpSettings:
    """The hosts' TCP on ``platform``; a congestion control it lacks is a ConfigError."""
    check_tcp(tcp_ecn, tcp_cc)
    if tcp_cc is None:
        return TcpSettings(None, None, tcp_ecn, "kernel default congestion control")
    if tcp_cc == TCP_CC_AUTO:
        chosen = platform.paths.tcp_congestion  # "dctcp", "cubic+ecn" or "reno+ecn"
        return TcpSettings(tcp_cc, chosen.split("+")[0], True,
                           f"best available here: {chosen} (testbed.capabilities)")
    lacking = missing_capabilities(platform.capabilities, [CC_CAPABILITY[tcp_cc]]
                                   if tcp_cc in CC_CAPABILITY else [])
    if lacking:
        raise ConfigError("tcp_cc", f"{tcp_cc} is not available here ({lacking[0].detail}); "
                                    f"tcp_cc: auto takes {platform.paths.tcp_congestion}")
    ecn = tcp_ecn or tcp_cc in CC_NEEDS_ECN
    return TcpSettings(tcp_cc, tcp_cc, ecn, "as configured")


def sysctl_lines(sysctls: dict[str, str]) -> list[str]:
    """Shell lines writing ``{"net.ipv4.tcp_ecn": "1", ...}`` under /proc/sys (in whatever
    namespace runs them). Keys and values must be plain words, so nothing in them reaches
    the shell as syntax."""
    lines = []
    for key, value in sysctls.items():
        if not SYSCTL_KEY.match(key) or not SYSCTL_VALUE.match(value):
            raise ValueError(f"not a plain sysctl setting: {key}={value!r}")
        lines.append(f"echo {value} > /proc/sys/{key.replace('.', '/')}")
    return lines
