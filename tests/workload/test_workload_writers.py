"""write_trace then read_trace gives the trace back, to each format's resolution."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.workload.readers import read_trace
from serving.workload.trace import PRIORITY_NORMAL, Trace
from serving.workload.writers import write_trace


@st.composite
def traces(draw: st.DrawFn, with_models: bool) -> Trace:
    n = draw(st.integers(min_value=1, max_value=40))
    gaps = draw(
        st.lists(st.floats(min_value=0, max_value=50, allow_nan=False), min_size=n - 1, max_size=n - 1)
    )
    arrival = np.concatenate(([0.0], np.cumsum(gaps))).astype(np.float64)
    prompt = np.asarray(draw(st.lists(st.integers(0, 200_000), min_size=n, max_size=n)), dtype=np.int64)
    output = np.asarray(draw(st.lists(st.integers(0, 5000), min_size=n, max_size=n)), dtype=np.int64)
    names: tuple[str, ...] = ()
    model = np.full(n, -1, dtype=np.int16)
    if with_models:
        names = ("ChatGPT", "GPT-4", "llama 3 8B")
        model = np.asarray(draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)), dtype=np.int16)
        # keep names in order of first appearance, as a reader assigns codes
        order = list(dict.fromkeys(model.tolist()))
        names = tuple(names[c] for c in order)
        model = np.asarray([order.index(c) for c in model.tolist()], dtype=np.int16)
    start = draw(st.sampled_from([None, pd.Timestamp("2023-11-16 18:17:03.1234567")]))
    return Trace(
        arrival_s=arrival,
        prompt_tokens=prompt,
        output_tokens=output,
        priority=np.full(n, PRIORITY_NORMAL, dtype=np.int8),
        model=model,
        failed=output == 0,
        model_names=names,
        start_time=start,
    )


def roundtrip(trace: Trace, fmt: str) -> Trace:
    with tempfile.TemporaryDirectory() as d:
        path = write_trace(trace, Path(d) / f"t.{fmt}", fmt)
        return read_trace(path)


@settings(max_examples=40, deadline=None)
@given(trace=traces(with_models=False))
def test_azure_roundtrip(trace: Trace) -> None:
    back = roundtrip(trace, "azure")
    ticks = np.round(trace.arrival_s * 1e7)
    assert np.allclose(back.arrival_s, (ticks - ticks[0]) / 1e7, rtol=0, atol=1e-9)
    assert np.array_equal(back.prompt_tokens, trace.prompt_tokens)
    assert np.array_equal(back.output_tokens, trace.output_tokens)
    expected_start = trace.start_time if trace.start_time is not None else pd.Timestamp("2000-01-01")
    assert back.start_time == expected_start


@settings(max_examples=40, deadline=None)
@given(trace=traces(with_models=False), blocks=st.integers(-1, 40))
def test_mooncake_roundtrip(trace: Trace, blocks: int) -> None:
    trace = Trace(**{**trace.__dict__, "extra": {"prefix_blocks": np.full(len(trace), blocks, np.int32)}})
    back = roundtrip(trace, "mooncake")
    ms = np.round(trace.arrival_s * 1000)
    assert np.allclose(back.arrival_s, (ms - ms[0]) / 1000, rtol=0, atol=1e-9)
    assert np.array_equal(back.prompt_tokens, trace.prompt_tokens)
    assert np.array_equal(back.output_tokens, trace.output_tokens)
    assert np.array_equal(back.extra["prefix_blocks"], trace.extra["prefix_blocks"])


@settings(max_examples=40, deadline=None)
@given(trace=traces(with_models=True))
def test_burstgpt_roundtrip(trace: Trace) -> None:
    back = roundtrip(trace, "burstgpt")
    assert np.array_equal(back.arrival_s, trace.arrival_s)  # float seconds survive exactly
    for name in ("prompt_tokens", "output_tokens", "model", "failed"):
        assert np.array_equal(getattr(back, name), getattr(trace, name)), name
    assert back.model_names == trace.model_names


def test_azure_writer_reproduces_the_bundled_file_byte_for_byte(tmp_path: Path) -> None:
    src = (
        Path(__file__).resolve().parents[2]
        / "datasets/azure2023/AzureLLMInferenceTrace_code.dev_before_1850.csv"
    )
    out = write_trace(read_trace(src), tmp_path / "copy.csv", "azure")
    assert out.read_bytes() == src.read_bytes()
