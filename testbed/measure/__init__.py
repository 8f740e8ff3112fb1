"""Measuring a running fabric: tc and switch counters, link and CPU samplers, queue depths, OpenFlow port statistics, statistics (percentiles, fairness) and the fidelity verdict."""
