"""The client's TTFT outside vLLM's own (session 9): synthetic outside rows of a known term give it back through
the calibration's CSV and fit; the term moves the simulator's client TTFT by exactly what it says (in-flight counts
from the simulated timeline) and nothing else; a recorded calibration with outside rows gets both variants."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from serving.sim.calibrate import CSV_NAMES, OUTSIDE_CSV, CalibrationSpec
from serving.sim.cpu_tiny_fit import (
    OUTSIDE_TERMS,
    CalibrationError,
    fit_client_outside,
    overhead_outside_share,
)
from serving.sim.cpu_tiny_measure import (
    OUTSIDE_CONCURRENCY,
    OUTSIDE_PROMPTS,
    OutsideRow,
    inflight_at_send,
    read_outside,
    write_outside_csv,
)
from serving.sim.latency import CPU_TINY_JSON
from serving.sim.validate import (
    CALIBRATED,
    CALIBRATED_OUTSIDE,
    CALIBRATED_OUTSIDE_MEAN,
    CALIBRATED_OUTSIDE_SAMPLED,
    CALIBRATED_OUTSIDE_SHARE,
    ClientOutside,
    client_ttft_with_outside,
    load_real,
    scale_slice,
    simulate_slice,
    spec_of,
    validate_against_sim,
)
from serving.workload.readers import read_trace
from serving.workload.trace import Trace

ROOT = Path(__file__).resolve().parents[2]
CONV = ROOT / "datasets/azure2023/AzureLLMInferenceTrace_conv.dev_before_1850.csv"
RECORDED = ROOT / "serving/sim/profiles/validation/conv_rows0-119_1rps_s8cr1.json"
CONST, PER_TOKEN, PER_INFLIGHT = 40.0, 0.05, 12.0


def _rows(
    const: float = CONST, per_token: float = PER_TOKEN, per_inflight: float = PER_INFLIGHT
) -> list[OutsideRow]:
    """Lone and loaded rows whose client TTFT exceeds the server's by exactly the term (server TTFTs vary)."""
    rng = np.random.default_rng(3)
    rows = []
    for rep in range(2):
        for n in OUTSIDE_PROMPTS:
            server = float(rng.uniform(20, 80))
            rows.append(OutsideRow("lone", 1, 1, n, 0.0, server + const + per_token * n, server, rep))
        for c in OUTSIDE_CONCURRENCY:
            prompt, inflight, server = (
                float(rng.uniform(50, 400)),
                float(rng.uniform(0.5, c)),
                float(rng.uniform(50, 300)),
            )
            outside = const + per_token * prompt + per_inflight * inflight
            rows.append(OutsideRow("load", c, 4 * c, prompt, inflight, server + outside, server, rep))
    return rows


def _fit_via_csv(rows: list[OutsideRow], tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / OUTSIDE_CSV
    write_outside_csv(rows, path, "test", "0.0", "synthetic")
    return fit_client_outside(read_outside(path))


def test_synthetic_rows_give_back_their_term(tmp_path: Path) -> None:
    fit = _fit_via_csv(_rows(), tmp_path)
    assert fit["const_ms"] == pytest.approx(CONST, rel=1e-4)
    assert fit["per_prompt_token_ms"] == pytest.approx(PER_TOKEN, rel=1e-4)
    assert fit["per_inflight_ms"] == pytest.approx(PER_INFLIGHT, rel=1e-4)
    assert fit["max_abs_miss_ms"] == pytest.approx(0.0, abs=1e-2)
    assert fit["n_rows"] == 2 * (len(OUTSIDE_PROMPTS) + len(OUTSIDE_CONCURRENCY))
    # no load dependence in the rows: none in the fit (the term is not negative either)
    flat = _fit_via_csv(_rows(per_inflight=0.0), tmp_path)
    assert flat["per_inflight_ms"] == pytest.approx(0.0, abs=1e-3)
    assert flat["const_ms"] == pytest.approx(CONST, rel=1e-4)


def test_the_sampled_term_draws_the_lone_rows_spread(tmp_path: Path) -> None:
    """Lone rows scattered about the term: the fit's residuals, drawn per request, give back exactly the measured
    lone outsides at their prompts (in flight 0), the same draws every time."""
    rows = _rows()
    noise = [30.0, -20.0, 55.0, -10.0, 0.0, 5.0, -25.0, 15.0]
    lone = [i for i, r in enumerate(rows) if r.kind == "lone"]
    for i, e in zip(lone, noise, strict=True):
        r = rows[i]
        rows[i] = OutsideRow(**(asdict(r) | {"client_ttft_mean_ms": r.client_ttft_mean_ms + e}))
    fit = _fit_via_csv(rows, tmp_path)
    term = ClientOutside(
        fit["const_ms"], fit["per_prompt_token_ms"], fit["per_inflight_ms"], tuple(fit["lone_residuals_ms"])
    )
    n = OUTSIDE_PROMPTS[0]
    measured = np.array(
        [
            rows[i].client_ttft_mean_ms - rows[i].server_ttft_mean_ms
            for i in lone
            if rows[i].prompt_tokens_mean == n
        ]
    )
    drawn = term.added_ms(np.full(200, float(n)), np.zeros(200))
    support = fit["const_ms"] + fit["per_prompt_token_ms"] * n + np.array(fit["lone_residuals_ms"])

    def nearest(x: np.ndarray) -> np.ndarray:
        return np.asarray(np.min(np.abs(x[:, None] - support[None, :]), axis=1))

    assert np.all(nearest(drawn) < 1e-3) and np.all(nearest(measured) < 1e-3)
    assert len(set(np.round(drawn, 3).tolist())) > 1  # drawn, not one value
    assert np.array_equal(drawn, term.added_ms(np.full(200, float(n)), np.zeros(200)))


@pytest.mark.parametrize("loss", ["median", "mean"])
def test_both_losses_give_back_an_exact_term(loss: str) -> None:
    cols = _columns(_rows())
    fit = fit_client_outside(cols, loss=loss)
    assert [fit[k] for k in OUTSIDE_TERMS] == pytest.approx([CONST, PER_TOKEN, PER_INFLIGHT], rel=1e-4)


def test_one_slow_request_moves_the_mean_fit_not_the_median_one() -> None:
    """A single lone request 400 ms late (the kind this VM shows): least squares lifts its constant, least
    absolute deviations keeps the term."""
    rows = _rows()
    i = next(i for i, r in enumerate(rows) if r.kind == "lone")
    rows[i] = OutsideRow(**(asdict(rows[i]) | {"client_ttft_mean_ms": rows[i].client_ttft_mean_ms + 400.0}))
    cols = _columns(rows)
    median, mean = fit_client_outside(cols), fit_client_outside(cols, loss="mean")
    assert [median[k] for k in OUTSIDE_TERMS] == pytest.approx([CONST, PER_TOKEN, PER_INFLIGHT], rel=1e-3)
    assert mean["const_ms"] > CONST + 5.0
    assert max(median["lone_residuals_ms"]) == pytest.approx(400.0, abs=0.01)
    with pytest.raises(ValueError, match="loss must be"):
        fit_client_outside(cols, loss="p90")


def _columns(rows: list[OutsideRow]) -> dict[str, np.ndarray]:
    cols = {
        k: np.array([getattr(r, k) for r in rows], dtype=np.float64) for k in asdict(rows[0]) if k != "kind"
    }
    return cols | {"kind": np.array([r.kind for r in rows])}


def test_the_fit_needs_lone_and_loaded_rows(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match="no load rows"):
        _fit_via_csv([r for r in _rows() if r.kind == "lone"], tmp_path)
    with pytest.raises(CalibrationError, match="no lone rows"):
        _fit_via_csv([r for r in _rows() if r.kind == "load"], tmp_path)


def test_the_overhead_share_is_the_lone_term_over_the_overhead() -> None:
    fit = {"const_ms": 10.0, "per_prompt_token_ms": 0.02, "per_inflight_ms": 5.0}
    assert overhead_outside_share(fit, 40.0, 250.0) == pytest.approx(15.0 / 40.0)
    assert overhead_outside_share(fit, 5.0, 250.0) == 1.0  # clipped
    assert overhead_outside_share(fit, 0.0, 250.0) == 0.0


def test_inflight_counts_the_others_sent_before_and_not_done() -> None:
    sent = np.array([0.0, 1.0, 1.5, 5.0])
    done = np.array([2.0, 3.0, 1.6, 6.0])
    assert inflight_at_send(sent, done).tolist() == [0, 1, 2, 0]


@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0.001, 10)), min_size=1, max_size=30))
def test_inflight_is_bounded_and_zero_for_back_to_back(pairs: list[tuple[float, float]]) -> None:
    sent = np.array([p[0] for p in pairs])
    done = sent + np.array([p[1] for p in pairs])
    k = inflight_at_send(sent, done)
    assert np.all((k >= 0) & (k <= len(pairs) - 1))
    chain = np.cumsum(np.array([p[1] for p in pairs]))
    assert np.all(inflight_at_send(np.concatenate([[0.0], chain[:-1]]), chain) == 0)


def _tiny_trace() -> Trace:
    return Trace.from_arrays(
        np.array([0.0, 0.05, 0.1, 5.0]),
        np.array([100, 200, 300, 400]),
        np.array([10, 10, 1, 5]),
        source="test",
    )


def test_the_term_adds_its_parts_per_request() -> None:
    tr = _tiny_trace()
    ttft = np.array([50.0, 60.0, 70.0, 40.0])
    itl = np.array([20.0, 20.0, np.nan, 20.0])  # request 0 runs to 0.23 s, 1 to 0.29 s, 2 (1 token) to 0.17 s
    out = client_ttft_with_outside(tr, tr.arrival_s, ttft, itl, ClientOutside(5.0, 0.1, 30.0))
    inflight = np.array([0, 1, 2, 0])
    assert out.tolist() == pytest.approx((ttft + 5.0 + 0.1 * tr.prompt_tokens + 30.0 * inflight).tolist())
    assert client_ttft_with_outside(tr, tr.arrival_s, ttft, itl, ClientOutside()).tolist() == ttft.tolist()


def test_the_term_moves_the_client_ttft_only() -> None:
    tr = scale_slice(read_trace(CONV))
    plain = simulate_slice(tr)
    shifted = simulate_slice(tr, client_outside=ClientOutside(const_ms=25.0))
    assert np.allclose(
        np.array(shifted["request_ttft_ms"]), np.array(plain["request_ttft_ms"]) + 25.0, atol=2e-3
    )
    assert shifted["ttft_ms"]["p50"] == pytest.approx(plain["ttft_ms"]["p50"] + 25.0)
    assert shifted["ttft_ms_in_sim"] == plain["ttft_ms"]
    for same in ("itl_ms", "e2e_ms", "server_histograms", "completed"):
        assert shifted[same] == plain[same]


def test_calibration_spec_rejects_negative_outside_reps() -> None:
    with pytest.raises(ValueError, match=r"CalibrationSpec\.outside_reps: must be >= 0"):
        CalibrationSpec(outside_reps=-1)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Session 8's calibrated run of slice 1 with synthetic outside rows added to its calibration."""
    tmp = tmp_path_factory.mktemp("out")
    doc = load_real(RECORDED)
    write_outside_csv(_rows(), tmp / OUTSIDE_CSV, "test", "0.0", "synthetic")
    doc["calibration"]["outside"] = {"csv": (tmp / OUTSIDE_CSV).read_text()}
    path = tmp / "run.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_recording_with_outside_rows_gets_both_variants(recorded: Path, tmp_path: Path) -> None:
    doc = validate_against_sim(read_trace(CONV), work_dir=tmp_path, real_json=recorded)
    shipped = str(CPU_TINY_JSON.relative_to(ROOT))
    assert list(doc["within_goal"]) == [
        shipped,
        CALIBRATED,
        CALIBRATED_OUTSIDE,
        CALIBRATED_OUTSIDE_SHARE,
        CALIBRATED_OUTSIDE_SAMPLED,
        CALIBRATED_OUTSIDE_MEAN,
    ]
    fit = doc["client_outside_fit"]
    assert fit["per_inflight_ms"] == pytest.approx(PER_INFLIGHT, rel=1e-4)
    sims = doc["sim"]
    # the term adds at least its constant and prompt part to every client TTFT; the server view stays
    base, term = (
        np.array(sims[CALIBRATED]["request_ttft_ms"]),
        np.array(sims[CALIBRATED_OUTSIDE]["request_ttft_ms"]),
    )
    prompts = scale_slice(read_trace(CONV), spec_of(load_real(recorded))).prompt_tokens
    assert np.all(term - base >= CONST + PER_TOKEN * prompts - 1e-2)
    assert sims[CALIBRATED_OUTSIDE]["server_histograms"] == sims[CALIBRATED]["server_histograms"]
    # with the share, the overhead's lone part leaves the server's window and the term holds only the rest
    share = fit["request_overhead_outside_fraction"]
    overhead = load_real(recorded)["calibration"]["profile"]["overheads"]["request_overhead_ms"]
    assert share == pytest.approx(min(1.0, (CONST + PER_TOKEN * np.mean(OUTSIDE_PROMPTS)) / overhead))
    server = doc["compare_server"]
    assert server[CALIBRATED_OUTSIDE_SHARE]["ttft_ms.mean"]["sim"] < server[CALIBRATED]["ttft_ms.mean"]["sim"]
    shared = np.array(sims[CALIBRATED_OUTSIDE_SHARE]["request_ttft_ms"])
    assert np.allclose(shared, term - share * overhead, atol=2e-3)


def test_a_recording_without_outside_rows_is_unchanged(tmp_path: Path) -> None:
    doc = validate_against_sim(read_trace(CONV), work_dir=tmp_path, real_json=RECORDED)
    assert CALIBRATED in doc["within_goal"] and CALIBRATED_OUTSIDE not in doc["within_goal"]
    assert doc["client_outside_fit"] is None
    assert set(CSV_NAMES) == set(doc["real"]["calibration"]["csv"])


def test_session_9s_recordings_carry_outside_rows_that_fit(tmp_path: Path) -> None:
    """A recorded --calibrate run of session 9 (real outside rows): the term fits and every variant is simulated."""
    path = ROOT / "serving/sim/profiles/validation/conv_rows600-719_1rps_s9or1.json"
    doc = validate_against_sim(read_trace(CONV), work_dir=tmp_path, real_json=path)
    fit = doc["client_outside_fit"]
    assert fit["n_rows"] == 14 and all(fit[k] >= 0 for k in OUTSIDE_TERMS)
    assert {CALIBRATED_OUTSIDE, CALIBRATED_OUTSIDE_SAMPLED, CALIBRATED_OUTSIDE_MEAN} <= set(
        doc["within_goal"]
    )
