"""Settings of the controller's real I/O: the Prometheus source and the Kubernetes actuator.

Pydantic models validated at the edge (files, environment, CLI); a bad value is rejected with a message
naming the field, never rewritten. The policy's own parameters live in ``controller.config``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ROLE_VALUES = ("prefill", "decode", "mixed")


class LabelMap(BaseModel):
    """Which Prometheus labels say what a series belongs to.

    ``instance``: the instance id (default ``instance``, the scrape target; use ``instance_id`` when one
    target exports many instances). ``pool``: the pool name, falling back to ``pool_fallback``
    (vLLM's ``model_name``) when the series has no ``pool`` label. ``role``: ``prefill`` / ``decode`` /
    ``mixed``; a series without it is ``mixed`` (a colocated vLLM server). ``node``: optional; without it
    the node id is the instance id.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    instance: str = Field("instance", min_length=1, description="label holding the instance id")
    pool: str = Field("pool", min_length=1, description="label holding the pool name")
    pool_fallback: str | None = Field(
        "model_name", description="label read when `pool` is absent (vLLM's own model_name); None = none"
    )
    role: str = Field("role", min_length=1, description="label holding prefill/decode/mixed")
    node: str | None = Field(None, description="label holding the node id; None = node is the instance")

    @field_validator("instance", "pool", "role", "pool_fallback", "node")
    @classmethod
    def _label_name(cls, value: str | None) -> str | None:
        if value is not None and not value.replace("_", "a").isalnum():
            raise ValueError(f"{value!r} is not a Prometheus label name (letters, digits, underscores)")
        return value


class PrometheusSettings(BaseModel):
    """How the controller reads Prometheus (``controller.sources.prometheus.PrometheusSource``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = Field(..., min_length=1, description="base URL, e.g. http://prometheus:9090")
    labels: LabelMap = Field(default_factory=LabelMap)
    timeout_s: float = Field(
        2.0, gt=0.0, le=300.0, description="whole-scrape deadline; a 1-s tick cannot wait longer"
    )
    bearer_token_file: Path | None = Field(None, description="file whose content is sent as a Bearer token")
    ca_file: Path | None = Field(None, description="CA bundle for an https URL")
    insecure: bool = Field(False, description="skip TLS verification (tests only)")
    max_points: int = Field(
        10_000, ge=1, le=11_000, description="steps per range query; Prometheus refuses more than 11,000"
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, got {value!r}")
        return value

    @model_validator(mode="after")
    def _tls(self) -> PrometheusSettings:
        if self.insecure and self.ca_file is not None:
            raise ValueError("give either ca_file or insecure=true, not both")
        return self


class KubernetesSettings(BaseModel):
    """How the controller scales Deployments (``controller.actuators.kubernetes.KubernetesActuator``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str = Field(
        ..., min_length=1, max_length=63, description="namespace of the pools' Deployments"
    )
    kubeconfig: Path | None = Field(None, description="kubeconfig file; None with in_cluster=false = default")
    context: str | None = Field(None, description="kubeconfig context; None = current context")
    in_cluster: bool = Field(False, description="use the pod's service account instead of a kubeconfig")
    request_timeout_s: float = Field(
        5.0, gt=0.0, le=120.0, description="per API request; a hung API server costs at most this"
    )
    max_conflict_retries: int = Field(
        3, ge=0, le=20, description="re-reads and retries after a 409 Conflict before giving up (temporary)"
    )
    dry_run: bool = Field(
        False, description="advisory mode: log and record what would be patched, patch nothing"
    )

    @model_validator(mode="after")
    def _source(self) -> KubernetesSettings:
        if self.in_cluster and (self.kubeconfig is not None or self.context is not None):
            raise ValueError("in_cluster=true takes no kubeconfig or context")
        return self
