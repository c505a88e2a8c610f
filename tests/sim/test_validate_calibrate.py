"""`sim validate --calibrate` without a server: synthetic step-time and probe rows of known terms give back those
terms through the same CSV and fit code a calibration uses; a recorded calibrated run is compared with its own
fitted profile beside the shipped one (both views, goal counts); missing rows give an error naming them."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from serving.sim.calibrate import CSV_NAMES, CalibrationSpec, refit_csv, refit_recorded
from serving.sim.cli import sim_app
from serving.sim.cpu_tiny_fit import CalibrationError
from serving.sim.cpu_tiny_measure import (
    BACKGROUND_CONTEXT_AT_PROBE,
    PREFILL_TOKENS,
    ProbeRow,
    Row,
    write_csv,
    write_probe_csv,
)
from serving.sim.hardware import get_profile
from serving.sim.latency import CPU_TINY_JSON, load_linear_profile
from serving.sim.validate import (
    CALIBRATED,
    load_real,
    meets_goal,
    scale_slice,
    simulate_slice,
    spec_of,
    validate_against_sim,
)
from serving.workload.readers import read_trace

ROOT = Path(__file__).resolve().parents[2]
CONV = ROOT / "datasets/azure2023/AzureLLMInferenceTrace_conv.dev_before_1850.csv"
RECORDED = ROOT / "serving/sim/profiles/validation/conv_rows0-119_1rps_s6r1.json"
# the terms the synthetic rows are made of
A, B, C, D = 4.0, 0.05, 0.5, 0.001
OVERHEAD_MS = 12.0
BUSY_MS, PER_SEQ_MS = 30.0, 2.0
WAKE_MS = 150.0
STALL_EVERY, STALL_MS = 10, 40.0
FIGURES = ("ttft_ms.p50", "ttft_ms.p90", "itl_ms.p50", "itl_ms.p90")


def _step_rows() -> list[Row]:
    rows = []
    for rep in range(3):
        for n in PREFILL_TOKENS:
            step = A + B * n
            rows.append(Row(n, 0, 0, 0.0, step + OVERHEAD_MS, "prefill", f"prefill-{n}", rep))
            rows.append(Row(n, 0, 0, 0.0, step, "engine_prefill", f"engine-prefill-{n}", rep))
    for batch in (1, 4, 16):
        for ctx in (64, 256, 512):
            kv = batch * (ctx + 24.0)
            period = A + C * batch + D * kv
            rows.append(Row(0, 0, batch, kv, period, "decode", f"decode-{batch}x{ctx}", 0))
            for k in range(40):
                engine = 0.8 * period + (STALL_MS if k % STALL_EVERY == 0 else 0.0)
                rows.append(Row(0, 0, batch, kv, engine, "engine_decode", f"engine-decode-{batch}x{ctx}", 0))
    return rows


def _admit_ttft(running: int, n: int) -> float:
    """What the simulator models for an admit probe (``probe_fits``), plus the known admission term."""
    decode = running * (C + D * BACKGROUND_CONTEXT_AT_PROBE)
    modelled = OVERHEAD_MS + ((A + decode) / 2 if running else 0.0) + A + B * n + decode
    return modelled + (BUSY_MS + PER_SEQ_MS * running if running else 0.0)


def _probe_rows(short: bool) -> list[ProbeRow]:
    rows = []
    for rep in range(3):
        for running in (0, 1, 2, 4, 8):
            for n in (32, 256, 512):
                # short streams (all young) cost the same here: the age terms come out 0
                rows.append(
                    ProbeRow("admit", n, running, math.nan, _admit_ttft(running, n), math.nan, -1, rep)
                )
        if not short:
            for gap in (0.1, 0.5, 1.0, 2.0, 5.0):
                for n in (32, 512):
                    ttft = OVERHEAD_MS + A + B * n + (WAKE_MS if gap >= 1.0 else 0.0)
                    rows.append(ProbeRow("idle", n, 0, gap, ttft, math.nan, -1, rep))
    return rows


def _texts(tmp_path: Path, steps: list[Row], probes: list[ProbeRow], short: list[ProbeRow]) -> dict[str, str]:
    paths = {k: tmp_path / name for k, name in CSV_NAMES.items()}
    write_csv(steps, paths["steps"], "test", "0.0")
    write_probe_csv(probes, paths["probes"], "test", "0.0", "synthetic")
    write_probe_csv(short, paths["probes_short"], "test", "0.0", "synthetic")
    return {k: p.read_text() for k, p in paths.items()}


def _base() -> dict[str, Any]:
    return dict(json.loads(CPU_TINY_JSON.read_text()))


@pytest.fixture(scope="module")
def calibration(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    texts = _texts(tmp_path_factory.mktemp("cal"), _step_rows(), _probe_rows(False), _probe_rows(True))
    return refit_csv(texts, _base())


def test_synthetic_rows_give_back_their_terms(calibration: dict[str, Any]) -> None:
    profile = calibration["profile"]
    coef, over = profile["coefficients"], profile["overheads"]
    assert coef["a_ms"] == pytest.approx(A, rel=1e-3)
    assert coef["b_ms_per_prefill_token"] == pytest.approx(B, rel=1e-3)
    assert coef["c_ms_per_decode_seq"] == pytest.approx(C, rel=1e-3)
    assert coef["d_ms_per_decode_context_token"] == pytest.approx(D, rel=1e-3)
    assert over["request_overhead_ms"] == pytest.approx(OVERHEAD_MS)
    assert over["admission_busy_ms"] == pytest.approx(BUSY_MS, abs=1e-3)
    assert over["admission_ms_per_running_seq"] == pytest.approx(PER_SEQ_MS, abs=1e-3)
    assert over["admission_young_busy_ms"] == pytest.approx(0.0, abs=1e-3)
    assert over["wake_up_ms"] == pytest.approx(WAKE_MS)
    assert over["decode_stall_fraction"] == pytest.approx(1 / STALL_EVERY)
    assert over["decode_stall_ms"] == pytest.approx(STALL_MS, rel=1e-3)
    # the shipped profile's opt-in deferral never leaks into a fit that did not measure it
    assert "first_token_deferred_fraction" not in over
    # a profile the simulator loads, with the fit's source
    model = load_linear_profile(get_profile("cpu-tiny"), _as_file(profile))
    assert model.request_overhead_ms == pytest.approx(OVERHEAD_MS)
    assert "steps.csv" in profile["source"] and "probes_short_streams.csv" in profile["source"]
    assert set(calibration["csv"]) == set(CSV_NAMES)
    assert calibration["fits"]["decode_stalled"] == 9 * 40 // STALL_EVERY


def _as_file(profile: dict[str, Any]) -> Path:
    import tempfile

    path = Path(tempfile.mkdtemp()) / "p.json"
    path.write_text(json.dumps(profile))
    return path


def test_a_recorded_calibration_refits_to_the_same_profile(calibration: dict[str, Any]) -> None:
    again = refit_recorded(calibration, _base())
    assert again["profile"] == calibration["profile"]
    with pytest.raises(CalibrationError, match="field 'csv'"):
        refit_recorded({"csv": {"steps": ""}}, _base())


@pytest.mark.parametrize(
    ("drop", "message"),
    [
        pytest.param("engine", "no 'engine_prefill' rows.*iteration-details", id="no-engine-rows"),
        pytest.param("running", "no admit probe kept with streams running", id="no-busy-probe"),
        pytest.param("idle", "idle probes need gaps below and at or above 1 s", id="no-idle-probe"),
    ],
)
def test_missing_rows_are_named(tmp_path: Path, drop: str, message: str) -> None:
    steps, probes = _step_rows(), _probe_rows(False)
    if drop == "engine":
        steps = [r for r in steps if not r.kind.startswith("engine")]
    elif drop == "running":
        probes = [r for r in probes if r.kind == "idle" or r.running == 0]
    else:
        probes = [r for r in probes if r.kind == "admit"]
    with pytest.raises(CalibrationError, match=message):
        refit_csv(_texts(tmp_path, steps, probes, _probe_rows(True)), _base())


def test_calibration_spec_rejects_empty_measurements() -> None:
    with pytest.raises(ValueError, match=r"CalibrationSpec\.idle_reps: must be >= 1") as err:
        CalibrationSpec(idle_reps=0, decode_batches=())
    assert "CalibrationSpec.decode_batches" in str(err.value)


@pytest.fixture(scope="module")
def recorded(calibration: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A recorded real run (session 6's, slice 1) as a --calibrate run would write it."""
    doc = load_real(RECORDED)
    doc["calibration"] = calibration | {"provenance": {"elapsed_s": 90.0, "load_1min": "1.0 at start"}}
    path = tmp_path_factory.mktemp("rec") / "calibrated_run.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_calibrated_recording_is_compared_with_its_fit_beside_the_shipped(
    recorded: Path, calibration: dict[str, Any], tmp_path: Path
) -> None:
    doc = validate_against_sim(read_trace(CONV), work_dir=tmp_path, real_json=recorded)
    shipped = str(CPU_TINY_JSON.relative_to(ROOT))
    assert list(doc["compare"]) == [shipped, CALIBRATED]
    assert list(doc["compare_server"]) == [shipped, CALIBRATED]
    # the calibrated sim side is the fitted profile's, not the shipped one's
    real = load_real(recorded)
    expected = simulate_slice(
        scale_slice(read_trace(CONV), spec_of(real)), latency_json=_as_file(calibration["profile"])
    )
    assert doc["sim"][CALIBRATED]["ttft_ms"] == expected["ttft_ms"]
    assert doc["sim"][CALIBRATED]["ttft_ms"] != doc["sim"][shipped]["ttft_ms"]
    for key in (shipped, CALIBRATED):
        for view, part in (("client", "compare"), ("server", "compare_server")):
            goal = doc["within_goal"][key][view]
            outside = [f for f in FIGURES if not meets_goal(doc[part][key][f]["sim_over_real"], f)]
            assert goal == {"met": 4 - len(outside), "of": 4, "outside": outside}


def test_the_cli_prints_both_profiles_side_by_side(recorded: Path, tmp_path: Path) -> None:
    out = tmp_path / "v.json"
    res = CliRunner().invoke(
        sim_app, ["validate", str(CONV), "--real-json", str(recorded), "--json", str(out)], terminal_width=200
    )
    assert res.exit_code == 0, res.output
    assert "calibrated" in res.output and "within the goal" in res.output
    doc = json.loads(out.read_text())
    cal = doc["real"]["calibration"]
    assert {"profile", "provenance", "fits", "csv"} <= set(cal)
    assert set(doc["within_goal"]) == {str(CPU_TINY_JSON.relative_to(ROOT)), CALIBRATED}


def test_calibrate_cannot_go_with_a_recording(recorded: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(sim_app, ["validate", str(CONV), "--real-json", str(recorded), "--calibrate"])
    assert res.exit_code == 2 and "--calibrate" in res.output and "--real-json" in res.output


def test_an_overheads_variant_moves_the_server_view_only(recorded: Path, tmp_path: Path) -> None:
    """``overheads`` sets terms in every profile (the calibrated fit too): with the whole request overhead and
    admission delay outside vLLM's window the server's TTFT drops by at least the overhead, the client's stays."""
    base = validate_against_sim(read_trace(CONV), work_dir=tmp_path, real_json=recorded)
    shares = {"request_overhead_outside_fraction": 1.0, "admission_outside_fraction": 1.0}
    variant = validate_against_sim(read_trace(CONV), work_dir=tmp_path, real_json=recorded, overheads=shares)
    assert list(variant["compare_server"]) == list(base["compare_server"])
    for key in base["sim"]:
        assert variant["sim"][key]["request_ttft_ms"] == base["sim"][key]["request_ttft_ms"]
        before = base["compare_server"][key]["ttft_ms.mean"]["sim"]
        after = variant["compare_server"][key]["ttft_ms.mean"]["sim"]
        assert after <= before - OVERHEAD_MS + 1e-6 if key == CALIBRATED else after < before
