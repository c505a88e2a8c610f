"""The burst reserve's tick that opens a need block, in work proportional to what changed.

``stages.burst_reserve_kept`` keeps the lead peaks of the blocks no later block can change
(``LeadPeaks.rows``); this module keeps, beside them, those blocks' rises (``LeadPeaks.rises``) and, per role,
their rises and peaks in sorted order (``LeadPeaks.ordered``). The tick that opens a block then computes the
peaks and rises of the newest blocks only (about ``lead_s / NEED_BLOCK_S`` of them, Python floats), takes the
quantiles' order statistics from the sorted final values and the sorted newest ones by bisection, and updates
the sorted values by the blocks that left the window and the blocks that became final: no pass over the window.

Bit-identical to the numpy path: every rise and peak is the same IEEE operation on the same floats (a max is
exact; ``peak - (1 + headroom) * factor * need`` in the same order), the order statistics of a set do not
depend on how it is sorted as long as no two values compare equal without being the same float, and the
quantiles' interpolation is ``stages``' own. The two floats that break that (NaN, and -0.0 beside 0.0) are
refused: a need that is not finite or is -0.0 among the newest blocks sends the tick to the numpy path, and
a cache is built only for final values free of them (``cache``). Anything that does not line up (another lead
or headroom, blocks out of order, marks out of order) returns None: the caller takes the numpy path."""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from array import array
from collections.abc import Sequence

import numpy as np

from controller.policy.types import LeadPeaks

Blocks = tuple[tuple[float, float, float, int], ...]
Reserve = tuple[tuple[float, float], tuple[float, float]]
_INF = math.inf


def quantile_rank(n: int, q: float) -> tuple[int, int, float]:
    """The order statistics (lo, hi) of ``n`` sorted values and the weight ``gamma`` numpy's 'linear'
    ``np.quantile`` interpolates them with, as it computes them."""
    if not 0.0 <= q <= 1.0:
        raise ValueError("Quantiles must be in the range [0, 1]")
    at = (n - 1) * q
    if at >= n - 1:  # numpy takes the last element, and its gamma from index -1
        return n - 1, n - 1, at + 1.0
    lo = math.floor(at)
    return lo, lo + 1, at - lo


def lerp(a: float, b: float, gamma: float) -> float:
    """numpy's two-sided lerp between the order statistics ``a`` <= ``b``."""
    diff = b - a
    return b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma


def _split(s: Sequence[float], t: Sequence[float], r: int) -> int:
    """How many of ``t``'s values are among the ``r + 1`` smallest of sorted ``s`` and ``t`` together: the
    first split j whose ``s`` part ends at or below ``t[j]``, found by bisection."""
    ns, nt = len(s), len(t)
    lo, hi = max(0, r + 1 - ns), min(nt, r + 1)
    while lo < hi:  # "s[r - j] <= t[j]" is false, then true, as j grows
        j = (lo + hi) // 2
        if r - j < 0 or s[r - j] <= t[j]:
            hi = j
        else:
            lo = j + 1
    return lo


def _at_split(s: Sequence[float], t: Sequence[float], i: int, j: int) -> float:
    """The largest of ``s[:i]`` and ``t[:j]`` (i + j >= 1)."""
    if i == 0:
        return t[j - 1]
    if j == 0:
        return s[i - 1]
    return max(s[i - 1], t[j - 1])


def at_rank(s: Sequence[float], t: Sequence[float], r: int) -> float:
    """``sorted([*s, *t])[r]`` for sorted ``s`` and ``t`` without merging them (``_split``)."""
    j = _split(s, t, r)
    return _at_split(s, t, r + 1 - j, j)


def _quantile(s: Sequence[float], t: Sequence[float], q: float) -> float:
    """numpy's 'linear' quantile of sorted ``s`` and ``t`` together. Its upper order statistic, one rank
    above the lower, is the smaller of the two values after the lower's split: one bisection, not two."""
    lo, hi, gamma = quantile_rank(len(s) + len(t), q)
    j = _split(s, t, lo)
    i = lo + 1 - j
    a = _at_split(s, t, i, j)
    if hi == lo:
        return lerp(a, a, gamma)
    b = min(s[i] if i < len(s) else _INF, t[j] if j < len(t) else _INF)
    return lerp(a, b, gamma)


def _rises(peak: Sequence[float], v: Sequence[float], h: float, factors: list[float]) -> list[float]:
    """``stages._rises`` with marks, on floats: max(peak − h × factor × need, 0) (max keeps the first of a
    tie, as numpy's maximum), 0 where the factor is not finite."""
    out = []
    for p, f, x in zip(peak, factors, v, strict=True):
        r = p - h * f * x
        out.append((r if not r < 0.0 else 0.0) if math.isfinite(f) else 0.0)
    return out


def _has_negative_zero(values: Sequence[float]) -> bool:
    return 0.0 in values and any(x == 0.0 and math.copysign(1.0, x) < 0 for x in values)


def _marks_on(
    projected: tuple[tuple[float, float], ...], marks: list[float], first: float, last: float
) -> tuple[tuple[float, float], ...]:
    """The marks (``projected``, starts ``marks`` in order) on blocks starting in [first, last]."""
    return projected[bisect.bisect_left(marks, first) : bisect.bisect_right(marks, last)]


def _factors(
    starts: Sequence[float], projected: tuple[tuple[float, float], ...], marks: list[float]
) -> list[float]:
    """``stages._trend_factors`` for ``starts`` (marks' starts ``marks`` in order): the factor of the first
    mark at each start, 1.0 where none is."""
    out = []
    for t in starts:
        at = bisect.bisect_left(marks, t)
        out.append(projected[at][1] if at < len(marks) and marks[at] == t else 1.0)
    return out


def doubles(values: bytes) -> array[float]:
    """Sorted float64 bytes (``LeadPeaks.ordered``, ``BlockMedian.totals``) as an array to bisect, insert into and delete from."""
    out = array("d")
    out.frombytes(values)
    return out


def _newest_peaks(
    t: Sequence[float], v0: Sequence[float], v1: Sequence[float], m: int, lead: float
) -> tuple[list[float], list[float]]:
    """Each newest block's lead peak per role: the most need of the blocks after it, at most ``m`` of them,
    starting within ``lead`` of it (-inf where there is none). The blocks whose window reaches the newest
    block by count and by time are a suffix (starts increase, and ``t[-1] - t[i]`` falls as ``t[i]`` rises:
    correctly rounded subtraction is monotone), and their peak is the running most from the newest back
    (replaced only by a larger need: the first of a tie, as ``max``); only the blocks before that suffix
    (those becoming final, about one) test the window's end and take a slice."""
    size = len(t)
    p0, p1 = [-_INF] * size, [-_INF] * size
    last = size - 1
    i = 0
    while i < last and not (i + m >= last and not t[last] - t[i] > lead):
        e = i + m if i + m < last else last
        while e > i and t[e] - t[i] > lead:  # the blocks within the lead are a prefix of the next m
            e -= 1
        if e > i:
            p0[i], p1[i] = max(v0[i + 1 : e + 1]), max(v1[i + 1 : e + 1])
        i += 1
    most0 = most1 = -_INF
    for k in range(last - 1, i - 1, -1):
        x, y = v0[k + 1], v1[k + 1]
        if x > most0:
            most0 = x
        if y > most1:
            most1 = y
        p0[k], p1[k] = most0, most1
    return p0, p1


def kept_reserve(
    blocks: Blocks,
    lead_s: float,
    quantile: float,
    headroom: float,
    peak_quantile: float | None,
    final: LeadPeaks,
    projected: tuple[tuple[float, float], ...],
    block_s: float,
) -> tuple[Reserve, LeadPeaks] | None:
    """``stages.burst_reserve_kept``'s result from ``final``'s cache, or None where it does not apply
    (``block_s``: the need blocks' length, ``stages.NEED_BLOCK_S``)."""
    if not final.ordered or final.lead_s != lead_s or final.headroom != headroom or len(blocks) < 2:
        return None
    rows, rises = memoryview(final.rows).cast("d"), memoryview(final.rises).cast("d")
    nrows, n = len(rows) // 5, len(blocks)
    if len(rises) != 2 * nrows:
        return None
    d = 0  # rows of blocks that left the window (their starts are before the oldest block's)
    while d < nrows and rows[5 * d] < blocks[0][0]:
        d += 1
    c = nrows - d
    # the last kept row's start (-inf with none: a cache built before any block was final)
    last = rows[5 * (nrows - 1)] if nrows else -_INF
    if nrows and not (0 < c < n and rows[5 * d] == blocks[0][0] and last == blocks[c - 1][0]):
        return None
    t, v0, v1, _ = zip(*blocks[c:], strict=True)
    if not (t[0] > last and all(map(operator.lt, t, t[1:]))):
        return None  # (a NaN start fails too)
    if not math.isfinite(sum(v0) + sum(v1)) or _has_negative_zero(v0) or _has_negative_zero(v1):
        return None
    marks = [x[0] for x in projected]
    if marks != sorted(marks):
        return None  # numpy's search of unordered marks is not bisection's
    if (
        _marks_on(projected, marks, blocks[0][0], last)
        != final.marks[bisect.bisect_left([x[0] for x in final.marks], blocks[0][0]) :]
    ):
        return None  # the final rows' rises were computed with other marks
    m = max(math.ceil(lead_s / block_s), 1)
    lead = lead_s + 1e-9
    size = len(t)
    p0, p1 = _newest_peaks(t, v0, v1, m, lead)
    h = 1 + headroom
    if projected:
        factors = _factors(t, projected, marks)
        r0, r1 = _rises(p0, v0, h, factors), _rises(p1, v1, h, factors)
    else:  # stages._rises without marks: peak − (1 + headroom) × need
        r0 = [0.0 if (r := p - h * x) < 0.0 else r for p, x in zip(p0, v0, strict=True)]
        r1 = [0.0 if (r := p - h * x) < 0.0 else r for p, x in zip(p1, v1, strict=True)]
    if math.isnan(sum(r0) + sum(r1)):  # (inf × 0 in an absurd factor): NaN sorts apart from numpy's order
        return None
    ok = [p > -_INF for p in p0]
    ordered = [doubles(x) for x in final.ordered]  # rises prefill, rises decode, peaks prefill, peaks decode
    for k in range(d):  # the blocks that left the window leave the sorted values
        if rows[5 * k + 3] > -_INF:
            for lst, x in zip(
                ordered, (rises[2 * k], rises[2 * k + 1], rows[5 * k + 3], rows[5 * k + 4]), strict=True
            ):
                at = bisect.bisect_left(lst, x)
                if at == len(lst) or lst[at] != x:
                    return None  # the cache does not hold this row: not built from these rows
                del lst[at]
    if not ordered[0] and not any(ok):
        reserve: Reserve = ((math.nan, math.nan), (math.nan, math.nan))
    else:
        news = [sorted(itertools.compress(x, ok)) for x in (r0, r1, p0, p1)]
        pq = quantile if peak_quantile is None else peak_quantile
        rise = (_quantile(ordered[0], news[0], quantile), _quantile(ordered[1], news[1], quantile))
        peak = (_quantile(ordered[2], news[2], pq), _quantile(ordered[3], news[3], pq))
        reserve = (rise, peak)
    # blocks whose window no longer reaches the open block, by count or by time (stages._final_peaks)
    beyond = 0
    while beyond < size and t[-1] - t[beyond] > lead:
        beyond += 1
    f = max(n - 1 - m - c, beyond, 0)
    for i in range(f):
        if p0[i] > -_INF:
            for lst, x in zip(ordered, (r0[i], r1[i], p0[i], p1[i]), strict=True):
                bisect.insort(lst, x)
    new_rows = array("d", [x for i in range(f) for x in (t[i], v0[i], v1[i], p0[i], p1[i])]).tobytes()
    new_rises = array(
        "d", [x for i in range(f) for x in ((r0[i], r1[i]) if p0[i] > -_INF else (math.nan,) * 2)]
    )
    rows_out = final.rows[40 * d :] + new_rows
    out = LeadPeaks(
        lead_s,
        rows_out,
        headroom,
        final.rises[16 * d :] + new_rises.tobytes(),
        tuple(x.tobytes() for x in ordered),
        _marks_on(projected, marks, blocks[0][0], t[f - 1] if f else last),
    )
    return reserve, out


def cache(
    final: LeadPeaks,
    t: np.ndarray,
    v: np.ndarray,
    peak: np.ndarray,
    rise: np.ndarray,
    headroom: float,
    projected: tuple[tuple[float, float], ...],
) -> LeadPeaks:
    """``final`` (its rows the first blocks of ``t``, the starts, ``v``, the needs [role, block], and ``peak``,
    their lead peaks) with the cache ``kept_reserve`` reads: the rows' rises (``rise`` [role, block], as the
    reserve computed them with ``headroom`` and the marks ``projected``) and the sorted rises and peaks of
    those whose peak is finite. None is built (the numpy path stays) where a final value is NaN, +inf or -0.0,
    the marks are out of order; with no rows, an empty one."""
    f = len(final.rows) // 40
    marks = [x[0] for x in projected]
    if marks != sorted(marks) or not math.isfinite(headroom):
        return final
    if f == 0:  # no block final yet: an empty cache, the newest blocks are all there is
        return LeadPeaks(final.lead_s, b"", headroom, b"", (b"", b"", b"", b""), ())
    vf, pf, rf = v[:, :f], peak[:, :f], rise[:, :f]
    finite = np.isfinite(pf[0])
    if not (finite == np.isfinite(pf[1])).all() or not np.isfinite(vf).all():
        return final
    if ((pf == np.inf) | np.isnan(pf)).any() or not np.isfinite(rf[:, finite]).all():
        return final
    values = np.concatenate([vf.ravel(), pf[:, finite].ravel(), rf[:, finite].ravel()])
    if bool((np.signbit(values) & (values == 0)).any()):
        return final
    rises = np.where(finite, rf, np.nan).T.copy()
    ordered = tuple(np.sort(x[finite]).tobytes() for x in (rf[0], rf[1], pf[0], pf[1]))
    on = _marks_on(projected, marks, float(t[0]), float(t[f - 1]))
    return LeadPeaks(final.lead_s, final.rows, headroom, rises.tobytes(), ordered, on)
