"""The local launcher's side of the PD-mixed memory partition (``InstanceConfig.memory_share``).

Kept beside the manifests' tests: both render the same ``--gpu-memory-utilization`` contract (the
manifests for Kubernetes pods, ``serving.pools.local`` for local processes), and the last test checks they
agree. No server is started: the command line and the environment are what is checked.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from serving.manifests import ManifestSpec, render
from serving.pools.local import (
    BASE_ENV,
    GIB,
    KV_SPACE_ENV,
    InstanceConfig,
    KVTransfer,
    detect_platform,
    instance_env,
    memory_settings,
    mixed_node_share_problems,
    pd_pair_configs,
    server_command,
    start_pd_pair,
)

PARENT = {"PATH": "/usr/bin", KV_SPACE_ENV: "7"}  # a parent setting the variable must not win


def _cfg(tmp_path: Path, **kw: object) -> InstanceConfig:
    return InstanceConfig(model_dir=tmp_path, **kw)  # type: ignore[arg-type]


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_gpu_build_passes_gpu_memory_utilization(tmp_path: Path) -> None:
    argv = server_command(_cfg(tmp_path, memory_share=0.4, platform="gpu"), 8000)
    assert _flag(argv, "--gpu-memory-utilization") == "0.4"
    assert "--kv-cache-memory-bytes" not in argv
    env = instance_env(_cfg(tmp_path, memory_share=0.4, platform="gpu"), PARENT)
    assert env[KV_SPACE_ENV] == BASE_ENV[KV_SPACE_ENV]  # untouched on GPU (vLLM ignores it there)


def test_cpu_whole_gib_share_sets_the_kv_space_variable(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, memory_share=0.5, platform="cpu", node_kv_space_gib=4.0)
    argv = server_command(cfg, 8000)
    assert "--gpu-memory-utilization" not in argv  # on CPU it means a share of host RAM, all free at start
    assert "--kv-cache-memory-bytes" not in argv
    assert instance_env(cfg, PARENT)[KV_SPACE_ENV] == "2"


def test_cpu_fractional_share_passes_bytes_and_drops_the_variable(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, memory_share=0.4, platform="cpu", node_kv_space_gib=4.0)
    argv = server_command(cfg, 8000)
    assert _flag(argv, "--kv-cache-memory-bytes") == str(int(1.6 * GIB))
    env = instance_env(cfg, PARENT)
    assert KV_SPACE_ENV not in env  # vLLM's legacy variable would override the flag
    assert env["PATH"] == "/usr/bin"


def test_no_share_keeps_the_defaults(tmp_path: Path) -> None:
    for platform in ("cpu", "gpu"):
        cfg = _cfg(tmp_path, platform=platform)
        assert memory_settings(cfg).args == () and not memory_settings(cfg).env
        assert instance_env(cfg, PARENT)[KV_SPACE_ENV] == BASE_ENV[KV_SPACE_ENV]


def test_explicit_env_still_wins(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, memory_share=0.5, platform="cpu", env={KV_SPACE_ENV: "3"})
    assert instance_env(cfg, {})[KV_SPACE_ENV] == "3"


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"memory_share": 0.0}, "memory_share"),
        ({"memory_share": 1.5}, "memory_share"),
        ({"memory_share": math.nan}, "memory_share"),
        ({"platform": "tpu"}, "platform"),
        ({"node_kv_space_gib": 0.0}, "node_kv_space_gib"),
    ],
)
def test_bad_values_name_the_field(tmp_path: Path, kw: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=f"InstanceConfig.{field}"):
        _cfg(tmp_path, **kw)


def test_a_share_below_a_mebibyte_is_refused(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, memory_share=1e-7, platform="cpu", node_kv_space_gib=1.0)
    with pytest.raises(ValueError, match=r"memory_share: 1e-07 .* below 1 MiB"):
        server_command(cfg, 8000)


def test_detect_platform_finds_vllm_cpu_here() -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed")
    assert detect_platform() == "cpu"  # the project's venv carries vllm-cpu (see VLLM_CPU.md)


@given(
    prefill=st.floats(0.01, 0.99),
    decode=st.floats(0.01, 0.99),
    minimum=st.floats(0.01, 0.99),
)
def test_share_rules_accept_exactly_the_partitions_that_fit(
    prefill: float, decode: float, minimum: float
) -> None:
    problems = mixed_node_share_problems(prefill, decode, minimum)
    fits = prefill + decode <= 0.95 + 1e-9 and decode >= minimum - 1e-9
    assert (not problems) == fits, problems


def test_pd_pair_refuses_shares_that_do_not_fit_before_starting_anything(tmp_path: Path) -> None:
    kv = KVTransfer(shared_storage_path=tmp_path)
    with pytest.raises(ValueError, match=r"prefill_share \+ decode_share: 0.5 \+ 0.5 = 1 exceeds 0.95"):
        start_pd_pair(tmp_path, tmp_path / "logs", kv, memory_shares=(0.5, 0.5))
    with pytest.raises(ValueError, match=r"decode_share: 0\.2 is below"):
        start_pd_pair(tmp_path, tmp_path / "logs", kv, memory_shares=(0.4, 0.2))
    assert not (tmp_path / "logs").exists()


def test_launcher_and_manifests_give_the_same_gpu_shares(tmp_path: Path) -> None:
    spec = ManifestSpec(placement="mixed-node", prefill_mem_frac=0.35)
    pod = render(spec).find("Deployment", "default-pd-mixed")["spec"]["template"]["spec"]
    rendered = {c["name"]: _flag(c["args"], "--gpu-memory-utilization") for c in pod["containers"]}
    launched = {
        f"vllm-{role}": _flag(
            server_command(_cfg(tmp_path, memory_share=share, platform="gpu"), 8000),
            "--gpu-memory-utilization",
        )
        for role, share in (("prefill", spec.prefill_mem_frac), ("decode", spec.decode_share))
    }
    assert rendered == launched == {"vllm-prefill": "0.35", "vllm-decode": "0.55"}


def test_pd_pair_configs_carry_each_roles_share(tmp_path: Path) -> None:
    kv = KVTransfer(shared_storage_path=tmp_path)
    pre, dec = pd_pair_configs(tmp_path, kv, memory_shares=(0.4, 0.5), options={"max_num_seqs": 8})
    assert (pre.role, pre.memory_share, dec.role, dec.memory_share) == ("prefill", 0.4, "decode", 0.5)
    assert pre.max_num_seqs == dec.max_num_seqs == 8
    gpu = [
        _flag(server_command(replace(c, platform="gpu"), 1), "--gpu-memory-utilization") for c in (pre, dec)
    ]
    assert gpu == ["0.4", "0.5"]
    plain = pd_pair_configs(tmp_path, kv)
    assert [c.memory_share for c in plain] == [None, None]
