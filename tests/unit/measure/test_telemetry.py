"""Where each link direction's bytes are counted, and rates and means over a time window."""
from __future__ import annotations

import pytest

from testbed.measure.telemetry import (
    Direction,
    Sampler,
    Series,
    link_directions,
    window_mean,
    window_rates_mbit,
)
from testbed.model.topology.fattree import fat_tree

RATE_REL_TOL = 1e-9


@pytest.fixture(scope="module")
def fabric():
    return fat_tree(4, host_rate_mbit=10.0, fabric_rate_mbit=40.0)


@pytest.fixture(scope="module")
def directions(fabric):
    return {d.label: d for d in link_directions(fabric)}


def test_two_directions_per_link(fabric, directions):
    assert len(directions) == 2 * len(fabric.links)
    for link in fabric.links:
        assert f"{link.a}->{link.b}" in directions
        assert f"{link.b}->{link.a}" in directions


def test_host_sending_is_counted_as_rx_on_the_switch_port(directions):
    d = directions["p0e0h1->p0e0"]
    assert d == Direction("p0e0h1", "p0e0", 10.0, "/sys/class/net/p0e0-eth2/statistics/rx_bytes")


def test_switch_sending_to_a_host_is_counted_as_tx_on_its_port(directions):
    d = directions["p0e0->p0e0h1"]
    assert d == Direction("p0e0", "p0e0h1", 10.0, "/sys/class/net/p0e0-eth2/statistics/tx_bytes")


def test_switch_to_switch_uses_the_senders_tx(directions):
    up = directions["p1e1->p1a0"]
    down = directions["p1a0->p1e1"]
    assert up.counter_path == "/sys/class/net/p1e1-eth3/statistics/tx_bytes"
    assert down.counter_path == "/sys/class/net/p1a0-eth2/statistics/tx_bytes"
    assert up.rate_mbit == down.rate_mbit == 40.0
    core = directions["c3->p2a1"]
    assert core.counter_path == "/sys/class/net/c3-eth3/statistics/tx_bytes"


def test_no_counter_is_read_inside_a_host(fabric, directions):
    hosts = {h.name for h in fabric.hosts}
    for d in directions.values():
        intf = d.counter_path.split("/")[4]
        assert intf.rsplit("-eth", 1)[0] not in hosts, d
        assert d.counter_path.endswith("/tx_bytes") == (d.src not in hosts)


def test_label():
    assert Direction("a", "b", 1.0, "/x").label == "a->b"


# --- windows -----------------------------------------------------------------------------------


@pytest.fixture
def series():
    # 1 Mbit/s = 125000 bytes/s on a->b; b->a idle then 2 Mbit/s from t=2
    return Series(
        t_s=[0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0],
        link_bytes={"a->b": [0, 62_500, 125_000, 187_500, 250_000, 312_500, 375_000],
                    "b->a": [0, 0, 0, 0, 0, 125_000, 250_000]},
        cpu_busy_fraction=[0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 0.9],
        vswitchd_cores=[0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
    )


def test_window_rates_over_the_whole_series(series):
    rates = window_rates_mbit(series, 0.0, 3.0)
    assert rates["a->b"] == pytest.approx(1.0, rel=RATE_REL_TOL)
    assert rates["b->a"] == pytest.approx(250_000 * 8 / 3.0 / 1e6, rel=RATE_REL_TOL)


def test_window_rates_interpolate_the_counters_at_the_window_ends(series):
    # [1.9, 3.2] is clamped to the last sample, 3.0. a->b at 1.9: 187500 + 62500 * 0.4 / 0.5
    # = 237500; at 3.0: 375000: 137500 B in 1.1 s = 1 Mbit/s. b->a: 0 at 1.9, 250000 at 3.0.
    rates = window_rates_mbit(series, 1.9, 3.2)
    assert rates["a->b"] == pytest.approx(1.0, rel=RATE_REL_TOL)
    assert rates["b->a"] == pytest.approx(250_000 * 8 / 1.1 / 1e6, rel=RATE_REL_TOL)
    assert window_rates_mbit(series, 2.5, 3.0)["b->a"] == pytest.approx(2.0, rel=RATE_REL_TOL)
    assert window_rates_mbit(series, 0.0, 2.0)["b->a"] == 0.0


def test_a_window_between_two_samples_gets_the_interpolated_rate(series):
    rates = window_rates_mbit(series, 0.6, 0.9)
    assert rates == {"a->b": pytest.approx(1.0, rel=RATE_REL_TOL), "b->a": 0.0}


@pytest.mark.parametrize(("start", "end"), [(1.0, 1.0), (5.0, 9.0), (2.0, 1.0)])
def test_an_empty_window_has_no_rate(series, start, end):
    assert window_rates_mbit(series, start, end) == {"a->b": 0.0, "b->a": 0.0}


def test_window_mean(series):
    assert window_mean(series.cpu_busy_fraction, series, 1.0, 2.0) == pytest.approx(
        0.6, rel=RATE_REL_TOL)
    assert window_mean(series.cpu_busy_fraction, series, 0.0, 3.0) == pytest.approx(
        3.9 / 7, rel=RATE_REL_TOL)
    assert window_mean(series.vswitchd_cores, series, 0.25, 10.0) == 1.0
    assert window_mean(series.cpu_busy_fraction, series, 3.1, 4.0) == 0.0


def test_window_rates_read_mid_sample_count_only_whole_samples(series):
    # the sampler's thread has appended the instant 3.5 and a->b's counter, not yet b->a's:
    # the window ends at the last sample both hold, 3.0
    whole = window_rates_mbit(series, 0.0, 3.0)
    series.t_s.append(3.5)
    series.link_bytes["a->b"].append(437_500)
    assert window_rates_mbit(series, 0.0, 3.5) == whole


def test_window_rates_of_an_empty_series():
    assert window_rates_mbit(Series(link_bytes={"x->y": []}), 0.0, 1.0) == {"x->y": 0.0}
    assert window_mean([], Series(), 0.0, 1.0) == 0.0


def test_the_busiest_thread_between_two_readings():
    from testbed.measure.telemetry import CLOCK_TICKS_PER_S, busiest_thread

    tick = CLOCK_TICKS_PER_S
    before = {(1, 1): ("main", 10 * tick), (1, 2): ("worker", 5 * tick)}
    after = {(1, 1): ("main", 10 * tick + tick // 4), (1, 2): ("worker", 5 * tick + tick // 2),
             (1, 3): ("new", tick // 10)}  # started in the interval: counted from zero
    name, cores = busiest_thread(before, after, 1.0)
    assert (name, cores) == ("worker", pytest.approx(0.5))
    # a thread the earlier reading missed, with a minute of CPU behind it, is not charged
    # its whole life in one interval (it once showed as 476 cores)
    missed = {**after, (1, 4): ("old", 60 * tick)}
    assert busiest_thread(before, missed, 0.25)[0] == "worker"


def test_the_sampler_never_reads_a_clock_tick_as_many_cores():
    # The opening sample comes microseconds after the baseline: read as an interval, one
    # tick of a busy thread is hundreds of cores. It takes the first real interval's values.
    # The busy thread is another process's, so that this one's sampler thread keeps its pace.
    import subprocess
    import sys
    import time

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        for _ in range(5):
            with Sampler([], [busy.pid], interval_s=0.05,
                         threads={"busy": [busy.pid]}) as sampler:
                time.sleep(0.3)
            s = sampler.series
            assert len(s.t_s) >= 2
            assert max(s.thread_cores["busy"]) <= 2.0  # one thread, one core at most
            assert max(s.vswitchd_cores) <= 2.0
            assert s.thread_cores["busy"][0] == s.thread_cores["busy"][1]
            assert s.cpu_busy_fraction[0] == s.cpu_busy_fraction[1]
    finally:
        busy.kill()
        busy.wait()


def test_the_sampler_keeps_queue_series_aligned_and_stops_on_a_failing_read():
    import time

    from testbed.measure.telemetry import QueueReaders

    readings = iter([{"a->b": 5}, {"a->b": 6, "c->d": 7}, {"c->d": 8}])
    # the model is read before and after each backlog reading (not again when it has none)
    models = iter([{}, {"c->d": 1}, {"c->d": 3}, {"c->d": 2}, {"c->d": 2}])

    def backlogs():
        try:
            return next(readings)
        except StopIteration:
            raise OSError("gone") from None

    with Sampler([], [], interval_s=0.02,
                 queues=QueueReaders(backlogs, lambda: next(models, {}))) as sampler:
        time.sleep(0.3)
    s = sampler.series
    assert len(s.queue_t_s) == 3 and s.queue_error == "OSError: gone"
    assert s.backlog_bytes == {"a->b": [5, 6, 0], "c->d": [0, 7, 8]}
    assert s.model_bytes == {"c->d": [0, 2, 2]}  # the midpoint of the two readings
    assert s.model_swing_bytes == {"c->d": [0, 1, 0]}  # half their difference
    assert len(s.t_s) > 3  # the rest of the sampling went on


def test_every_shaped_link_has_an_egress_port_per_direction(fabric, directions):
    from testbed.apply.backlogs import shaped_ports

    ports = shaped_ports(fabric)
    assert {p.label for p in ports} == set(directions)
    host_port = next(p for p in ports if p.label.startswith(fabric.hosts[0].name + "->"))
    link, end = fabric.host_link(fabric.hosts[0].name)
    assert host_port.host and host_port.intf == link.intf(end)
    assert host_port.rate_mbit == directions[host_port.label].rate_mbit
