"""Workloads that run inside emulated hosts (one process per rank), and their pure schedules."""
