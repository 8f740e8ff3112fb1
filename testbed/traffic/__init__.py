"""Programs that run inside emulated hosts (transports and workloads), importing nothing else from the testbed."""
