"""The P/D router: an OpenAI-compatible HTTP proxy with QoS, context-aware routing and an admin API.

Public API: ``Router(config, on_unhealthy=...)`` and ``run_router(config)`` (``app.py``),
``RouterConfig`` / ``load_router_config`` (``config.py``), ``BackendSpec`` (``backends.py``),
policies by name (``policies.make_policy``, ``register_policy``), ``cli.router_cmd``.
"""
