"""The router's settings (pydantic, validated at the edge: a bad field is an error naming it).

A config file (YAML or JSON)::

    port: 8000
    policy: context-aware
    backends:
      - {id: p0, url: "http://127.0.0.1:8101", role: prefill, node: n0, long_context: true}
      - {id: d0, url: "http://127.0.0.1:8102", role: decode, node: n0, max_in_flight: 32}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from serving.router.backends import BackendSpec, Role
from serving.router.policies import policy_names


class BackendModel(BaseModel):
    """One backend, as in a config file or a ``POST /admin/backends`` body."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[A-Za-z0-9_.:-]{1,128}$")
    url: str = Field(pattern=r"^https?://[^/\s]+$", description="http://host:port, no path, no trailing /")
    role: Role = "mixed"
    node: str = ""
    long_context: bool = False  # prefill instance for prompts above 2048 tokens
    high_memory: bool = False  # decode instance for long outputs
    max_in_flight: int = Field(default=64, ge=1, description="requests at once before requests queue")

    def spec(self) -> BackendSpec:
        return BackendSpec(**self.model_dump())


class RouterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)  # 0: any free port
    policy: str = "least-loaded"
    # The pool the router fronts: a `pool` label on every series of its /metrics page, which a Prometheus
    # source needs to attribute its queue and counters ("" = no label; the pool manager passes its name).
    pool: str = Field(default="", max_length=128)
    backends: tuple[BackendModel, ...] = ()
    # How long a request may wait for a backend slot before a 503: long enough to ride out a scale-up
    # of warm standby, short enough that clients are not left hanging.
    queue_timeout_s: float = Field(default=30.0, gt=0)
    max_queue: int = Field(default=10_000, ge=1)  # per stage; beyond it requests get 503 at once
    max_attempts: int = Field(default=3, ge=1)  # tries on different backends before a 502
    connect_timeout_s: float = Field(default=5.0, gt=0)
    request_timeout_s: float = Field(default=600.0, gt=0)  # one backend request, whole body
    poll_interval_s: float = Field(default=2.0, ge=0)  # backends' /metrics; 0 = off (own counts only)
    health_interval_s: float = Field(default=2.0, gt=0)  # /health probes of unhealthy backends
    node_score_ttl_s: float = Field(default=30.0, gt=0)  # older controller scores are unknown
    admin_token: str | None = None  # when set, /admin/* needs "Authorization: Bearer TOKEN"

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        if value not in policy_names():
            raise ValueError(f"unknown routing policy {value!r}: registered are {policy_names()}")
        return value

    @field_validator("backends")
    @classmethod
    def _unique_ids(cls, value: tuple[BackendModel, ...]) -> tuple[BackendModel, ...]:
        ids = [b.id for b in value]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"duplicate backend ids {dupes}")
        return value


class RouterConfigError(ValueError):
    """A config file that cannot be read or is invalid; the message names the file and the fields."""


def router_config_from_dict(doc: Any, source: str = "<dict>") -> RouterConfig:
    try:
        return RouterConfig.model_validate(doc)
    except ValidationError as err:
        lines = [
            f"{source}: {'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in err.errors()
        ]
        raise RouterConfigError("invalid router config:\n  " + "\n  ".join(lines)) from None


def load_router_config(path: str | Path) -> RouterConfig:
    """Read a YAML or JSON router config (``.json`` as JSON, anything else as YAML)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise RouterConfigError(f"{p}: cannot read router config: {err}") from None
    try:
        doc = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise RouterConfigError(
            f"{p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {err}"
        ) from None
    return router_config_from_dict(doc if doc is not None else {}, str(p))
