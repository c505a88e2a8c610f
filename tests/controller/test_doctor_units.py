"""The doctor's pure judges, table by table, and its torch-free checkpoint reader."""

from __future__ import annotations

import copy
import json
import math
import struct
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.config import ControllerConfig, PoolConfig, SourceConfig
from controller.doctor import (
    Check,
    DoctorInputs,
    Member,
    available_channels,
    build_inventory,
    exit_code,
    expected_prefill_tps,
    judge_checkpoint,
    judge_clock_skew,
    judge_deployments,
    judge_kv_pressure,
    judge_labels,
    judge_pool_metrics,
    judge_prefill_throughput,
    judge_rbac,
    judge_router,
    judge_scrape_interval,
    judge_tick_latency,
    judge_ttft_imbalance,
    parse_duration_s,
    read_checkpoint_header,
    scrape_intervals,
)
from controller.forecasting import DEFAULT_CHECKPOINT
from controller.settings import LabelMap

ROOT = Path(__file__).resolve().parents[2]
LABELS = LabelMap()

# -- durations and exit codes --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("90s", 90.0), ("15m", 900.0), ("1h30m", 5400.0), ("500ms", 0.5), ("2d", 172800.0)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "m", "15x", "1h 30m", "0s", "-5s", "15m3"])
def test_parse_duration_rejects_with_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration_s(text)


@given(st.integers(1, 10_000), st.sampled_from([("s", 1), ("m", 60), ("h", 3600)]))
def test_parse_duration_units(n: int, unit: tuple[str, int]) -> None:
    assert parse_duration_s(f"{n}{unit[0]}") == n * unit[1]


@pytest.mark.parametrize(
    ("verdicts", "strict", "code"),
    [(["ok", "skip"], False, 0), (["ok", "warn"], False, 0), (["ok", "warn"], True, 1), (["fail"], False, 1)],
)
def test_exit_code(verdicts: list[str], strict: bool, code: int) -> None:
    checks = [Check("x", v, "d") for v in verdicts]  # type: ignore[arg-type]
    assert exit_code(checks, strict=strict) == code


def test_check_rejects_an_unknown_verdict() -> None:
    with pytest.raises(ValueError, match="verdict"):
        Check("x", "maybe", "d")  # type: ignore[arg-type]


# -- scrape interval and clock skew --------------------------------------------------------------

CONFIG_YAML = """
global:
  scrape_interval: 15s
scrape_configs:
  - job_name: vllm
    scrape_interval: 1s
  - job_name: slow
    scrape_interval: 30s
  - job_name: inherits
"""


def test_scrape_intervals_apply_prometheus_defaults() -> None:
    assert scrape_intervals(CONFIG_YAML) == (15.0, {"vllm": 1.0, "slow": 30.0, "inherits": 15.0})
    assert scrape_intervals("scrape_configs:\n  - job_name: a\n") == (60.0, {"a": 60.0})


@pytest.mark.parametrize(
    ("intervals", "jobs", "tick_s", "verdict"),
    [
        ({"vllm": 1.0, "other": 60.0}, ["vllm"], 1.0, "ok"),
        ({"vllm": 1.5}, ["vllm"], 1.0, "warn"),
        ({"vllm": 2.0}, ["vllm"], 1.0, "warn"),
        ({"vllm": 5.0}, ["vllm"], 1.0, "fail"),
        ({"vllm": 5.0}, ["vllm"], 5.0, "ok"),
        ({"a": 1.0, "b": 30.0}, [], 1.0, "fail"),  # no vLLM series yet: every job is judged
        ({}, [], 1.0, "fail"),
    ],
    ids=["at-tick", "1.5-ticks", "2-ticks", "5-ticks", "slow-tick", "no-series-all-jobs", "no-job"],
)
def test_judge_scrape_interval(
    intervals: dict[str, float], jobs: list[str], tick_s: float, verdict: str
) -> None:
    check = judge_scrape_interval(intervals, jobs, tick_s)
    assert check.verdict == verdict, check
    if verdict != "ok":
        assert check.fix


@pytest.mark.parametrize(
    ("prom_s", "before_s", "after_s", "tick_s", "verdict"),
    [
        (100.0, 100.0, 100.0, 1.0, "ok"),
        (100.2, 100.0, 100.0, 1.0, "ok"),  # under the floor
        (101.0, 100.0, 100.0, 1.0, "warn"),
        (106.0, 100.0, 100.0, 1.0, "fail"),
        (94.0, 100.0, 100.0, 1.0, "fail"),
        (101.0, 100.0, 102.0, 1.0, "ok"),  # within the round trip: cannot be told from the query's own delay
        (103.0, 100.0, 100.0, 10.0, "ok"),
    ],
)
def test_judge_clock_skew(
    prom_s: float, before_s: float, after_s: float, tick_s: float, verdict: str
) -> None:
    check = judge_clock_skew(prom_s, before_s, after_s, tick_s)
    assert check.verdict == verdict, check
    assert f"{prom_s - 0.5 * (before_s + after_s):+.3f}" in check.detail


# -- inventory, labels and pool metrics ----------------------------------------------------------


def row(name: str, **labels: str) -> dict[str, Any]:
    return {"metric": {"__name__": name, "job": "vllm", **labels}, "value": [0, "1"]}


def healthy_rows(pool: str = "a", *, underscore: bool = False) -> dict[str, list[dict[str, Any]]]:
    sep = "_" if underscore else ":"
    p = {"instance": f"{pool}-p0", "pool": pool, "role": "prefill"}
    d = {"instance": f"{pool}-d0", "pool": pool, "role": "decode"}
    return {
        "vllm:num_requests_running": [row(f"vllm{sep}num_requests_running", **p), row(f"vllm{sep}num_requests_running", **d)],
        "vllm:num_requests_waiting": [row(f"vllm{sep}num_requests_waiting", **p), row(f"vllm{sep}num_requests_waiting", **d)],
        "vllm:kv_cache_usage_perc": [row(f"vllm{sep}kv_cache_usage_perc", **d)],
        "vllm:prompt_tokens_total": [row(f"vllm{sep}prompt_tokens_total", **p)],
        "vllm:generation_tokens_total": [row(f"vllm{sep}generation_tokens_total", **d)],
        "vllm:num_preemptions_total": [row(f"vllm{sep}num_preemptions_total", **d)],
        "pdscale:router_requests_total": [row(f"pdscale{sep}router_requests_total", **p)],
        "vllm:time_to_first_token_seconds": [row(f"vllm{sep}time_to_first_token_seconds_count", **d)],
        "vllm:inter_token_latency_seconds": [row(f"vllm{sep}inter_token_latency_seconds_count", **d)],
    }  # fmt: skip


def merged(*parts: Mapping[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for part in parts:
        for k, v in part.items():
            out.setdefault(k, []).extend(v)
    return out


@pytest.mark.parametrize("underscore", [False, True], ids=["colon", "underscore"])
def test_a_complete_pool_is_ok_in_either_spelling(underscore: bool) -> None:
    inv = build_inventory(healthy_rows(underscore=underscore), LABELS)
    check = judge_pool_metrics("a", inv, LABELS)
    assert check.verdict == "ok", check
    assert "1 prefill, 1 decode" in check.detail
    assert judge_labels(inv, LABELS).verdict == "ok"
    assert inv.jobs == frozenset({"vllm"})


def test_a_missing_metric_names_the_instance_and_the_metric() -> None:
    rows = healthy_rows()
    rows["vllm:kv_cache_usage_perc"] = []
    check = judge_pool_metrics("a", build_inventory(rows, LABELS), LABELS)
    assert check.verdict == "warn"
    assert "decode a-d0 lacks vllm:kv_cache_usage_perc" in check.detail


def test_an_instance_with_only_the_pre_v1_name_is_told_so() -> None:
    rows = healthy_rows()
    rows["vllm:kv_cache_usage_perc"] = []
    rows["vllm:gpu_cache_usage_perc"] = [
        row("vllm:gpu_cache_usage_perc", instance="a-d0", pool="a", role="decode")
    ]
    check = judge_pool_metrics("a", build_inventory(rows, LABELS), LABELS)
    assert check.verdict == "warn"
    assert "vllm:kv_cache_usage_perc (exports the older vllm:gpu_cache_usage_perc)" in check.detail
    assert "recording rule" in check.fix


def test_a_pool_without_series_fails_and_lists_the_pools_found() -> None:
    check = judge_pool_metrics("b", build_inventory(healthy_rows("a"), LABELS), LABELS)
    assert check.verdict == "fail" and "pools found: a" in check.detail and check.fix


def test_model_name_stands_in_for_a_missing_pool_label() -> None:
    rows = {"vllm:num_requests_running": [row("vllm:num_requests_running", instance="x", model_name="llama")]}
    inv = build_inventory(rows, LABELS)
    assert inv.members("llama") == frozenset({Member("llama", "mixed", "x")})


def test_unmapped_series_are_reported_with_the_reason() -> None:
    rows = merged(
        healthy_rows(), {"vllm:num_requests_running": [row("vllm:num_requests_running", instance="x")]}
    )
    check = judge_labels(build_inventory(rows, LABELS), LABELS)
    assert check.verdict == "warn"
    assert "vllm:num_requests_running: 1 series, no 'pool' or 'model_name' label" in check.detail
    assert "relabel_configs" in check.fix


def test_two_spellings_are_noted_not_failed() -> None:
    rows = merged(healthy_rows(), healthy_rows(underscore=True))
    check = judge_labels(build_inventory(rows, LABELS), LABELS)
    assert check.verdict == "ok" and "several spellings" in check.detail


def test_available_channels_follow_the_roles() -> None:
    rows = healthy_rows()
    rows["pdscale:router_requests_total"] = []
    chans = available_channels("a", build_inventory(rows, LABELS))
    assert "arrival_rps" not in chans
    assert {"prompt_tps", "gen_tps", "running", "waiting", "kv_usage", "ttft_p90_s", "itl_p90_s"} <= chans


# -- checkpoint ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shipped() -> dict[str, Any]:
    return read_checkpoint_header(DEFAULT_CHECKPOINT)


def write_checkpoint(path: Path, doc: Mapping[str, Any]) -> Path:
    """A safetensors file with no tensors and ``doc`` as the pdscale metadata (the header is all we read)."""
    header = json.dumps({"__metadata__": {"pdscale": json.dumps(doc)}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    return path


def full_channels() -> dict[str, set[str]]:
    return {"a": available_channels("a", build_inventory(healthy_rows(), LABELS))}


def test_the_shipped_checkpoint_matches_a_full_set_of_metrics(shipped: dict[str, Any]) -> None:
    check = judge_checkpoint(DEFAULT_CHECKPOINT, shipped, None, full_channels(), 1.0, is_default=True)
    assert check.verdict == "ok", check
    assert "trained on arrival_rps, prompt_tps, gen_tps" in check.detail
    assert "length guard: prompts 130-5,786, outputs 15-1,031 tokens per request" in check.detail


def test_the_length_range_is_checked(shipped: dict[str, Any], tmp_path: Path) -> None:
    doc = copy.deepcopy(shipped)
    del doc["meta"]["length_range"]
    path = write_checkpoint(tmp_path / "old.safetensors", doc)
    check = judge_checkpoint(path, read_checkpoint_header(path), None, None, 1.0, is_default=False)
    assert check.verdict == "ok" and "no training length range" in check.detail
    doc["meta"]["length_range"] = {"prompt": [1, 2]}
    path = write_checkpoint(tmp_path / "bad.safetensors", doc)
    check = judge_checkpoint(path, read_checkpoint_header(path), None, None, 1.0, is_default=False)
    assert check.verdict == "fail" and "length_range.output" in check.detail
    assert "training.length_range" in check.fix


def test_a_trained_channel_without_its_metric_warns(shipped: dict[str, Any]) -> None:
    rows = healthy_rows()
    rows["pdscale:router_requests_total"] = []
    available = {"a": available_channels("a", build_inventory(rows, LABELS))}
    check = judge_checkpoint(DEFAULT_CHECKPOINT, shipped, None, available, 1.0, is_default=True)
    assert check.verdict == "warn"
    assert "a: arrival_rps (needs pdscale:router_requests_total)" in check.detail


def test_a_different_schema_fails_listing_the_difference(shipped: dict[str, Any], tmp_path: Path) -> None:
    doc = copy.deepcopy(shipped)
    doc["schema"]["channels"] = [c for c in doc["schema"]["channels"] if c != "waiting"]
    doc["schema"]["masked"] = doc["schema"]["masked"][:-1]
    path = write_checkpoint(tmp_path / "old.safetensors", doc)
    check = judge_checkpoint(path, read_checkpoint_header(path), None, None, 1.0, is_default=False)
    assert check.verdict == "fail"
    assert "missing ['waiting']" in check.detail and "train-forecaster" in check.fix


def test_a_checkpoint_trained_at_another_step_warns(shipped: dict[str, Any]) -> None:
    check = judge_checkpoint(DEFAULT_CHECKPOINT, shipped, None, full_channels(), 2.0, is_default=True)
    assert check.verdict == "warn" and "tick is 2 s" in check.detail


@pytest.mark.parametrize("content", [b"", b"\x05\x00", b"\xff" * 8 + b"{}", struct.pack("<Q", 2) + b"{}"])
def test_unreadable_checkpoints_are_errors_not_crashes(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(ValueError):
        read_checkpoint_header(path)


@pytest.mark.parametrize(("is_default", "verdict"), [(True, "warn"), (False, "fail")])
def test_a_missing_checkpoint_falls_back(is_default: bool, verdict: str, tmp_path: Path) -> None:
    check = judge_checkpoint(tmp_path / "x", None, "no such file", None, 1.0, is_default=is_default)
    assert check.verdict == verdict and "Holt" in check.detail


def test_reading_a_checkpoint_header_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from controller.doctor import read_checkpoint_header\n"
        "from controller.forecasting import DEFAULT_CHECKPOINT\n"
        "assert read_checkpoint_header(DEFAULT_CHECKPOINT)['format'] == 'pdscale-forecaster'\n"
        "print('torch' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


# -- kubernetes, router --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answers", "verdict", "words"),
    [
        ({"patch deployments/scale": True, "get leases": True}, "ok", "allowed"),
        ({"patch deployments/scale": False, "get leases": True}, "fail", "denied: patch deployments/scale"),
        ({"patch deployments/scale": "ApiException: 401"}, "fail", "access review failed"),
    ],
)
def test_judge_rbac(answers: dict[str, bool | str], verdict: str, words: str) -> None:
    check = judge_rbac("llm", answers, leases_namespace="llm")
    assert check.verdict == verdict and words in check.detail


def test_judge_deployments_needs_both_active_roles() -> None:
    ok = judge_deployments("a", "llm", [("a-p", "prefill", "active"), ("a-d", "decode", "active")])
    lacking = judge_deployments("a", "llm", [("a-p", "prefill", "active"), ("a-d", "decode", "standby")])
    assert ok.verdict == "ok"
    assert lacking.verdict == "fail" and "no active decode Deployment" in lacking.detail


@pytest.mark.parametrize(
    ("status", "error", "verdict"), [(200, None, "ok"), (503, None, "fail"), (None, "refused", "fail")]
)
def test_judge_router(status: int | None, error: str | None, verdict: str) -> None:
    body = {"ok": status == 200, "healthy": {"prefill": 1, "decode": 1, "mixed": 0}}
    assert judge_router("http://r", status, body, error).verdict == verdict


# -- failure signs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pinned", "preempted", "verdict"),
    [
        ({"d0": 0.9}, {"d0": 3.0}, "fail"),
        ({"d0": 0.9}, {"d0": 0.0}, "warn"),
        ({"d0": 0.9}, {}, "warn"),
        ({"d0": 0.2}, {"d0": 50.0}, "ok"),  # preemptions without a pinned cache: not this sign
        ({"d0": math.nan}, {}, "ok"),
        ({}, {}, "skip"),
    ],
    ids=["pinned-preempting", "pinned-quiet", "pinned-no-counter", "not-pinned", "no-samples", "no-decode"],
)
def test_judge_kv_pressure(pinned: dict[str, float], preempted: dict[str, float], verdict: str) -> None:
    check = judge_kv_pressure("a", pinned, preempted)
    assert check.verdict == verdict, check
    if verdict in ("fail", "warn"):
        assert "--max-num-seqs" in check.fix


@pytest.mark.parametrize(
    ("saturated", "expected", "verdict"),
    [
        ({"p0": (400.0, 20)}, 1000.0, "warn"),
        ({"p0": (600.0, 20)}, 1000.0, "ok"),
        ({"p0": (400.0, 2)}, 1000.0, "ok"),  # too few queued steps to judge
        ({"p0": (math.nan, 0)}, 1000.0, "ok"),
        ({"p0": (400.0, 20)}, None, "skip"),
        ({}, 1000.0, "skip"),
    ],
)
def test_judge_prefill_throughput(
    saturated: dict[str, tuple[float, int]], expected: float | None, verdict: str
) -> None:
    check = judge_prefill_throughput("a", saturated, expected, "why")
    assert check.verdict == verdict, check
    if verdict == "warn":
        assert "attention backend" in check.fix and "p0 400 tok/s" in check.detail


def test_expected_prefill_tps_is_at_least_the_slo_capacity() -> None:
    """Saturation (no SLO) sustains at least what one instance sustains within a TTFT SLO."""
    from serving.sim.capacity import prefill_capacity_tps
    from serving.sim.hardware import get_profile
    from serving.sim.latency import latency_model_for

    profile = get_profile("llama3-8b/a100")
    for prompt in (128.0, 1000.0, 4000.0):
        at_slo = prefill_capacity_tps(profile, latency_model_for(profile), 2000.0, prompt)
        assert expected_prefill_tps("llama3-8b/a100", prompt) >= at_slo > 0
    assert expected_prefill_tps("llama3-8b/a100", 20_000.0) > 0  # beyond any SLO, still a throughput


@pytest.mark.parametrize(
    ("p99", "verdict"),
    [({}, "skip"), ({"c/1": 0.1}, "ok"), ({"c/1": 0.6}, "warn"), ({"c/1": 0.1, "c/2": 1.5}, "fail"),
     ({"c/1": math.nan}, "ok")],
)  # fmt: skip
def test_judge_tick_latency(p99: dict[str, float], verdict: str) -> None:
    assert judge_tick_latency(p99, 1.0).verdict == verdict


@pytest.mark.parametrize(
    ("p90_s", "load", "verdict", "words"),
    [
        (0.5, {"p0": (1.0, 0.0)}, "ok", "SLO"),
        (3.0, {"p0": (4.0, 8.0), "p1": (0.0, 0.0)}, "warn", "p1 sat idle"),
        (3.0, {"p0": (4.0, 8.0), "p1": (3.0, 2.0)}, "warn", "short of capacity"),
        (math.nan, {}, "skip", "no TTFT"),
    ],
)
def test_judge_ttft_imbalance(
    p90_s: float, load: dict[str, tuple[float, float]], verdict: str, words: str
) -> None:
    check = judge_ttft_imbalance("a", p90_s, 1000.0, load)
    assert check.verdict == verdict and words in check.detail


# -- inputs --------------------------------------------------------------------------------------


def test_inputs_from_a_config_take_its_pools_labels_and_namespace() -> None:
    cfg = ControllerConfig(
        tick_s=2.0,
        pools=[PoolConfig(name="x")],
        source=SourceConfig(kind="prometheus", url="http://p:9090", pool_label="svc"),
        actuator={"kind": "kubernetes", "namespace": "llm"},  # type: ignore[arg-type]
    )
    inputs = DoctorInputs.build(cfg, window_s=60.0, leases=False)
    assert (inputs.tick_s, inputs.labels.pool, inputs.namespace, inputs.leases_namespace) == (
        2.0,
        "svc",
        "llm",
        None,
    )
    assert [p.name for p in inputs.pools or ()] == ["x"]
    assert DoctorInputs.build(cfg, tick_s=0.5).tick_s == 0.5


def test_inputs_reject_a_non_positive_window() -> None:
    with pytest.raises(ValueError, match="window_s"):
        DoctorInputs(window_s=0.0)


# -- command line (no Prometheus needed) ---------------------------------------------------------


def _cli(args: list[str]) -> tuple[int, str]:
    import typer
    from typer.testing import CliRunner

    from controller.doctor_cli import doctor_cmd

    app = typer.Typer()
    app.command()(doctor_cmd)
    result = CliRunner().invoke(app, args, env={"COLUMNS": "160"})
    return result.exit_code, result.output


def test_cli_help_teaches_with_examples() -> None:
    code, text = _cli(["--help"])
    assert code == 0 and "pdscale doctor --prometheus" in text and "--strict" in text


def test_cli_rejects_a_bad_window_with_exit_code_2() -> None:
    code, text = _cli(["--window", "15x"])
    assert code == 2 and "--window" in text


def test_cli_without_inputs_skips_and_says_how(tmp_path: Path) -> None:
    out = tmp_path / "d.json"
    code, _ = _cli(["--json", str(out)])
    doc = json.loads(out.read_text())
    verdicts = {c["name"]: c["verdict"] for c in doc["checks"]}
    assert code == 0 and doc["exit_code"] == 0
    assert verdicts == {
        "prometheus reachable": "skip",
        "forecaster checkpoint": "ok",
        "rbac": "skip",
        "router": "skip",
    }


def test_cli_strict_fails_on_a_warning(tmp_path: Path) -> None:
    missing = tmp_path / "gone.safetensors"
    code, _ = _cli(["--checkpoint", str(missing)])  # a checkpoint that was asked for and is missing: fail
    assert code == 1
    cfg = tmp_path / "c.yaml"
    cfg.write_text("tick_s: 2.0\n")  # the shipped checkpoint was trained at 1 s: a warning
    assert _cli(["--config", str(cfg)])[0] == 0
    assert _cli(["--config", str(cfg), "--strict"])[0] == 1


# -- orchestration with a Prometheus stand-in ----------------------------------------------------


class EmptyThanos:
    """A Prometheus-compatible API with no series and no /status/config (as Thanos or Mimir)."""

    url = "http://thanos"

    def __init__(self, now_s: float) -> None:
        self.now_s = now_s
        self.asked: list[tuple[str, dict[str, str]]] = []

    def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        from controller.doctor import DoctorError

        query = (params or {}).get("query", "")
        self.asked.append((path, dict(params or {})))
        if path == "status/buildinfo":
            return {"version": "thanos-0.35"}
        if path == "status/config":
            raise DoctorError("GET http://thanos/api/v1/status/config: HTTP 404")
        if path == "query" and query == "time()":
            return {"resultType": "scalar", "result": [self.now_s, str(self.now_s)]}
        if path == "query":
            return {"resultType": "vector", "result": []}
        return {"resultType": "matrix", "result": []}


def test_run_doctor_on_an_empty_prometheus_compatible_api() -> None:
    from controller.doctor import run_doctor

    prom = EmptyThanos(1_700_000_000.0)
    inputs = DoctorInputs(pools=(PoolConfig(name="a"),), window_s=60.0)
    checks = {(c.name, c.subject): c for c in run_doctor(inputs, prom=prom, clock=lambda: 1_700_000_000.0)}
    verdicts = {k: c.verdict for k, c in checks.items()}
    assert verdicts == {
        ("prometheus reachable", ""): "ok",
        ("scrape interval", ""): "warn",
        ("clock skew", ""): "ok",
        ("series labels", ""): "ok",
        ("vllm metrics", "a"): "fail",
        ("forecaster checkpoint", ""): "ok",
        ("decode kv pressure", "a"): "skip",
        ("prefill throughput", "a"): "skip",
        ("tail ttft vs idle capacity", "a"): "skip",
        ("controller tick latency", ""): "skip",
        ("rbac", ""): "skip",
        ("router", ""): "skip",
    }
    assert "every 1s or faster" in checks[("scrape interval", "")].fix
    # the failure-sign range queries end at Prometheus' time and span --window; instant ones look back as far
    ranges = [params for path, params in prom.asked if path == "query_range"]
    assert ranges and all(
        (float(r["start"]), float(r["end"])) == (1_700_000_000.0 - 60.0, 1_700_000_000.0) for r in ranges
    )
    assert any("[60000ms]" in params.get("query", "") for path, params in prom.asked if path == "query")


class _AccessProbe:
    """Answers access reviews from an allow-list of (verb, resource) and records what was asked."""

    def __init__(self, allowed: set[tuple[str, str]]) -> None:
        self.allowed = allowed
        self.asked: list[tuple[str, str]] = []

    def can(self, namespace: str, verb: str, group: str, resource: str, subresource: str = "") -> bool:
        name = f"{resource}/{subresource}" if subresource else resource
        self.asked.append((verb, name))
        return (verb, name) in self.allowed

    def deployments(self, namespace: str, pool: str) -> list[tuple[str, str, str]]:
        return []


def test_rbac_checks_pods_only_when_the_router_drain_marks_pods() -> None:
    from controller.config import ControllerConfig
    from controller.doctor import fetch_rbac

    base = {("list", "deployments"), ("get", "deployments/scale"), ("patch", "deployments/scale")}
    probe = _AccessProbe(base)
    plain = fetch_rbac(probe, "llm", None)
    assert (
        not any("pods" in k for k in plain)
        and judge_rbac("llm", plain, leases_namespace=None).verdict == "ok"
    )
    marked = fetch_rbac(probe, "llm", None, pods=True)
    check = judge_rbac("llm", marked, leases_namespace=None)
    assert check.verdict == "fail" and "list pods" in check.detail and "--router-drain" in check.fix
    allowed = fetch_rbac(_AccessProbe(base | {("list", "pods"), ("patch", "pods")}), "llm", None, pods=True)
    assert judge_rbac("llm", allowed, leases_namespace=None).verdict == "ok"

    doc = {
        "source": {"kind": "prometheus", "url": "http://prom:9090"},
        "actuator": {"kind": "kubernetes", "router_admin": {"pools": {"default": {"url": "http://r"}}}},
    }
    assert DoctorInputs.build(ControllerConfig.model_validate(doc)).pods is True
    doc["actuator"]["router_admin"]["mark_pods"] = False  # type: ignore[index]
    assert DoctorInputs.build(ControllerConfig.model_validate(doc)).pods is False
    assert DoctorInputs.build(None).pods is False


def test_a_pool_descriptor_checkpoint_is_accepted(shipped: dict[str, Any], tmp_path: Path) -> None:
    from forecaster.features import POOL_SCHEMA

    doc = copy.deepcopy(shipped)
    doc["schema"] = POOL_SCHEMA.to_dict()  # what `train-forecaster fit --pool-features` writes
    path = write_checkpoint(tmp_path / "pool.safetensors", doc)
    check = judge_checkpoint(path, read_checkpoint_header(path), None, full_channels(), 1.0, is_default=False)
    assert check.verdict != "fail", check
