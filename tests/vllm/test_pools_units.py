"""Unit tests of serving/pools that need no vLLM: tiny model, launcher plumbing, prompts, metrics parsing."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.pools.loadgen import RequestTimings, StreamResult, completion_body, make_prompts, parse_metrics
from serving.pools.local import (
    InstanceConfig,
    InstanceStartError,
    KVTransfer,
    LocalInstance,
    group_pids,
    instance_env,
    server_command,
    tail_lines,
)
from serving.pools.tinymodel import MARKER_FILE, build_tiny_model, is_built, normal_token_ids


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


# --- tiny model -----------------------------------------------------------------------------------------


def test_tiny_model_is_byte_identical_across_builds(tiny: Path, tmp_path: Path) -> None:
    again = build_tiny_model(tmp_path / "again")
    names = sorted(p.name for p in tiny.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    assert "model.safetensors" in names
    for name in names:
        assert (tiny / name).read_bytes() == (again / name).read_bytes(), name


def test_tiny_model_shape_matches_the_cpu_tiny_profile(tiny: Path) -> None:
    config = json.loads((tiny / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"]) == (256, 2)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (4, 2)
    assert config["max_position_embeddings"] == 2048
    assert 900 <= config["vocab_size"] <= 1100


def test_tokenizer_round_trips_and_has_a_chat_template(tiny: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    ids = tok("the prefill token, 1234.")["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == "the prefill token, 1234."
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert isinstance(text, str)
    assert text.endswith("<|assistant|>\n")


def test_build_reuses_a_matching_directory(tiny: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in tiny.iterdir()}
    assert build_tiny_model(tiny) == tiny
    assert {p.name: p.stat().st_mtime_ns for p in tiny.iterdir()} == before


def test_build_refuses_a_foreign_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "weights.bin").write_bytes(b"\0")
    with pytest.raises(FileExistsError, match=MARKER_FILE):
        build_tiny_model(tmp_path / "x")


def test_other_seed_is_not_reused(tiny: Path) -> None:
    from serving.pools.tinymodel import TinyModelSpec

    assert is_built(tiny, TinyModelSpec(seed=0))
    assert not is_built(tiny, TinyModelSpec(seed=1))


def test_normal_token_ids_exclude_special_tokens(tiny: Path) -> None:
    ids = normal_token_ids(tiny)
    special = {t["id"] for t in json.loads((tiny / "tokenizer.json").read_text())["added_tokens"]}
    assert special
    assert not special & set(ids.tolist())
    assert ids.size > 900


# --- prompts and request bodies ---------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=20),
    seed=st.integers(min_value=0, max_value=2**31),
)
def test_make_prompts_exact_lengths_from_vocab(lengths: list[int], seed: int) -> None:
    vocab = np.array([5, 9, 11, 400])
    prompts = make_prompts(lengths, vocab, seed)
    assert [len(p) for p in prompts] == [max(n, 1) for n in lengths]
    assert all(set(p) <= {5, 9, 11, 400} for p in prompts)
    assert prompts == make_prompts(lengths, vocab, seed)


def test_make_prompts_rejects_empty_vocab() -> None:
    with pytest.raises(ValueError, match="vocab_ids is empty"):
        make_prompts([3], np.array([], dtype=np.int64))


def test_completion_body_runs_to_max_tokens() -> None:
    body = completion_body([1, 2], 0)
    assert body["max_tokens"] == 1
    assert body["ignore_eos"] is True
    assert body["temperature"] == 0.0
    assert body["stream_options"] == {"include_usage": True}
    assert "stream_options" not in completion_body([1], 3, stream=False)


# --- timings ----------------------------------------------------------------------------------------------


def test_stream_result_ttft_and_itl() -> None:
    r = StreamResult(sent_s=10.0, chunk_s=(10.5, 10.6, 10.9), completion_tokens=4)
    assert r.ttft_s == pytest.approx(0.5)
    assert r.itl_mean_s == pytest.approx(0.4 / 3)
    assert r.e2e_s == pytest.approx(0.9)
    assert math.isnan(StreamResult(0.0, (1.0,), 1).itl_mean_s)
    failed = StreamResult(0.0, (1.0, 2.0), 2, error="HTTP 500")
    assert math.isnan(failed.ttft_s) and math.isnan(failed.itl_mean_s)


def test_request_timings_summary_ignores_unmeasured() -> None:
    nan = math.nan
    t = RequestTimings(
        scheduled_s=np.array([0.0, 1.0, 2.0]),
        sent_s=np.array([0.0, 1.01, 2.5]),
        ttft_s=np.array([0.1, 0.3, nan]),
        itl_mean_s=np.array([nan, 0.02, nan]),
        e2e_s=np.array([0.1, 0.5, nan]),
        prompt_tokens=np.array([4, 4, 4]),
        output_tokens=np.array([1, 10, 10]),
        completion_tokens=np.array([1, 10, 0]),
        errors=("", "", "HTTP 500: boom"),
        wall_s=2.0,
    )
    s = t.summary()
    assert (s["requests"], s["completed"], s["failed"]) == (3, 2, 1)
    assert s["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert s["itl_ms"]["p90"] == pytest.approx(20.0)
    assert s["send_lag_ms_max"] == pytest.approx(500.0)
    assert s["first_errors"] == ["HTTP 500: boom"]
    json.dumps(s)  # JSON-ready


def test_parse_metrics_sums_matching_labels() -> None:
    text = (
        "# HELP vllm:prompt_tokens_by_source Prompt tokens by source.\n"
        "# TYPE vllm:prompt_tokens_by_source counter\n"
        'vllm:prompt_tokens_by_source_total{engine="0",source="local_compute"} 10.0\n'
        'vllm:prompt_tokens_by_source_total{engine="0",source="external_kv_transfer"} 256.0\n'
        'vllm:prompt_tokens_by_source_total{engine="1",source="external_kv_transfer"} 128.0\n'
    )
    m = parse_metrics(text)
    assert m.total("vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 384.0
    assert m.total("vllm:prompt_tokens_by_source_total") == 394.0
    assert math.isnan(m.total("vllm:no_such_metric"))


# --- launcher plumbing ------------------------------------------------------------------------------------


def test_server_command_carries_options(tmp_path: Path) -> None:
    storage = tmp_path / "kv"
    cfg = InstanceConfig(
        model_dir=tmp_path,
        role="decode",
        max_num_seqs=8,
        num_gpu_blocks_override=16,
        kv_transfer=KVTransfer(shared_storage_path=storage),
        enable_prefix_caching=False,
    )
    argv = server_command(cfg, 8123)
    assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--port") + 1] == "8123"
    assert argv[argv.index("--max-model-len") + 1] == "1024"
    assert argv[argv.index("--max-num-seqs") + 1] == "8"
    assert argv[argv.index("--num-gpu-blocks-override") + 1] == "16"
    assert "--no-enable-prefix-caching" in argv
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kv["kv_role"] == "kv_consumer"
    assert kv["kv_connector_extra_config"]["shared_storage_path"] == str(storage)
    mixed = server_command(InstanceConfig(model_dir=tmp_path), 1)
    assert "--kv-transfer-config" not in mixed and "--max-num-seqs" not in mixed


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"role": "router"}, "InstanceConfig.role"),
        ({"role": "prefill"}, "InstanceConfig.kv_transfer"),
        ({"max_num_seqs": 0}, "InstanceConfig.max_num_seqs"),
        ({"num_gpu_blocks_override": -1}, "InstanceConfig.num_gpu_blocks_override"),
    ],
    ids=["bad-role", "pd-without-connector", "zero-seqs", "negative-blocks"],
)
def test_instance_config_rejects(kwargs: dict[str, object], field: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=field):
        InstanceConfig(model_dir=tmp_path, **kwargs)  # type: ignore[arg-type]


def test_kv_transfer_roles_and_errors(tmp_path: Path) -> None:
    kv = KVTransfer(shared_storage_path=tmp_path)
    assert json.loads(kv.config_json("prefill"))["kv_role"] == "kv_producer"
    with pytest.raises(ValueError, match="mixed"):
        kv.config_json("mixed")
    with pytest.raises(ValueError, match="shared_storage_path"):
        KVTransfer().config_json("decode")
    nixl = KVTransfer(connector="NixlConnector")
    if importlib.util.find_spec("nixl") is None:
        with pytest.raises(RuntimeError, match="pip install nixl"):
            nixl.config_json("prefill")
    else:
        assert json.loads(nixl.config_json("prefill"))["kv_role"] == "kv_both"


def test_the_default_connector_is_nixl_when_installed_else_the_example_connector(tmp_path: Path) -> None:
    auto = KVTransfer(shared_storage_path=tmp_path)
    assert auto.connector == "auto"
    installed = importlib.util.find_spec("nixl") is not None
    assert auto.resolved() == ("NixlConnector" if installed else "ExampleConnector")
    assert json.loads(auto.config_json("decode"))["kv_connector"] == auto.resolved()
    assert KVTransfer(connector="ExampleConnector").resolved() == "ExampleConnector"


def test_a_nixl_server_gets_its_own_side_channel_and_others_none(tmp_path: Path) -> None:
    ports = iter([41001, 41002])
    nixl = KVTransfer(connector="NixlConnector")
    prefill = InstanceConfig(model_dir=tmp_path, role="prefill", kv_transfer=nixl)
    decode = InstanceConfig(model_dir=tmp_path, role="decode", kv_transfer=nixl)
    env_p = instance_env(prefill, {}, port_picker=lambda: next(ports))
    env_d = instance_env(decode, {}, port_picker=lambda: next(ports))
    assert (env_p["VLLM_NIXL_SIDE_CHANNEL_PORT"], env_d["VLLM_NIXL_SIDE_CHANNEL_PORT"]) == ("41001", "41002")
    assert env_p["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
    example = InstanceConfig(
        model_dir=tmp_path, role="prefill", kv_transfer=KVTransfer("ExampleConnector", tmp_path)
    )
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT" not in instance_env(example, {})
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT" not in instance_env(InstanceConfig(model_dir=tmp_path), {})
    pinned = InstanceConfig(
        model_dir=tmp_path, role="decode", kv_transfer=nixl, env={"VLLM_NIXL_SIDE_CHANNEL_PORT": "5600"}
    )
    assert instance_env(pinned, {})["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"  # the caller's choice wins


def _instance(tmp_path: Path, script: str) -> LocalInstance:
    log = tmp_path / "server.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(
            ["sh", "-c", script], stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
    return LocalInstance(
        url="http://127.0.0.1:9",  # discard port: nothing answers
        role="mixed",
        pid=proc.pid,
        log_path=log,
        config=InstanceConfig(model_dir=tmp_path),
        process=proc,
    )


def test_wait_healthy_reports_exit_with_log_tail(tmp_path: Path) -> None:
    server = _instance(tmp_path, "for i in $(seq 1 40); do echo line$i; done; exit 3")
    server.process.wait(timeout=10)
    with pytest.raises(InstanceStartError) as err:
        server.wait_healthy(5.0, poll_s=0.0)
    message = str(err.value)
    assert "exited with code 3" in message
    assert "line40" in message and "line11\n" in message and "line10\n" not in message  # last 30 lines


def test_wait_healthy_times_out_on_an_injected_clock(tmp_path: Path) -> None:
    server = _instance(tmp_path, "echo starting; exec sleep 60")
    ticks = iter(range(0, 10_000, 50))
    try:
        with pytest.raises(InstanceStartError, match="not healthy after 100 s"):
            server.wait_healthy(100.0, clock=lambda: float(next(ticks)), sleep=lambda _s: None)
    finally:
        server.stop()
    assert not server.group_alive()


def test_stop_kills_a_group_that_ignores_sigterm(tmp_path: Path) -> None:
    # The leader ignores SIGTERM and has a child: both must be gone after stop (SIGKILL fallback).
    server = _instance(tmp_path, "trap '' TERM; sleep 60 & echo child $!; wait")
    for _ in range(100):
        if len(group_pids(server.pid)) >= 2:
            break
        subprocess.run(["sleep", "0.05"], check=True)
    pids = group_pids(server.pid)
    assert len(pids) >= 2, pids
    server.stop(timeout_s=0.5)
    assert not server.group_alive()
    assert group_pids(server.pid) == []
    server.stop()  # idempotent


def test_tail_lines_of_missing_file_is_empty(tmp_path: Path) -> None:
    assert tail_lines(tmp_path / "nope.log") == ""


# --- engine iteration log ---------------------------------------------------------------------------------

_LOG = (
    "(APIServer pid=1) INFO 11-29 10:20:27 [loggers.py:199] Iteration(7): 1 context requests, 900 context tokens, "
    "0 generation requests, 0 generation tokens, iteration elapsed time: 41.07 ms, CPU KV cache usage: 0.1%\n"
    "(APIServer pid=1) INFO 11-29 10:20:27 [loggers.py:199] Iteration(8): 0 context requests, 0 context tokens, "
    "4 generation requests, 4 generation tokens, iteration elapsed time: 3.50 ms, CPU KV cache usage: 0.1%\n"
    "(APIServer pid=1) INFO 11-29 10:20:27 [loggers.py:199] Iteration(9): 0 context requests, 0 context tokens, "
    "0 generation requests, 0 generation tokens, iteration elapsed time: 0.00 ms (dummy), CPU KV cache usage: 0%\n"
    "(APIServer pid=1) INFO 11-29 10:20:28 [launcher.py:195] Route: /health, Methods: GET\n"
)


def test_parse_iterations_reads_steps_and_skips_dummies() -> None:
    from serving.pools.iterations import parse_iterations

    its = parse_iterations(_LOG)
    assert len(its) == 2
    np.testing.assert_array_equal(its.index, [7, 8])
    np.testing.assert_array_equal(its.ctx_tokens, [900, 0])
    np.testing.assert_array_equal(its.gen_requests, [0, 4])
    np.testing.assert_allclose(its.elapsed_ms, [41.07, 3.50])


def test_log_cursor_returns_only_new_whole_lines(tmp_path: Path) -> None:
    from serving.pools.iterations import LogCursor

    log = tmp_path / "s.log"
    log.write_text("old line\n")
    cursor = LogCursor(log)
    assert cursor.read() == ""
    with log.open("a") as f:
        f.write("new one\npartial")
    assert cursor.read() == "new one\n"
    with log.open("a") as f:
        f.write(" rest\n")
    assert cursor.read() == "partial rest\n"
