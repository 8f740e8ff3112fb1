"""What pfc-demo claims, judged from its three runs (pure: each condition's results in,
testbed.model.verdict checks out), each with its named tolerance:

1. head-of-line blocking: beside the incast, the victim under PFC gets at most
   ``1 - VICTIM_SLOWED_BY`` of its rate in the lossy run, where nothing pauses it;
2. congestion spreading: under PFC, ports ``SPREAD_MIN_HOPS`` or more hops from the
   congested switch are paused ("more than one hop");
3. ECN cuts the pause time: port-seconds paused under pfc+ecn at most ``1 - PAUSE_CUT_BY``
   of PFC alone's (and PFC alone must have paused, or nothing is shown);
4. the lossless class drops nothing where PFC is on.

A claim whose runs were not made is left out.
"""
from __future__ import annotations

from testbed.model.verdict import Check, at_least, at_most

LOSSY, PFC, PFC_ECN = "lossy", "pfc", "pfc+ecn"
CONDITIONS = (LOSSY, PFC, PFC_ECN)
# Named tolerances.
VICTIM_SLOWED_BY = 0.5    # HOL blocking shown: the victim under PFC at most half its lossy rate
SPREAD_MIN_HOPS = 2       # "more than one hop": ports paused two or more hops away
PAUSE_CUT_BY = 0.5        # ECN cuts the pause time: at most half of PFC alone's


def head_of_line_check(lossy: dict, pfc: dict) -> Check:
    bound = round(lossy["victim_mbit"] * (1 - VICTIM_SLOWED_BY), 6)
    shown = pfc["victim_mbit"] <= bound
    return at_most(
        "head-of-line blocking: the victim's rate under PFC", round(pfc["victim_mbit"], 6),
        bound, "Mbit/s",
        f"the victim, which never uses the congested port, got {pfc['victim_mbit']:.2f} Mbit/s "
        f"under PFC against {lossy['victim_mbit']:.2f} in the lossy run "
        f"({'' if shown else 'NOT '}at most {1 - VICTIM_SLOWED_BY:.0%} of it); alone it got "
        f"{pfc['victim_alone_mbit']:.2f}", PFC)


def spreading_check(pfc: dict) -> Check:
    hops = pfc["max_paused_hops"]
    name = "congestion spreading: the farthest paused port"
    if hops is None:
        return at_least(name, 0, SPREAD_MIN_HOPS, "hops from the congested switch",
                        "under PFC no port was paused; NOT beyond one hop", PFC)
    where = ", ".join(f"{len(r['paused_ports'])} at {r['hops']} hops"
                      for r in pfc["by_hop"] if r["paused_ports"])
    reach = "more than one hop" if hops >= SPREAD_MIN_HOPS else "NOT beyond one hop"
    return at_least(name, hops, SPREAD_MIN_HOPS, "hops from the congested switch",
                    f"under PFC ports were paused up to {hops} hops from the congested switch "
                    f"({where}); {reach}", PFC)


def pause_cut_check(pfc: dict, both: dict) -> Check:
    name = "ECN cuts the pause time"
    if pfc["paused_s"] == 0:
        return Check(name, both["paused_s"], "< PFC alone's", None, "port-s", False,
                     "NOT shown: PFC alone paused nothing", PFC_ECN)
    bound = round(pfc["paused_s"] * (1 - PAUSE_CUT_BY), 6)
    cut = both["paused_s"] <= bound
    return at_most(name, both["paused_s"], bound, "port-s",
                   f"{both['paused_s']:.2f} port-s paused with ECN against {pfc['paused_s']:.2f} "
                   f"with PFC alone ({'' if cut else 'NOT '}at most {1 - PAUSE_CUT_BY:.0%}); "
                   f"{both['ce_marks']} CE marks", PFC_ECN)


def lossless_check(condition: str, r: dict) -> Check:
    return at_most("lossless-class drops", r["lossless_drops"], 0, "packets",
                   f"{condition}: {r['lossless_drops']} drops in the lossless class; "
                   f"{r['pause_storms']} pause storms (a port paused over the threshold in one "
                   f"go), longest pause {r['longest_pause_s']:.3f} s", condition)


def demo_checks(results: dict[str, dict]) -> list[Check]:
    """The demonstrations the runs made allow, and the lossless promise of every PFC run."""
    lossy, pfc, both = (results.get(c) for c in CONDITIONS)
    checks = []
    if lossy and pfc:
        checks.append(head_of_line_check(lossy, pfc))
    if pfc:
        checks.append(spreading_check(pfc))
    if pfc and both:
        checks.append(pause_cut_check(pfc, both))
    checks += [lossless_check(c, results[c]) for c in (PFC, PFC_ECN) if c in results]
    return checks
