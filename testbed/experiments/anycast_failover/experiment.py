"""Anycast failover: how fast a client follows its service to the next-nearest live replica
when the nearest one's link is cut, and back when it returns (testbed.measure.anycast_failover
does the cut and reads the client's answers)."""
from __future__ import annotations

from pydantic import Field

from testbed.controllers.routing.fabric_state import AnycastService
from testbed.errors import ConfigError
from testbed.harness.experiment import Experiment, Params, SetupRun
from testbed.harness.scenario import Problem
from testbed.measure.anycast_failover import AnycastCut, anycast_cut, anycast_cut_and_repair
from testbed.model.verdict import at_most

GOAL_S = 1.0  # the controller's budget to move a client (the failure-handling goal)


class AnycastParams(Params):
    """Who probes, how often and for how long; when (seconds after the probe starts) the near
    replica's link goes down and comes back; the switch-over goal."""

    client: str = Field("p0e1h0", description="the host that probes the anycast service")
    interval_s: float = Field(0.01, gt=0, le=1, description="seconds between probes")
    down_at_s: float = Field(1.5, gt=0, description="when the nearest replica's link goes "
                             "down (seconds after probing starts)")
    up_at_s: float = Field(3.5, gt=0, description="when it comes back")
    duration_s: float = Field(6.0, gt=0, le=600, description="how long the client probes")
    goal_s: float = Field(GOAL_S, gt=0, description="the longest switch-over the check "
                          "allows")


class Anycast(Experiment):
    name = "anycast-failover"
    title = "anycast failover"
    Params = AnycastParams
    defaults_scenario = "fattree-anycast-failover"

    def problems(self):
        p = self.params
        problems = []
        if self.scenario.anycast is None:
            problems.append(Problem(("anycast",), "anycast-failover needs a service: "
                                    "{service_ip: 10.255.0.1, replicas: [host, host]}"))
        if not p.down_at_s < p.up_at_s < p.duration_s:
            problems.append(Problem(("params", "up_at_s"), "needs down_at_s < up_at_s < "
                                    "duration_s"))
        return problems

    def cut(self, fabric) -> AnycastCut:
        p = self.params
        service = AnycastService.from_dict(self.scenario.anycast.model_dump())
        try:
            cut = anycast_cut(fabric, service, p.client, self.scenario.routing)
        except ConfigError as err:
            raise ConfigError("params.client", err.problem) from None
        return AnycastCut(cut.service, cut.client, cut.near, cut.far, cut.interface,
                          interval_s=p.interval_s, down_at_s=p.down_at_s, up_at_s=p.up_at_s,
                          duration_s=p.duration_s)

    def setups(self):
        setup = self.scenario_setup()
        self.cut(setup.fabric)  # refuses a client the service cannot be cut away from
        return [setup]

    def headline(self) -> str:
        a = self.scenario.anycast
        return (f"{self.title}: {self.params.client} probes {a.service_ip} "
                f"(replicas {', '.join(a.replicas)}) at {self.rate_mbit:g} Mbit/s")

    def measure(self, run: SetupRun) -> dict:
        cut = self.cut(run.net.fabric)
        run.log(f"anycast failover: {cut.client} probes {cut.service.service_ip} every "
                f"{cut.interval_s * 1000:g} ms; {cut.near}'s link {cut.interface} goes down at "
                f"{cut.down_at_s:g} s and back at {cut.up_at_s:g} s")
        with run.watch() as watch:
            result = anycast_cut_and_repair(run.net, cut)
        run.log(f"anycast failover: served by {result.far} {result.to_far_s * 1000:.0f} ms "
                f"after the cut ({result.requests_lost} requests lost), back on {result.near} "
                f"{result.back_to_near_s * 1000:.0f} ms after the repair")
        return {"failover": result.to_dict(),
                "fidelity": watch.verdict(bandwidth_bound=False).to_dict()}

    def checks(self, results):
        f = results["fabric"]["failover"]
        goal = self.params.goal_s
        return [
            at_most("switch-over to the far replica", round(f["to_far_s"], 4), goal, "s",
                    f"{f['client']} was served by {f['far']} {f['to_far_s'] * 1000:.0f} ms after "
                    f"{f['near']}'s link went down"),
            at_most("back to the near replica", round(f["back_to_near_s"], 4), goal, "s",
                    f"{f['client']} was served by {f['near']} again "
                    f"{f['back_to_near_s'] * 1000:.0f} ms after the link returned"),
            at_most("outage (requests lost x interval)", round(f["outage_s"], 4), goal, "s",
                    f"{f['requests_lost']} of {f['requests']} requests went unanswered"),
        ]

    def rows(self, results):
        f = results["fabric"]["failover"]
        return [("anycast failover",
                 f"{f['client']} served by {f['far']} {f['to_far_s'] * 1000:.0f} ms after "
                 f"{f['near']}'s link {f['interface']} went down ({f['requests_lost']} requests "
                 f"lost), back on {f['near']} {f['back_to_near_s'] * 1000:.0f} ms after it "
                 f"returned")]
