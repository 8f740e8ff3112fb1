"""The run lifecycle every experiment shares: run ids, the machine's run lock and ledger
(anything an earlier killed run left is swept first, and everything this run creates is swept
at the end), signals that end a run through the same clean-up path as Ctrl-C, and
``run_scenario``: one scenario end to end into one results layout.

    results/<run-id>/
      config.json        the scenario as validated, with every default filled in
      summary.json       schema_version, status, provenance, chosen paths, each setup's
                         results, the verdict (checks, emulator trust), plots, report
      report.md, report.html   the verdict and plots, for people
      plots/             PNG figures
      controller.log, ...      raw files of the fabric (setups/<name>/ when there are several)
"""
from __future__ import annotations

import datetime
import errno
import json
import os
import signal
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from testbed.apply.controller import write_anycast
from testbed.apply.failures import FailureSchedule
from testbed.apply.network import FabricNetwork, check_root
from testbed.apply.state import BRING_UP, TEAR_DOWN, WORKLOAD, Ledger, RunLock, clean
from testbed.apply.watchdog import Watchdog
from testbed.capabilities import MININET_MODULE, import_problem
from testbed.errors import ConfigError, TestbedError, UsageError
from testbed.harness.experiment import SetupRun
from testbed.harness.fabric_checks import anycast_reachable, check_groups
from testbed.harness.plans import impairment_plan
from testbed.harness.plots import (
    caption_for,
    plot_openflow_utilisation,
    plot_topology,
    plot_weathermap,
)
from testbed.harness.progress import Progress
from testbed.harness.provenance import provenance
from testbed.harness.report import write_report
from testbed.harness.summary_schema import (
    COMPLETE,
    FAILED,
    INTERRUPTED,
    RUN,
    RUNNING,
    SCHEMA_VERSION,
    row_record,
    write_summary,
)
from testbed.measure.openflow import openflow_summary
from testbed.measure.pauses import agent_alive_checks
from testbed.model.records import PORT_STATS_FILE
from testbed.model.topology.base import Fabric
from testbed.model.verdict import Verdict, trust_checks
from testbed.plan.fault_schedule import fault_windows, impaired_links, schedule_events
from testbed.plan.settings import EcnSettings


def new_run_id(name: str) -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{name}-{uuid.uuid4().hex[:4]}"


@contextmanager
def interrupts_as_exceptions():
    """SIGTERM and SIGHUP end a run like Ctrl-C does: through the clean-up path."""
    def raise_interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    old = {s: signal.signal(s, raise_interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


@contextmanager
def shielded():
    """Ignore Ctrl-C while tearing down, so a second Ctrl-C cannot leave half a fabric."""
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def check_can_build() -> None:
    """Refuse, in one line and before the lock is taken or anything is made, a fabric this
    process cannot build: it is not root, or it cannot import Mininet (a wheel installed
    into a venv without the distribution's Mininet)."""
    check_root()
    problem = import_problem(MININET_MODULE)
    if problem is not None:
        raise UsageError(f"Mininet is missing ({problem}): install the distribution's mininet "
                         "package and use a venv made with --system-site-packages "
                         "(scripts/install.sh does both)")


@contextmanager
def machine(run_id: str, log=print):
    """Hold the run lock, sweep what an earlier killed run left, and always sweep on exit."""
    check_can_build()
    with RunLock(run_id):
        stale = Ledger.load()
        if stale is not None:
            removed = clean(stale, log)
            log(f"recovered from interrupted run {stale.run_id}: removed {removed}")
        ledger = Ledger(run_id, os.getpid())
        ledger.save()
        try:
            yield ledger
        finally:
            with shielded():
                clean(ledger, log)


# --- one scenario, end to end --------------------------------------------------------------------

@dataclass
class Outcome:
    """What a run left: its summary (as written to summary.json), folder and verdict."""

    summary: dict
    workdir: Path
    verdict: Verdict

    @property
    def status(self) -> str:
        return self.summary["status"]

    def exit_status(self, accept_failed: bool = False, accept_untrusted: bool = False) -> int:
        """0: complete, every judged check passed and the emulator kept up; 1 otherwise
        (unless accepted)."""
        if self.status != COMPLETE:
            return 1
        if self.verdict.failed and not accept_failed:
            return 1
        if not self.verdict.emulator_trusted and not accept_untrusted:
            return 1
        return 0


def setup_folder(workdir: Path, setups: list, setup) -> Path:
    """Where one setup's raw files go: the run folder itself when it is the only one."""
    return workdir if len(setups) == 1 else workdir / "setups" / setup.name


def run_scenario(resolved, log=print, progress=None) -> Outcome:
    """Run a resolved scenario (testbed.harness.experiment.Resolved): every setup on a fabric
    of its own, under the machine's lock, then the verdict, plots, summary.json and the
    report. A run that fails or is interrupted part-way still writes summary.json (with its
    status and error) and a report of what it measured, then re-raises."""
    check_can_build()
    scenario, experiment = resolved.scenario, resolved.experiment
    progress = progress or Progress(log)
    run_id = new_run_id(scenario.name)
    workdir = Path(scenario.results_dir) / run_id
    summary = start_summary(resolved, run_id, workdir)
    log(f"run {run_id}: {experiment.headline()}")
    log(f"link rate {experiment.rate_mbit:g} Mbit/s: {experiment.rate_decision[1]}")

    def run_setups(results: dict) -> None:
        with interrupts_as_exceptions(), machine(run_id, log) as ledger:
            ledger.set_phase(BRING_UP)
            write_config(workdir, summary)
            for index, setup in enumerate(resolved.setups, 1):
                if len(resolved.setups) > 1:
                    log(f"setup {index}/{len(resolved.setups)} {setup.name}: "
                        f"{setup.description or setup.fabric.kind}")
                results[setup.name] = run_setup(resolved, setup, ledger, workdir, log, progress)

    return recorded(summary, experiment, workdir, log, run_setups)


def start_summary(resolved, run_id: str, workdir: Path) -> dict:
    """summary.json as a run starts: what runs, on what, from where; status ``running``."""
    scenario, experiment = resolved.scenario, resolved.experiment
    return {
        "schema_version": SCHEMA_VERSION, "kind": RUN, "run_id": run_id,
        "experiment": experiment.name,
        "title": experiment.title, "headline": experiment.headline(), "status": RUNNING,
        "error": None, "started_at": _now(), "finished_at": None,
        "provenance": provenance(resolved.platform), "results_dir": str(workdir),
        "scenario": scenario.model_dump(mode="json"),
        "params": experiment.params.model_dump(mode="json"),
        "link_rate_mbit": experiment.rate_mbit, "link_rate_decided_by":
        experiment.rate_decision[1], "mtu_bytes": experiment.mtu_bytes,
        "ecn_path": resolved.ecn_path,
        "setups": {s.name: s.describe() for s in resolved.setups},
        "results": {}, "verdict": None, "plots": [], "report": None,
    }


def write_config(workdir: Path, summary: dict) -> None:
    """The run folder, with config.json: the scenario as validated and the parameters. A
    folder that cannot be written (full, read-only, not ours) is a one-line error, before
    any fabric exists; a run folder made here is removed again when it stays empty."""
    made = not workdir.exists()
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "config.json").write_text(json.dumps(
            {"scenario": summary["scenario"], "params": summary["params"]}, indent=1))
    except OSError as exc:
        if made:
            try:
                (workdir / "config.json").unlink(missing_ok=True)
                workdir.rmdir()
            except OSError:
                pass
        raise results_error(exc, workdir, "config.json") from None


# A write the results folder refused: full, over quota, read-only (any file); not ours to
# write (only a file named inside the folder: these codes have other causes too).
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
PERMISSION_ERRNOS = frozenset({errno.EACCES, errno.EPERM})


def results_error(exc: OSError, workdir: Path, name: str | None = None) -> TestbedError:
    """``cannot write the run's results in results/RUN: No space left on device
    (summary.json)``: a results folder that refused a write, in one line; ``name``: the
    file being written (else the error's own file name, when it has one)."""
    name = name or (Path(os.fsdecode(exc.filename)).name if exc.filename else "")
    return TestbedError(f"cannot write the run's results in {workdir}: "
                        f"{exc.strerror or exc}" + (f" ({name})" if name else ""))


def results_write_error(exc: BaseException, workdir: Path) -> TestbedError | None:
    """The one-line error for ``exc`` when it is the results folder refusing a write (a file
    inside it, full, read-only or not writable; or a file system full or read-only where the
    error names no file), else None."""
    if not isinstance(exc, OSError) or exc.errno not in DISK_ERRNOS | PERMISSION_ERRNOS:
        return None
    if exc.filename is None:
        if exc.errno not in DISK_ERRNOS:
            return None
        return TestbedError(f"a write failed: {exc.strerror or exc}; is the results folder "
                            f"{workdir.parent} full or read-only?")
    where = os.path.abspath(os.fsdecode(exc.filename))
    if not Path(where).is_relative_to(os.path.abspath(workdir.parent)):
        return None
    return results_error(exc, workdir)


def recorded(summary: dict, experiment, workdir: Path, log, work) -> Outcome:
    """Call ``work(results)``, which fills ``results`` (setup name -> what was measured), and
    finish the run however it ends: complete, failed (the error kept) or interrupted, with
    the verdict, plots, summary.json and report of what was measured; errors re-raised."""
    results: dict[str, dict] = {}
    t0 = time.monotonic()
    try:
        work(results)
        summary["status"] = COMPLETE
    except KeyboardInterrupt:
        summary["status"], summary["error"] = INTERRUPTED, "interrupted"
        raise
    except BaseException as exc:
        written = results_write_error(exc, workdir)
        summary["status"] = FAILED
        summary["error"] = (str(written or exc) if isinstance(written or exc, TestbedError)
                            else repr(exc))
        if written is not None:
            raise written from exc
        raise
    finally:
        summary["wall_s"] = round(time.monotonic() - t0, 3)
        outcome = finish(summary, results, experiment, workdir, log)
    return outcome


def run_setup(resolved, setup, ledger, workdir: Path, log, progress) -> dict:
    """One setup: its fabric up and proven reachable (and its select groups and anycast
    service checked), the experiment's measurement under the failure schedule, the
    controller's files summarised, the fabric down."""
    folder = setup_folder(workdir, resolved.setups, setup)
    ledger.set_phase(BRING_UP)
    with bring_up(resolved, setup, ledger, folder, log) as live:
        ledger.set_phase(WORKLOAD)
        try:
            result = measure_setup(resolved, setup, live, folder, log, progress)
        finally:
            ledger.set_phase(TEAR_DOWN)
    return add_fabric_records(result, live.net, folder, setup.fabric)


@dataclass
class LiveSetup:
    """A setup's fabric, up and proven ready (``bring_up``): the network, what proving it
    found, and the ECN settings its queues were given (None without a queue section)."""

    net: object  # testbed.apply.network.FabricNetwork
    bring_up: dict
    ecn: object = None  # testbed.plan.settings.EcnSettings
    impairments: object = None  # testbed.harness.plans.ImpairmentPlan


@contextmanager
def bring_up(resolved, setup, ledger, folder: Path, log):
    """A setup's fabric up in ``folder`` (its raw files) and proven ready (``prove_ready``),
    as a LiveSetup for the block; down when the block ends, however it ends. The run's lock
    and ledger (``machine``) are the caller's."""
    scenario = resolved.scenario
    folder.mkdir(parents=True, exist_ok=True)
    if setup.anycast is not None:
        write_anycast(folder, setup.anycast)
    datapath = "kernel" if resolved.platform.paths.ovs_datapath == "kernel" else "user"
    fabric = setup.fabric
    log(f"{setup.name}: {fabric.label()}, {len(fabric.hosts)} hosts, "
        f"{len(fabric.switches)} switches, {len(fabric.links)} links, MTU "
        f"{fabric.mtu_bytes}, {setup.routing} routing, OVS {datapath} datapath"
        + (" passing offloaded packets" if resolved.platform.paths.ovs_offload ==
           "userspace-tso" else ""))
    ecn = None
    if setup.queue is not None:
        sample_ms = scenario.queue.sample_ms if scenario.queue is not None else 0.0
        ecn = EcnSettings(setup.queue, (setup.queue_record or {}).get("ecn"),
                          resolved.ecn_path, sample_ms)
    impairments = impairment_plan(scenario.impairments, fabric, resolved.platform,
                                  impaired_links(failure_events(resolved, setup)))
    if impairments.path is not None:
        log(f"{setup.name}: impairments by {impairments.path}")
    tso = resolved.platform.paths.ovs_offload == "userspace-tso"
    with FabricNetwork(fabric, folder, ledger, datapath=datapath, routing=setup.routing,
                       log=log, queue=setup.queue, ecn_path=resolved.ecn_path,
                       host_sysctls=setup.host_sysctls(), impairments=impairments.netem,
                       losses=impairments.losses, userspace_tso=tso,
                       switchd_shards=switchd_shards(), pin_cpus=cpu_pinning(),
                       min_host_cpus=resolved.experiment.min_host_cpus) as net:
        t = net.timings
        log(f"{setup.name}: {describe_switchd(net)}")
        log(f"{setup.name}: fabric up: built in {t.build_s:.1f} s; all "
            f"{len(fabric.switches)} switches programmed by the controller "
            f"{t.programmed_s:.1f} s later")
        yield LiveSetup(net, prove_ready(net, setup, log), ecn, impairments)


SWITCHD_SHARDS_ENV = "TESTBED_SWITCHD_SHARDS"


def switchd_shards() -> int | None:
    """ovs-vswitchd processes asked for in TESTBED_SWITCHD_SHARDS, or None (the machine's
    choice, testbed.plan.shards.shard_count); a one-line error for anything but a count."""
    value = os.environ.get(SWITCHD_SHARDS_ENV)
    if value is None or value == "":
        return None
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(SWITCHD_SHARDS_ENV, "expected a whole number of ovs-vswitchd "
                          f"processes, at least 1, not {value!r}")
    return int(value)


CPU_PINNING_ENV = "TESTBED_CPU_PINNING"


def cpu_pinning() -> bool:
    """Whether forwarding and hosts get CPUs of their own (testbed.plan.shards.cpu_layout):
    yes unless TESTBED_CPU_PINNING=off; a one-line error for anything but on or off."""
    value = os.environ.get(CPU_PINNING_ENV, "") or "on"
    if value not in ("on", "off"):
        raise ConfigError(CPU_PINNING_ENV, f"expected on or off, not {value!r}")
    return value == "on"


def describe_switchd(net) -> str:
    """One log line: how many ovs-vswitchd forward, where they run, with which allocator."""
    d = net.switchd.describe()
    if d["datapath_type"] == "system":
        return "switches in the kernel datapath (the machine's OVS)"
    if d["pinned_cpus"]:
        where = (f"pinned to CPU {', '.join(map(str, d['pinned_cpus']))}, hosts and their "
                 f"receive processing on CPU {', '.join(map(str, net.cpu_layout.host_cpus))}")
    elif not net.pin_cpus:
        where = f"not pinned ({CPU_PINNING_ENV}=off)"
    elif net.min_host_cpus > 1:
        where = (f"not pinned (the experiment's hosts keep at least {net.min_host_cpus} "
                 "CPUs, and pinning would leave them fewer)")
    else:
        where = "not pinned (as many processes as CPUs or more)"
    return (f"{d['processes']} ovs-vswitchd ({d['datapath_type']} datapath, "
            f"{'/'.join(map(str, d['bridges_per_process']))} bridges), {where}, "
            f"allocator {d['allocator']}")


def measure_setup(resolved, setup, live: LiveSetup, folder: Path, log, progress) -> dict:
    """The experiment's measurement on a live setup, under the scenario's failure schedule,
    with the fabric's vital daemons watched (testbed.apply.watchdog: one that dies ends the
    workload and is the run's error); raw files go to ``folder``. Returns the setup's results
    (with its ``dir`` and ``bring_up``, and the ``failures`` applied and their
    ``fault_windows`` when there is a schedule)."""
    events = failure_events(resolved, setup)
    result: dict = {"dir": str(folder), "bring_up": dict(live.bring_up)}
    run = SetupRun(live.net, setup, folder, log, progress, live.ecn)
    with Watchdog(live.net, log) as watchdog, \
            FailureSchedule(live.net, events, log) as schedule:
        try:
            result.update(resolved.experiment.measure(run))
        except Exception as exc:
            died = watchdog.died_now()
            if died:  # the cause, not what it broke
                raise TestbedError(died) from exc
            raise
        died = watchdog.died_now()
        if died:
            raise TestbedError(died)
    if events:
        result["failures"] = schedule.applied
        result["fault_windows"] = fault_windows(schedule.applied)
    if live.net.lossless:  # judged by testbed.measure.pauses.agent_alive_checks
        result.setdefault("pause_agent_running", live.net.pause_agent_running())
    if live.impairments is not None and live.impairments.path is not None:
        result["impairments"] = impairment_record(live.impairments, live.net)
    return result


def failure_events(resolved, setup) -> list:
    """The scenario's failure schedule on one setup's fabric, as timed events (the same for
    the bring-up, which prepares the links it impairs, and the measurement)."""
    return schedule_events(resolved.scenario.failures, setup.fabric, resolved.scenario.seed)


def impairment_record(plan, net) -> dict:
    """Which path a setup's impairments took (netem or the eBPF loss program), where, and on
    the eBPF path what the program dropped so far."""
    record = plan.record()
    if plan.losses:
        record["loss_counters"] = net.loss_counters()
    return record


def add_fabric_records(result: dict, net, folder: Path, fabric) -> dict:
    """What a setup's results carry beside its measurement: the fabric's bring-up timings
    and the controller's files in ``folder`` summarised over the measured window."""
    result["bring_up"]["timings_s"] = asdict(net.timings)
    result["bring_up"]["switchd"] = {**net.switchd.describe(),
                                     "host_cpus": list(net.cpu_layout.host_cpus),
                                     "cpu_pinning": net.pin_cpus,
                                     "min_host_cpus": net.min_host_cpus}
    result["openflow"] = openflow_summary(folder, fabric, result.get("window_monotonic_s"))
    return result


def prove_ready(net, setup, log) -> dict:
    """Every ordered host pair reachable, OVS holding the select groups the controller
    computed, and every host reaching the anycast service where there is one."""
    t0 = time.monotonic()
    sent, received = net.ping_all()
    n = len(setup.fabric.hosts)
    log(f"{setup.name}: reachability: {received}/{sent} probes answered, covering all "
        f"{n * (n - 1)} ordered host pairs ({time.monotonic() - t0:.1f} s)")
    if received != sent:
        raise TestbedError(f"{setup.name}: only {received}/{sent} reachability probes were "
                           f"answered; see {net.workdir}/controller.log")
    ready = {"probes": sent, "answered": received, "ordered_pairs": n * (n - 1),
             "select_groups": check_groups(net, setup)}
    if setup.anycast is not None:
        ready["anycast"] = anycast_reachable(net, setup, log)
    return ready


def finish(summary: dict, results: dict, experiment, workdir: Path, log) -> Outcome:
    """The verdict, plots, summary.json and the report, for a run that ended in any way; the
    run folder is handed to the user who ran sudo. A results folder that refuses the writes
    fails a complete run in one line; a run that failed already keeps its own error."""
    summary["finished_at"] = _now()
    summary["results"] = results
    verdict = Verdict()
    if results:
        try:
            verdict.checks = experiment.checks(results)
            verdict.trust = (trust_checks((name, r["fidelity"]) for name, r in results.items()
                                          if r.get("fidelity"))
                             + agent_alive_checks(results) + experiment.trust(results))
        except Exception as exc:  # a partial run may lack what a check needs
            if summary["status"] == COMPLETE:
                raise
            verdict.statements.append(f"checks could not be judged on a partial run: {exc!r}")
        verdict.statements += [c.statement for c in verdict.checks if c.statement]
        try:
            summary["rows"] = [row_record(row) for row in experiment.rows(results)]
        except Exception as exc:
            if summary["status"] == COMPLETE:
                raise
            log(f"the partial run's summary rows failed: {exc!r}")
    summary["verdict"] = verdict.to_dict()
    if not workdir.exists():
        return Outcome(summary, workdir, verdict)
    try:
        write_results(summary, results, experiment, workdir, log)
    except OSError as exc:  # the results folder is full or went read-only
        error = results_error(exc, workdir)
        if summary["status"] == COMPLETE:
            summary["status"], summary["error"] = FAILED, str(error)
            raise error from None
        log(str(error))  # the run's own error is the one it ends with
        return Outcome(summary, workdir, verdict)
    give_to_invoking_user(workdir)
    if summary["status"] != COMPLETE:
        log(f"the run {summary['status']}; what it measured is in {workdir / 'summary.json'}")
    return Outcome(summary, workdir, verdict)


def write_results(summary: dict, results: dict, experiment, workdir: Path, log) -> None:
    """The plots (the experiment's, the weathermaps, the fault timelines), summary.json and
    the report, into the run folder."""
    if results:
        plots = workdir / "plots"
        plots.mkdir(exist_ok=True)
        try:
            paths = topology_figures(results, plots, plot_title(summary))
            paths += experiment.plots(results, plots, plot_title(summary))
            paths += weathermaps(results, plots, plot_title(summary))
            paths += fault_timelines(results, plots, plot_title(summary))
        except OSError:
            raise
        except Exception as exc:
            if summary["status"] == COMPLETE:
                raise
            paths = []
            log(f"plots of the partial run failed: {exc!r}")
        summary["plots"] = plot_records(paths, workdir, experiment.captions)
    write_summary(workdir, summary)
    summary["report"] = [str(p.relative_to(workdir)) for p in write_report(summary, workdir)]
    write_summary(workdir, summary)


def plot_records(paths: list[Path], workdir: Path, captions: dict[str, str]) -> list[dict]:
    """summary.json's ``plots``: each figure relative to the run folder, with its caption."""
    return [{"path": str(p.relative_to(workdir)), "caption": caption_for(p, captions)}
            for p in paths]


def setup_fabrics(results: dict[str, dict]) -> dict:
    """Each setup's fabric as the network and the controller were built from it
    (fabric.json in its folder), for the setups that got that far."""
    fabrics = {}
    for name, result in results.items():
        fabric_json = Path(result.get("dir", "")) / "fabric.json"
        if result.get("dir") and fabric_json.exists():
            fabrics[name] = Fabric.load_json(fabric_json)
    return fabrics


def topology_figures(results: dict[str, dict], folder: Path, title: str) -> list[Path]:
    """A drawing of each distinct fabric the setups measured on (setups on equal fabrics
    share one), named after the first setup on it when there are several."""
    fabrics = setup_fabrics(results)
    alike: dict[str, list[str]] = {}  # the fabric's description -> setups on it
    for name, fabric in fabrics.items():
        alike.setdefault(json.dumps(fabric.to_dict(), sort_keys=True), []).append(name)
    if len(alike) == 1:
        (names,) = alike.values()
        return [plot_topology(fabrics[names[0]], title, folder / "topology.png")]
    return [plot_topology(fabrics[names[0]], f"{title} | {', '.join(names)}",
                          folder / f"topology-{names[0]}.png") for names in alike.values()]


def weathermaps(results: dict[str, dict], folder: Path, title: str) -> list[Path]:
    """Every setup's topology with its links coloured by the utilisation the switches' own
    port counters measured over the setup's measured window (its whole run when it names
    none)."""
    paths = []
    fabrics = setup_fabrics(results)
    for name, result in results.items():
        counters = (result.get("openflow") or {}).get("port_counters") or {}
        if not counters.get("links") or name not in fabrics:
            continue
        util = {label: v["mean_utilisation"] for label, v in counters["links"].items()}
        if all(value is None for value in util.values()):
            continue  # no poll fell in the window: nothing to colour the links by
        suffix = "" if len(results) == 1 else f"-{name}"
        paths.append(plot_weathermap(fabrics[name], util,
                                     f"{title} | {name}" if suffix else title,
                                     folder / f"weathermap{suffix}.png"))
    return paths


def fault_timelines(results: dict[str, dict], folder: Path, title: str) -> list[Path]:
    """For every setup that ran a failure schedule: its busiest links' utilisation over time
    from the switches' own port counters, each fault's window shaded (testbed.harness.plots
    .plot_openflow_utilisation)."""
    fabrics = setup_fabrics(results)
    paths = []
    for name, result in results.items():
        windows = result.get("fault_windows")
        if not windows or name not in fabrics:
            continue
        suffix = "" if len(results) == 1 else f"-{name}"
        path = plot_openflow_utilisation(
            fabrics[name], Path(result["dir"]) / PORT_STATS_FILE,
            result.get("window_monotonic_s"), f"{title} | {name}" if suffix else title,
            folder / f"faults{suffix}.png", faults=windows)
        if path is not None:
            paths.append(path)
    return paths


def plot_title(summary: dict) -> str:
    """What every plot's title starts with: the run, the topology and the rate."""
    setups = list(summary["setups"].values())
    topology = " / ".join(dict.fromkeys(s["fabric"]["label"] for s in setups))
    return f"{summary['run_id']} | {topology} | {summary['link_rate_mbit']:g} Mbit/s links"


def give_to_invoking_user(workdir: Path) -> None:
    """Under sudo, the run folder (and the results folder, if root owns it) belongs to the
    user who ran sudo (SUDO_UID/SUDO_GID), not to root."""
    uid, gid = os.environ.get("SUDO_UID"), os.environ.get("SUDO_GID")
    if os.geteuid() != 0 or not uid or not gid:
        return
    uid, gid = int(uid), int(gid)
    for path in [workdir, *workdir.rglob("*")]:
        try:
            os.chown(path, uid, gid, follow_symlinks=False)
        except OSError:
            pass
    parent = workdir.parent
    if parent.exists() and parent.stat().st_uid == 0:
        os.chown(parent, uid, gid)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
