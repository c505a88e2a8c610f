"""forecaster.inference: the torch-free network step agrees with the torch model, streaming and windowed.

Tolerance: both compute in float32 from the same float32 weights, but with different kernels (summation order
in the products, torch's own sigmoid/tanh/erf), so each value differs by a few float32 ulps (eps 1.2e-7) per
operation. Through the LSTM layers, a recurrence over up to 40 steps, attention and the heads, torch float32
and this float32 step stayed within 2.5e-7 and 5.0e-7 of the torch model run in float64
(bench/bench_numpy_agreement.py: 40 random configurations × 40 steps), so they differ by at most ~7.5e-7 on the
O(1) normalised outputs. ``ATOL = 5e-6`` keeps a 6× margin over that (300 drawn examples passed), far below
anything a forecast could notice (a normalised unit is one target standard deviation of log1p totals), and
still fails a tanh-approximated GELU; the float64 step is within 1.5e-8 of that reference (checked at 1e-6). Totals
are ``expm1`` of the normalised outputs, so they agree to a relative ``ATOL`` times the target's scale.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from forecaster.checkpoint import CheckpointError, load_checkpoint, read_checkpoint, save_checkpoint
from forecaster.features import DEFAULT_SCHEMA, Normalizer, encode_inputs
from forecaster.inference import (
    DEFAULT_BLOCK,
    DEFAULT_SMALL_N,
    NUMBA_ENV,
    NumpyLearnedForecaster,
    NumpyNet,
)
from forecaster.netconfig import NetConfig, parameter_shapes
from forecaster.network import LstmAttentionNet
from forecaster.streaming import LearnedForecaster
from forecaster.types import CHANNELS, TARGETS

ATOL = 5e-6
T0_S = 1.7e9
FIELDS = (
    "arrivals_p50",
    "arrivals_p90",
    "prompt_tokens_p50",
    "prompt_tokens_p90",
    "gen_tokens_p50",
    "gen_tokens_p90",
    "burst_prob",
)


def _config(window: int, layers: int, heads: int, skip: bool, quantiles: tuple[float, ...]) -> NetConfig:
    base = {}
    if skip:  # the baseline skip on the three rate inputs; the last one without a mask column
        base = {
            "baseline_halflives": (2.0, 7.5),
            "baseline_inputs": (0, 1, 2),
            "baseline_masks": (10, 11, -1),
        }
    return NetConfig(
        DEFAULT_SCHEMA.n_inputs, hidden=4 * heads, layers=layers, heads=heads, window=window,
        quantiles=quantiles, **base,  # type: ignore[arg-type]
    )  # fmt: skip


def _net(cfg: NetConfig, seed: int) -> LstmAttentionNet:
    torch.manual_seed(seed)
    net = LstmAttentionNet.from_config(cfg)
    if cfg.baseline_halflives:  # away from the initial 1/J weights, so the skip's arithmetic shows
        with torch.no_grad():
            net.baseline_weight.normal_()
            net.baseline_bias.normal_()
    return net.eval()


def _numpy(
    net: LstmAttentionNet,
    layout: tuple[int, int] = (DEFAULT_BLOCK, DEFAULT_SMALL_N),
    kernel: str = "numpy",
    dtype: type[np.floating[Any]] = np.float32,
) -> NumpyNet:
    block, small_n = layout
    weights = {k: v.numpy() for k, v in net.state_dict().items()}
    return NumpyNet(weights, net.config, block=block, small_n=small_n, kernel=kernel, dtype=dtype)


# (block, small_n): the default; blocks of 2 (several blocks, the last padded when N is odd) and of 3 (the
# node-major rings up to one node)
LAYOUTS = st.sampled_from([(DEFAULT_BLOCK, DEFAULT_SMALL_N), (2, 0), (3, 1)])
# the pure-numpy step and the compiled kernels (forecaster/kernels.py), whenever numba is installed
KERNEL_NAMES = ["numpy", "numba"] if importlib.util.find_spec("numba") else ["numpy"]
KERNELS = st.sampled_from(KERNEL_NAMES)


@pytest.mark.parametrize("skip", [False, True], ids=["plain", "baseline-skip"])
@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("quantiles", [(0.5,), (0.1, 0.5, 0.9)])
def test_parameter_shapes_are_the_torch_state_dict(
    skip: bool, layers: int, quantiles: tuple[float, ...]
) -> None:
    cfg = _config(5, layers, 2, skip, quantiles)
    net = LstmAttentionNet.from_config(cfg)
    assert parameter_shapes(cfg) == {k: tuple(v.shape) for k, v in net.state_dict().items()}


@settings(max_examples=25, deadline=None)
@given(
    window=st.integers(1, 8),
    t=st.integers(1, 40),
    layers=st.integers(1, 2),
    heads=st.sampled_from([1, 2, 4]),
    skip=st.booleans(),
    n=st.integers(1, 5),
    seed=st.integers(0, 2**16),
    layout=LAYOUTS,
    kernel=KERNELS,
)
def test_numpy_step_equals_the_windowed_forward_and_torch_streaming(
    window: int,
    t: int,
    layers: int,
    heads: int,
    skip: bool,
    n: int,
    seed: int,
    layout: tuple[int, int],
    kernel: str,
) -> None:
    net = _net(_config(window, layers, heads, skip, (0.5, 0.9)), seed)
    z = np.random.default_rng(seed).standard_normal((n, t, DEFAULT_SCHEMA.n_inputs)).astype(np.float32)
    z[..., 10:20] = z[..., 10:20] > 0  # the mask channels are 0/1
    with torch.no_grad():
        full = net(torch.from_numpy(z))  # the windowed (training) forward
    stream = LearnedForecaster(net, DEFAULT_SCHEMA, Normalizer.identity(), 5.0, "t")
    stream.reset([str(i) for i in range(n)])
    npn = _numpy(net, layout, kernel)
    state = npn.new_state(n)
    for i in range(t):
        q, logit = npn.step(state, z[:, i], i)
        torch_step = stream.step_encoded(torch.from_numpy(z[:, i]))
        for want in (full.quantiles[:, i], torch_step.quantiles):
            np.testing.assert_allclose(q, want.numpy(), atol=ATOL, rtol=0, err_msg=f"t={i}")
        for want in (full.burst_logit[:, i], torch_step.burst_logit):
            np.testing.assert_allclose(logit, want.numpy(), atol=ATOL, rtol=0, err_msg=f"t={i}")
        assert q.dtype == np.float32


def _raw(rng: np.random.Generator, n: int, t: int, p_missing: float) -> tuple[np.ndarray, np.ndarray]:
    x = rng.gamma(2.0, 5.0, size=(n, t, len(CHANNELS)))
    mask = rng.random(x.shape) > p_missing
    x[~mask] = np.nan
    return x, mask


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    p_missing=st.sampled_from([0.0, 0.3, 0.9]),
    outage=st.tuples(st.integers(0, 30), st.integers(0, 15)),
    churn=st.lists(st.sets(st.sampled_from("abcdef"), min_size=1, max_size=5), min_size=1, max_size=4),
    skip=st.booleans(),
    layout=st.sampled_from([(DEFAULT_BLOCK, DEFAULT_SMALL_N), (2, 2)]),
    kernel=KERNELS,
)
def test_numpy_forecaster_equals_the_torch_forecaster_with_masks_nans_and_node_changes(
    seed: int,
    p_missing: float,
    outage: tuple[int, int],
    churn: list[set[str]],
    skip: bool,
    layout: tuple[int, int],
    kernel: str,
) -> None:
    """Through ``step`` on raw channels: NaN and masked inputs, an outage longer than the window (NaN
    forecasts, the same in both), and the node set changing every 10 steps (``ensure_nodes``; with blocks
    of 2 above 2 nodes, also between the node-major and the blocked layout)."""
    rng = np.random.default_rng(seed)
    cfg = _config(6, 2, 2, skip, (0.5, 0.9))
    net = _net(cfg, seed)
    x, mask = _raw(rng, 6, 40, p_missing)
    start, length = outage
    mask[0, start : start + length] = False  # node "a" goes dark
    x[~mask] = np.nan
    y = rng.gamma(2.0, 50.0, size=(6, 40, len(TARGETS)))
    nz = Normalizer.fit(x, mask, y) if mask.any() else Normalizer.identity()
    ours = NumpyLearnedForecaster(_numpy(net, layout, kernel), DEFAULT_SCHEMA, nz, 5.0, "m")
    ref = LearnedForecaster(net, DEFAULT_SCHEMA, nz, 5.0, "m")
    rows = {nid: i for i, nid in enumerate("abcdef")}
    for i in range(40):
        if i % 10 == 0:
            ids = sorted(churn[(i // 10) % len(churn)])
            ours.ensure_nodes(ids)
            ref.ensure_nodes(ids)
        sel = [rows[nid] for nid in ours.node_ids]
        got, want = ours.step(x[sel, i], mask[sel, i], T0_S + i), ref.step(x[sel, i], mask[sel, i], T0_S + i)
        assert got.node_ids == want.node_ids and got.model_version == want.model_version
        for name in FIELDS:
            a, b = getattr(got, name), getattr(want, name)
            np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=f"{name} t={i}")
            scale = 1.0 if name == "burst_prob" else 1.0 + np.abs(b)  # totals: relative to their size
            np.testing.assert_array_less(
                np.nan_to_num(np.abs(a - b) / scale), 10 * ATOL, err_msg=f"{name} t={i}"
            )


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_float64_compute_from_the_same_weights_agrees_too(kernel: str) -> None:
    net = _net(_config(6, 2, 2, True, (0.5, 0.9)), 7)
    n64 = _numpy(net, kernel=kernel, dtype=np.float64)
    z = np.random.default_rng(7).standard_normal((3, 20, DEFAULT_SCHEMA.n_inputs)).astype(np.float32)
    with torch.no_grad():
        full = net.double()(torch.from_numpy(z).double())  # the torch model in double precision
    state = n64.new_state(3)
    for i in range(20):
        q, logit = n64.step(state, z[:, i], i)
        assert q.dtype == np.float64
        np.testing.assert_allclose(q, full.quantiles[:, i].numpy(), atol=1e-6, rtol=0)
        np.testing.assert_allclose(logit, full.burst_logit[:, i].numpy(), atol=1e-6, rtol=0)


def test_numpy_net_rejects_weights_that_do_not_match() -> None:
    cfg = _config(4, 1, 2, False, (0.5, 0.9))
    weights = {k: v.numpy() for k, v in LstmAttentionNet.from_config(cfg).state_dict().items()}
    weights.pop("burst_head.bias")
    weights["q_proj.weight"] = np.zeros((3, 3), np.float32)
    with pytest.raises(ValueError, match=r"burst_head\.bias: missing.*q_proj\.weight: \(3, 3\) != \(8, 8\)"):
        NumpyNet(weights, cfg)


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
@pytest.mark.parametrize(
    ("n", "block", "small_n", "want"),
    [
        pytest.param(0, 1024, 64, (1, 0, True), id="no-nodes"),
        pytest.param(64, 1024, 64, (1, 64, True), id="small"),
        pytest.param(65, 1024, 64, (1, 65, False), id="one-block"),
        pytest.param(1025, 1024, 64, (2, 513, False), id="two-equal-blocks"),
        pytest.param(10_000, 1024, 64, (10, 1000, False), id="ten-blocks"),
        pytest.param(5, 2, 0, (3, 2, False), id="padded"),
    ],
)
def test_layout_splits_nodes_into_equal_blocks(
    n: int, block: int, small_n: int, want: tuple[int, int, bool], kernel: str
) -> None:
    net = _numpy(_net(_config(4, 1, 2, False, (0.5, 0.9)), 0), (block, small_n), kernel)
    blocks, size, small = net.layout(n)
    # the compiled kernels keep node-major rings in every block
    assert (blocks, size, small) == (*want[:2], want[2] or kernel == "numba")
    assert blocks * size >= n and (n == 0 or (blocks - 1) * size < n)  # less than one block of padding
    state = net.new_state(n)
    assert state.count.shape == (blocks * size,) and not state.count[:n].any()
    assert (state.count[n:] == net.config.window).all()  # padding columns never mask their scores


def _tiny_checkpoint(path: Path) -> None:
    torch.manual_seed(0)
    net = LstmAttentionNet(DEFAULT_SCHEMA.n_inputs, hidden=8, layers=2, heads=2, window=4)
    save_checkpoint(path, net, DEFAULT_SCHEMA, Normalizer.identity(), 5.0, {"rows": 1})


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda p: p.unlink(), id="missing"),
        pytest.param(lambda p: p.write_bytes(p.read_bytes()[:200]), id="truncated"),
        pytest.param(lambda p: p.write_bytes(b"this is not a checkpoint at all"), id="text"),
        pytest.param(None, id="schema-mismatch"),
    ],
)
def test_the_numpy_loader_fails_like_the_torch_loader(tmp_path: Path, damage: object) -> None:
    path = tmp_path / "m.safetensors"
    _tiny_checkpoint(path)
    expect = None
    if damage is None:
        expect = dataclasses.replace(DEFAULT_SCHEMA, step_s=2.0)
    else:
        damage(path)  # type: ignore[operator]
    with pytest.raises(CheckpointError) as torch_err:
        load_checkpoint(path, expect)
    with pytest.raises(CheckpointError) as numpy_err:
        NumpyLearnedForecaster.load(path, expect)
    assert str(numpy_err.value) == str(torch_err.value) and str(path) in str(numpy_err.value)


def test_read_checkpoint_holds_the_torch_weights_as_float32_arrays(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    _tiny_checkpoint(path)
    data, ckpt = read_checkpoint(path), load_checkpoint(path)
    assert data.model_version == ckpt.model_version and data.net_config == ckpt.net_config
    for k, v in ckpt.net.state_dict().items():
        assert data.weights[k].dtype == np.float32
        np.testing.assert_array_equal(data.weights[k], v.numpy())
    x, mask = _raw(np.random.default_rng(1), 2, 12, 0.2)
    z = encode_inputs(x, mask, data.normalizer, T0_S + np.arange(12.0))
    ours = NumpyLearnedForecaster.from_data(data)
    state = ours.net.new_state(2)
    with torch.no_grad():
        full = ckpt.net(torch.from_numpy(z))
    for i in range(12):
        q, _ = ours.net.step(state, z[:, i], i)
        np.testing.assert_allclose(q, full.quantiles[:, i].numpy(), atol=ATOL, rtol=0)


_NO_TORCH = """
import sys
import numpy as np
import controller.cli, controller.daemon, controller.demo, controller.replay_policies
from controller.forecasting import DEFAULT_CHECKPOINT, load_default_forecaster
from forecaster.inference import NumpyLearnedForecaster
from forecaster.types import CHANNELS
fc = load_default_forecaster(DEFAULT_CHECKPOINT, combination="arrivals", burst_detector=True)
inner = fc
while not isinstance(inner, NumpyLearnedForecaster):
    inner = inner.inner
fc.reset(["a", "b"])
out = fc.step(np.full((2, len(CHANNELS)), 3.0), np.ones((2, len(CHANNELS)), bool), 1.7e9)
assert np.isfinite(out.arrivals_p90).all(), out
print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "numba", "llvmlite")))
"""


@pytest.mark.skipif(
    not (Path(__file__).parents[2] / "forecaster" / "checkpoints" / "default.safetensors").exists(),
    reason="no shipped checkpoint",
)
def test_the_controller_runs_the_shipped_checkpoint_without_importing_torch() -> None:
    res = subprocess.run([sys.executable, "-c", _NO_TORCH], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", res.stdout


needs_numba = pytest.mark.skipif("numba" not in KERNEL_NAMES, reason="numba is not installed")


@needs_numba
@settings(max_examples=25, deadline=None)
@given(
    window=st.integers(1, 9),
    t=st.integers(1, 30),
    heads=st.sampled_from([1, 2, 4]),
    n=st.integers(0, 9),
    layout=LAYOUTS,
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**16),
)
def test_compiled_kernels_equal_the_numpy_step_through_ring_wrap_around(
    window: int,
    t: int,
    heads: int,
    n: int,
    layout: tuple[int, int],
    dtype: type[np.floating[Any]],
    seed: int,
) -> None:
    """The numba step (node-major rings in blocks) against the pure-numpy one (blocked feature-major rings
    above ``small_n``) on the same inputs, from empty rings (masked slots) through several wrap-arounds
    (``t`` up to 30 steps over windows of 1–9), for node counts that leave the last block padded or empty,
    both dtypes, including inputs large enough to saturate the gates (exp overflowing to inf)."""
    net = _net(_config(window, 2, heads, seed % 2 == 0, (0.1, 0.5, 0.9)), seed)
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, t, DEFAULT_SCHEMA.n_inputs)) * rng.choice([1.0, 30.0], size=(n, t, 1))
    ref, ours = _numpy(net, layout, "numpy", dtype), _numpy(net, layout, "numba", dtype)
    s_ref, s_ours = ref.new_state(n), ours.new_state(n)
    tol = ATOL if dtype is np.float32 else 1e-9
    # and a few float32 ulps of the value: a quantile of 123 has an ulp of 7.6e-6, above ATOL (found by
    # hypothesis, session 19: the two summation orders differed by one ulp there)
    rel = 4 * float(np.finfo(np.float32).eps) if dtype is np.float32 else 0.0
    for i in range(t):
        q_ref, l_ref = ref.step(s_ref, z[:, i].astype(dtype), i)
        q, logit = ours.step(s_ours, z[:, i].astype(dtype), i)
        assert q.dtype == dtype and q.shape == q_ref.shape
        assert np.isfinite(q).all() and np.isfinite(logit).all()
        np.testing.assert_allclose(q, q_ref, atol=tol, rtol=rel, err_msg=f"t={i}")
        np.testing.assert_allclose(logit, l_ref, atol=tol, rtol=rel, err_msg=f"t={i}")
    k_ref, v_ref = s_ref._ring_nodes(np.arange(n))
    k, v = s_ours._ring_nodes(np.arange(n))
    np.testing.assert_allclose(k, k_ref, atol=tol, rtol=rel)  # the rings hold the same keys and values
    np.testing.assert_allclose(v, v_ref, atol=tol, rtol=rel)


def test_numpy_net_rejects_an_unknown_kernel() -> None:
    with pytest.raises(ValueError, match=r"kernel must be one of \('auto', 'numba', 'numpy'\), got 'cuda'"):
        _numpy(_net(_config(4, 1, 2, False, (0.5, 0.9)), 0), kernel="cuda")


@needs_numba
@pytest.mark.parametrize(("env", "want"), [(None, "auto"), ("1", "auto"), ("0", "numpy"), ("off", "numpy")])
def test_auto_kernel_compiles_above_small_n_follows_the_environment_and_says_which_runs(
    env: str | None, want: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    if env is None:
        monkeypatch.delenv(NUMBA_ENV, raising=False)
    else:
        monkeypatch.setenv(NUMBA_ENV, env)
    with caplog.at_level(logging.INFO, logger="forecaster.inference"):
        net = _numpy(_net(_config(4, 1, 2, False, (0.5, 0.9)), 0), (2, 3), kernel="auto")
        assert net.kernel == want
        assert f"forecaster step: {want}" in caplog.text
        assert not net.new_state(3).compiled  # up to small_n: pure numpy, whatever the kernel
        assert net.new_state(4).compiled == (want == "auto")
    assert ("numba kernels ready" in caplog.text) == (want == "auto")


def test_auto_kernel_falls_back_to_numpy_without_numba(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba → ImportError
    monkeypatch.delitem(sys.modules, "forecaster.kernels", raising=False)
    monkeypatch.delenv(NUMBA_ENV, raising=False)
    net = _net(_config(4, 1, 2, False, (0.5, 0.9)), 0)
    with caplog.at_level(logging.INFO, logger="forecaster.inference"):
        auto = _numpy(net, (2, 1), kernel="auto")
        state = auto.new_state(5)
    assert not state.compiled and auto.kernel == "numpy"
    assert "numba does not import" in caplog.text
    q, _ = auto.step(state, np.zeros((5, DEFAULT_SCHEMA.n_inputs), np.float32), 0)
    assert np.isfinite(q).all()
    with pytest.raises(ImportError, match=r"kernel='numba'\): numba is not usable"):
        _numpy(net, kernel="numba")
