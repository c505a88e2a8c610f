"""Output-length predictor: online and batch agree, it learns buckets and clients, it never peeks."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.workload.outlen import (
    OutlenConfig,
    OutputLengthPredictor,
    prequential,
    prequential_group_mean,
    prompt_bucket,
)


def online(
    p: np.ndarray, y: np.ndarray, m: np.ndarray, c: np.ndarray, cap: np.ndarray, kind: str
) -> np.ndarray:
    pred = OutputLengthPredictor(OutlenConfig(bucket_prior=3.0, client_prior=2.0))
    out = []
    for i in range(len(p)):
        client = None if c[i] < 0 else int(c[i])
        out.append(
            pred.predict(int(p[i]), model=int(m[i]), client=client, max_tokens=float(cap[i]), kind=kind)  # type: ignore[arg-type]
        )
        pred.observe(int(p[i]), int(y[i]), model=int(m[i]), client=client)
    return np.array(out)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.integers(0, 70_000),
            st.integers(0, 4000),
            st.integers(-1, 2),
            st.integers(-1, 3),
            st.one_of(st.just(math.nan), st.integers(0, 600).map(float)),
        ),
        max_size=60,
    ),
    kind=st.sampled_from(["mean", "typical"]),
)
def test_prequential_equals_predict_then_observe(
    rows: list[tuple[int, int, int, int, float]], kind: str
) -> None:
    p, y, m, c, cap = (np.array(col) for col in zip(*rows, strict=True)) if rows else [np.zeros(0)] * 5
    batch = prequential(
        p.astype(np.int64),
        y.astype(np.int64),
        model=m.astype(np.int64),
        client=c.astype(np.int64),
        max_tokens=cap.astype(np.float64),
        config=OutlenConfig(bucket_prior=3.0, client_prior=2.0),
        kind=kind,  # type: ignore[arg-type]
    )
    np.testing.assert_allclose(batch, online(p, y, m, c, cap, kind), rtol=1e-9, atol=1e-9)


def test_nothing_observed_is_unknown_not_zero() -> None:
    assert math.isnan(OutputLengthPredictor().predict(100))
    assert math.isnan(prequential(np.array([5, 6]), np.array([10, 20]))[0])


def test_prediction_never_uses_the_request_own_output() -> None:
    """Changing row i's output changes no prediction up to and including row i."""
    rng = np.random.default_rng(1)
    p, y = rng.integers(1, 4000, 200), rng.integers(1, 900, 200)
    before = prequential(p, y, client=np.arange(200) % 7)
    y2 = y.copy()
    y2[120] = 100_000
    after = prequential(p, y2, client=np.arange(200) % 7)
    np.testing.assert_allclose(before[:121], after[:121], rtol=1e-9)  # cumsum rounding only
    assert np.abs(before[121:] - after[121:]).max() > 10.0


def test_learns_prompt_length_buckets() -> None:
    """Short prompts get short answers, long ones long: the buckets beat the global mean."""
    rng = np.random.default_rng(2)
    p = rng.choice([50, 5000], size=2000)
    y = np.where(p > 1000, 800, 40) + rng.integers(0, 20, 2000)
    pred = prequential(p, y)
    mean = prequential_group_mean(y)
    tail = slice(200, None)
    assert np.abs(pred[tail] - y[tail]).mean() < 0.2 * np.abs(mean[tail] - y[tail]).mean()


def test_learns_clients_in_the_same_bucket() -> None:
    rng = np.random.default_rng(3)
    client = rng.integers(0, 2, 3000)
    y = np.where(client == 1, 600, 60)
    p = np.full(3000, 300)
    with_client = prequential(p, y, client=client)
    without = prequential(p, y)
    tail = slice(300, None)
    assert np.abs(with_client[tail] - y[tail]).mean() < 0.2 * np.abs(without[tail] - y[tail]).mean()
    online_p = OutputLengthPredictor()
    for i in range(3000):
        online_p.observe(300, int(y[i]), client=f"c{client[i]}")
    assert online_p.predict(300, client="c1") > 5 * online_p.predict(300, client="c0")


def test_max_tokens_caps_the_prediction() -> None:
    pred = OutputLengthPredictor()
    for _ in range(10):
        pred.observe(100, 900)
    assert pred.predict(100) == pytest.approx(900.0)
    assert pred.predict(100, max_tokens=64) == 64.0
    assert pred.predict(100, max_tokens=math.nan) == pytest.approx(900.0)


def test_client_table_is_bounded() -> None:
    """Past ``max_clients`` the table is emptied: a known client's adjustment is forgotten."""
    pred = OutputLengthPredictor(OutlenConfig(max_clients=2))
    for _ in range(50):
        pred.observe(10, 10, client="short")
        pred.observe(10, 1000, client="long")
    assert pred.predict(10, client="long") > 1.5 * pred.predict(10)
    pred.observe(10, 10, client="third")  # a third client: the table is emptied first
    assert pred.predict(10, client="long") == pytest.approx(pred.predict(10))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("bucket_log2_width", 0.0, id="width"),
        pytest.param("bucket_prior", -1.0, id="bucket prior"),
        pytest.param("client_prior", 0.0, id="client prior"),
        pytest.param("max_clients", 0, id="max clients"),
    ],
)
def test_config_errors_name_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        OutlenConfig(**{field: value})  # type: ignore[arg-type]


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="kind"):
        OutputLengthPredictor().predict(1, kind="median")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="client has 1 rows"):
        prequential(np.array([1, 2]), np.array([1, 2]), client=np.array([1]))


def test_prompt_bucket_is_log2() -> None:
    assert prompt_bucket(np.array([0, 1, 2, 3, 1023, 1024, -5])).tolist() == [0, 1, 1, 2, 10, 10, 0]
