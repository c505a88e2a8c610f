"""Hardware profiles: registry, derived memory figures, validated overrides."""

from __future__ import annotations

import pytest

from serving.sim.hardware import HardwareProfile, ProfileError, get_profile, list_profiles, profile_name
from serving.sim.latency import latency_model_for

GIB = 1 << 30


def test_registry_has_the_required_profiles() -> None:
    assert {"llama3-8b/a100", "llama2-7b/h100", "llama2-70b/h100", "cpu-tiny"} <= set(list_profiles())
    assert get_profile().name == "llama3-8b/a100"
    assert profile_name("llama3-8b", "a100") == "llama3-8b/a100"
    assert profile_name("tiny", "cpu") == "cpu-tiny"


@pytest.mark.parametrize(
    ("name", "params_b", "kv_bytes"),
    [
        ("llama3-8b/a100", 8.03, 2 * 32 * 8 * 128 * 2),
        ("llama2-7b/h100", 6.74, 2 * 32 * 32 * 128 * 2),
        ("llama2-70b/h100", 68.98, 2 * 80 * 8 * 128 * 2),
    ],
)
def test_model_shapes_give_known_sizes(name: str, params_b: float, kv_bytes: int) -> None:
    p = get_profile(name)
    assert p.params / 1e9 == pytest.approx(params_b, abs=0.01)
    assert p.kv_bytes_per_token == kv_bytes
    assert p.kv_bytes_per_token_per_gpu == pytest.approx(kv_bytes / p.gpus)


def test_kv_capacity_follows_vllm_memory_accounting() -> None:
    p = get_profile("llama3-8b/a100")
    pool = 80 * GIB * 0.9 - p.params * 2 - 4 * GIB
    assert p.kv_capacity_tokens == int(pool // (p.kv_bytes_per_token * 16)) * 16
    assert 400_000 < p.kv_capacity_tokens < 460_000  # vLLM logs ~27k blocks of 16 for this setup
    assert p.kv_capacity_tokens % p.block_size == 0
    tiny = get_profile("cpu-tiny")
    assert tiny.kv_capacity_tokens == GIB // tiny.kv_bytes_per_token  # VLLM_CPU_KVCACHE_SPACE=1
    assert tiny.block_size == 128


def test_overrides_recompute_derived_fields_and_latency() -> None:
    base = get_profile("llama2-70b/h100")
    tp8 = base.with_overrides(gpus=8)
    assert tp8.kv_capacity_tokens > base.kv_capacity_tokens  # weights spread thinner, more room for KV
    assert latency_model_for(tp8).prefill_ms(4096) < latency_model_for(base).prefill_ms(4096)
    assert base.with_overrides(max_num_seqs=64).max_num_seqs == 64
    assert base.gpus == 4  # the registered profile is untouched


def test_replicated_kv_heads_when_tp_exceeds_kv_heads() -> None:
    p = get_profile("llama3-8b/a100").with_overrides(gpus=16, heads=32)
    assert p.kv_heads_per_gpu == 1.0  # 8 KV heads over 16 GPUs: one (replicated) per GPU


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"gpus": 3}, "gpus"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"gpu_mem_gib": 10.0}, "no memory left"),
        ({"kv_transfer_gbps": 0.0}, "kv_transfer_gbps"),
        ({"block_size": 2.5}, "block_size"),
    ],
)
def test_invalid_overrides_name_the_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ProfileError, match=field):
        get_profile("llama2-70b/h100").with_overrides(**overrides)


def test_unknown_override_and_name_list_the_known_ones() -> None:
    with pytest.raises(ProfileError, match="max_num_seqs"):
        get_profile("cpu-tiny").with_overrides(max_seqs=3)
    with pytest.raises(ProfileError, match="llama2-70b/h100"):
        get_profile("mistral/a100")


def test_kv_transfer_time_is_latency_plus_bytes_over_bandwidth() -> None:
    p: HardwareProfile = get_profile("llama3-8b/a100")
    tokens = 2048
    expected = p.kv_transfer_latency_ms + tokens * p.kv_bytes_per_token * 8 / (p.kv_transfer_gbps * 1e9) * 1e3
    assert p.kv_transfer_ms(tokens) == pytest.approx(expected)
    assert p.kv_transfer_ms(2 * tokens) > p.kv_transfer_ms(tokens)


def test_operator_data_must_match_the_shape() -> None:
    with pytest.raises(ProfileError, match="does not match"):
        latency_model_for(get_profile("llama3-8b/a100").with_overrides(intermediate=11008))
