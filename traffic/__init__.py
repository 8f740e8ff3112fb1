"""Workloads that run inside emulated hosts (one process per rank or endpoint), and their pure schedules. Imports only the standard library, numpy and itself."""
