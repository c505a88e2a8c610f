"""The burst reserve's incremental tick (``controller.policy.reserve_fast``): its order statistics against
sorting, the tick that opens a block against the numpy path over every block, and the inputs it must refuse
(-0.0, marks changed under the kept rows). The long runs through gaps, pauses and restarts are
tests/controller/test_policy_lead_peaks.py's. Compared with ``==`` on floats: no tolerance."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.policy import reserve_fast, stages
from controller.policy.types import LeadPeaks

BLOCK = stages.NEED_BLOCK_S
VALUES = st.lists(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_subnormal=False), max_size=30
)


@settings(max_examples=300, deadline=None)
@given(VALUES, VALUES, st.data())
def test_at_rank_is_the_merged_sort(s: list[float], t: list[float], data: st.DataObject) -> None:
    merged = sorted(s + t)
    if not merged:
        return
    r = data.draw(st.integers(0, len(merged) - 1))
    assert reserve_fast.at_rank(sorted(s), sorted(t), r) == merged[r]


def _blocks(n: int, seed: int) -> tuple[tuple[float, float, float, int], ...]:
    """``n`` consecutive blocks with a burst every 13 and an idle block every 7 (needs 0.0)."""
    return tuple(
        (1_000.0 + i * BLOCK, 0.0 if i % 7 == 3 else 2.0 + (9.0 if (i + seed) % 13 < 2 else 0.0) + i % 3,
         1.0 + (i * seed) % 5 * 0.25, 5)
        for i in range(n)
    )  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(
    st.integers(30, 200),
    st.integers(0, 12),
    st.sampled_from([10.0, 60.0, 120.0]),
    st.sampled_from([0.5, 0.9, 1.0]),
    st.sampled_from([None, 0.99]),
    st.sampled_from([0.0, 0.3]),
    st.lists(st.sampled_from([1.5, math.inf]), max_size=8),
)
def test_each_new_block_gives_what_the_numpy_path_gives(
    n: int, seed: int, lead_s: float, q: float, pq: float | None, h: float, factors: list[float]
) -> None:
    """Blocks opened one at a time, the kept peaks (and their cache) carried: every tick takes the fast path
    once the cache exists, and gives the reserve and the kept rows of the numpy path over every block."""
    blocks = _blocks(n, seed)
    marks = tuple((blocks[3 + 5 * k][0], f) for k, f in enumerate(factors) if 3 + 5 * k < n)
    final = LeadPeaks()
    for k in range(20, n + 1):
        view, on = blocks[:k], tuple(x for x in marks if x[0] <= blocks[k - 1][0])
        fast = reserve_fast.kept_reserve(view, lead_s, q, h, pq, final, on, BLOCK)
        assert (fast is not None) == bool(final.ordered)  # taken on every tick after the cache is built
        got, final = stages.burst_reserve_kept(view, lead_s, q, h, pq, final, on)
        want, plain = stages.burst_reserve_kept(view, lead_s, q, h, pq, LeadPeaks(), on)
        assert got == want
        assert (final.lead_s, final.rows) == (plain.lead_s, plain.rows)
    assert final.ordered  # a cache from the first tick on (an empty one before any block is final)


def test_negative_zero_need_takes_the_numpy_path() -> None:
    """-0.0 compares equal to 0.0, so the two sort in either order: a newest block with it is refused."""
    blocks = _blocks(40, 1)
    _, final = stages.burst_reserve_kept(blocks[:-1], 20.0, 0.9, 0.3)
    assert final.ordered  # the cache was built
    assert reserve_fast.kept_reserve(blocks, 20.0, 0.9, 0.3, None, final, (), BLOCK) is not None
    signed = (*blocks[:-1], (blocks[-1][0], -0.0, blocks[-1][2], 1))
    assert reserve_fast.kept_reserve(signed, 20.0, 0.9, 0.3, None, final, (), BLOCK) is None
    # and a cache is not built over final rows holding it
    zeros = tuple((t, -0.0 if i == 2 else p, d, c) for i, (t, p, d, c) in enumerate(blocks))
    assert not stages.burst_reserve_kept(zeros, 20.0, 0.9, 0.3)[1].ordered


def test_other_marks_headroom_or_lead_take_the_numpy_path() -> None:
    blocks = _blocks(40, 2)
    _, final = stages.burst_reserve_kept(blocks[:-1], 20.0, 0.9, 0.3)
    marked = ((blocks[5][0], math.inf),)  # a kept row's block marked after its rise was kept
    assert reserve_fast.kept_reserve(blocks, 20.0, 0.9, 0.3, None, final, marked, BLOCK) is None
    assert stages.burst_reserve_kept(
        blocks, 20.0, 0.9, 0.3, None, final, marked
    ) == stages.burst_reserve_kept(blocks, 20.0, 0.9, 0.3, None, LeadPeaks(), marked)
    assert reserve_fast.kept_reserve(blocks, 20.0, 0.9, 0.0, None, final, (), BLOCK) is None
    assert reserve_fast.kept_reserve(blocks, 25.0, 0.9, 0.3, None, final, (), BLOCK) is None
    unordered = ((blocks[-1][0], 2.0), (blocks[-2][0], 2.0))
    assert reserve_fast.kept_reserve(blocks, 20.0, 0.9, 0.3, None, final, unordered, BLOCK) is None


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([1.0, 5.0, 5.0, 5.0, 7.5, 30.0, 1e-9]),
            st.floats(min_value=0.0, max_value=50.0),
            st.sampled_from([0.0, 1.0, 2.5, 50.0]),
        ),
        min_size=1,
        max_size=40,
    ),
    st.integers(1, 30),
    st.sampled_from([4.999, 5.0, 20.0, 60.0, 120.0]),
)
def test_the_newest_peaks_are_the_windows_most(
    rows: list[tuple[float, float, float]], m: int, lead_s: float
) -> None:
    """_newest_peaks (a running most over the suffix of windows that reach the newest block, a slice before
    it) against its definition: the most of the next ``m`` blocks within the lead, -inf where none is, with
    gaps and ties."""
    t, now = [], 1000.0
    for step, _, _ in rows:
        now += step
        t.append(now)
    v0, v1 = [r[1] for r in rows], [r[2] for r in rows]
    lead = lead_s + 1e-9
    got = reserve_fast._newest_peaks(t, v0, v1, m, lead)
    for v, p in zip((v0, v1), got, strict=True):
        want = []
        for i in range(len(t)):
            inside = [v[j] for j in range(i + 1, min(i + m, len(t) - 1) + 1) if not t[j] - t[i] > lead]
            want.append(max(inside) if inside else -math.inf)
        assert p == want


@settings(max_examples=40, deadline=None)
@given(
    st.integers(30, 160),
    st.integers(0, 12),
    st.sampled_from([10.0, 60.0, 120.0]),
    st.sampled_from([0.0, 0.3]),
    st.lists(st.sampled_from([1.5, math.inf]), max_size=8),
)
def test_the_moved_cache_is_the_cache_built_anew(
    n: int, seed: int, lead_s: float, h: float, factors: list[float]
) -> None:
    """The cache the fast path moves on block by block (sorted rises and peaks as float64 bytes, rises,
    marks) is byte for byte the one the numpy path builds over every block."""
    blocks = _blocks(n, seed)
    marks = tuple((blocks[3 + 5 * k][0], f) for k, f in enumerate(factors) if 3 + 5 * k < n)
    final = LeadPeaks()
    for k in range(20, n + 1):
        view, on = blocks[:k], tuple(x for x in marks if x[0] <= blocks[k - 1][0])
        _, final = stages.burst_reserve_kept(view, lead_s, 0.9, h, None, final, on)
        _, plain = stages.burst_reserve_kept(view, lead_s, 0.9, h, None, LeadPeaks(), on)
        assert (final.rows, final.rises, final.ordered, final.marks) == (
            plain.rows,
            plain.rises,
            plain.ordered,
            plain.marks,
        )
