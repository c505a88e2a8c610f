"""Metric sources: Prometheus and the simulator, both turned into per-pool observations."""
