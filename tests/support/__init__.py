"""Importable helpers for tests: a real Prometheus server, an in-process Kubernetes API server."""
