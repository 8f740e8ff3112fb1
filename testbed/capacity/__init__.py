"""What this machine can carry: forwarding and bring-up benchmarks against baselines."""
