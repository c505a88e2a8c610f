"""One simulated vLLM server: continuous batching, chunked prefill, a paged KV cache, recompute preemption.

Per-request state lives in a shared :class:`RequestTable` (one row per trace request). An instance runs
*segments*:

- an **iteration** (one engine step) whenever prefill work is scheduled: chunks of prompts batched with
  one token for every decoding sequence;
- a **decode run** (many steps at once) when only decoding sequences are scheduled: the batch is constant
  until its first completion, the KV cache filling up, or new work arriving. New work arriving mid-run
  truncates the run at the end of the step in progress (vLLM admits new requests at step boundaries).

Decoding sequences are not touched per step. The instance counts its decode steps (``step``); a sequence
remembers the step it joined at, so its KV length is ``ctx_at_join + step - join`` and it finishes at step
``join + target - gen_at_join`` (a heap gives the first). The batch's summed KV length grows by the batch
size per step, and which sequences need a new KV block at a step follows from a histogram of
``(ctx_at_join - join) mod block_size``. A decode step's time is affine in the summed KV length for a fixed
batch (true of the Vidur-composed model: attention costs ``a + b·batch + c·context``), so a run's step
times are ``a + slope·k``: one latency call prices a run of any length (the slope per KV token is
measured once per batch size), and end times, the steps done by a given time and the inter-token-latency
histogram are closed forms.

Scheduling follows vLLM's: running sequences first (one token per decoding sequence, then prefill chunks
within ``max_num_batched_tokens``), then admission from the waiting queue in (priority, arrival) order while
``max_num_seqs`` and KV blocks allow, strictly FCFS within a priority class (a head that does not fit blocks
the ones behind it). When a decode step needs a KV block and none is free, the running sequence with the
lowest priority and latest arrival is preempted by recompute: its KV is freed and it waits again, needing a
prefill of its prompt plus the tokens it had generated.

Token accounting (a request of ``target = max(output_tokens, 1)`` tokens): a prefill yields one token, each
decode step one more, so KV length = prompt + generated - 1 while decoding. Except on a ``prefill`` instance:
its token is not the client's (the P/D proxy drops it; see :mod:`serving.sim.engine`), so the request joins
the decode instance with KV = prompt and 0 tokens, its first decode step yields token 1 and it decodes
``target`` steps there (KV length = prompt + generated). Its KV blocks stay allocated on the prefill instance
(:attr:`Instance.held`) until a decode instance admits it (:attr:`Instance.pulled` tells the simulator).

Wake-up (the latency model's ``wake_up_ms`` after ``idle_after_s``; absent or 0 for the GPU profiles): the
first segment an instance starts after at least ``idle_after_s`` with nothing to run (an empty queue; an
instance is idle from its creation) starts ``wake_up_ms`` later, so that delay adds to the
TTFT of the requests it serves and to no ITL.

Decode stalls (the latency model's ``decode_stall_fraction`` p and ``decode_stall_ms`` S; absent or 0 for the GPU
profiles): a fraction p of an instance's decode steps cost S ms more (the engine-timed tail of the real cpu-tiny
server's decode steps). Which steps is a fixed pattern per instance, drawn once from ``decode_stall_seed`` and the
instance's index (Bernoulli(p) over ``STALL_PATTERN_STEPS`` steps, repeating), so a replay is deterministic. A
decode run's time stays a closed form: its affine step times plus S times the pattern's stalled steps in the
run's range (a prefix sum), the steps done by a time are a binary search over that, and the ITL histogram moves
the stalled steps' samples up by S (one Python operation per stalled step, none per token). Iterations that
prefill are not stalled (their time is the step model's).

Deferred first tokens (the latency model's ``first_token_deferred_fraction`` q; absent or 0 for the GPU profiles):
the real cpu-tiny server's API process, sharing 2 cores with the engine that goes on decoding, often delivers a
multi-token request's first token only with the rest of its answer (bench_vllm_cpu.py ``--probe-idle-factors``:
an idle request's client TTFT is ~30 ms at ``max_tokens=1`` and ~115 ms at 32). So for a fixed, deterministic
fraction q of the requests of more than one output token (a hash of the request index) the first token reaches
the client when the request completes: TTFT = e2e and the request's mean ITL is 0, as the client measures them.
The engine's own schedule, the ITL histogram and the token counters are unchanged, and so is the exported TTFT
histogram: it is the server's view (vLLM records a first token when its API process takes it from the engine,
before streaming it), observed at the engine's first token (session 6; until then it took the client's time).

The server's view of time (session 8): the exported TTFT and e2e histograms count from vLLM's own arrival stamp
(:attr:`RequestTable.stamp`), as vLLM 0.32 does: ``arrival_time`` is stamped when the API server renders the
prompt (``renderers/base.py``, after the HTTP request is parsed, before tokenising and the hand-off to the
engine core) and ``first_token_latency`` / ``e2e_latency`` are taken when its output processor handles the
engine's output (``IterationStats`` in ``v1/metrics/stats.py``, before detokenising and streaming). The
latency model's request overhead and admission delay are measured from the client (client time less engine
time; the API server late to take a request in and to stream its first token) and straddle that window: the
model's ``request_overhead_outside_fraction`` and ``admission_outside_fraction`` (0-1, default 0) say which
share of each lies before the stamp, so the exported TTFT = the client's TTFT − those shares (for a first
token not deferred). The wake-up and decode stalls are the engine's and lie inside; a deferred first token
counts at the engine's first token. The client's figures (``t_first_s``, ``t_done_s``) count from the
arrival. With the shares 0 (the GPU profiles, which have none of these terms, and every shipped profile) the
stamp is the arrival and both views agree, as before.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from typing import Protocol

import numpy as np

from serving.sim.interference import Interference
from serving.sim.latency import OperatorLatencyModel
from serving.sim.samples import E2E_BUCKETS_S, ITL_BUCKETS_S, TTFT_BUCKETS_S

# Longest decode run priced at once; a run stops earlier at its first completion or a full KV cache.
DECODE_RUN_MAX_STEPS = 4096
# Length of an instance's seeded stall pattern (decode steps; repeats after that): see the module doc.
STALL_PATTERN_STEPS = 8192


class LatencyLike(Protocol):
    """The latency model the simulator needs (serving/sim/latency.py implements it)."""

    def iteration_ms(
        self,
        prefill_tokens: int,
        prefill_context_tokens: int,
        decode_batch: int,
        decode_context_tokens: int,
        *,
        prefill_seqs: int = 1,
    ) -> float: ...


class ProfileLike(Protocol):
    """The hardware-profile fields the simulator reads (serving/sim/hardware.py's HardwareProfile)."""

    @property
    def gpus(self) -> int: ...
    @property
    def kv_bytes_per_token(self) -> int: ...
    @property
    def kv_capacity_tokens(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def max_num_seqs(self) -> int: ...
    @property
    def max_num_batched_tokens(self) -> int: ...
    @property
    def cold_start_s(self) -> float: ...
    @property
    def standby_activation_s(self) -> float: ...
    @property
    def kv_transfer_gbps(self) -> float: ...
    @property
    def kv_transfer_latency_ms(self) -> float: ...


class RequestTable:
    """State of every request of every pool (row = request id, arrival order within a pool).

    Hot scalar state is kept in Python lists (cheap to index one at a time); ``ctx`` and ``gen`` of a
    request that is decoding are as of the step it joined its instance's batch (see the module doc).
    """

    def __init__(
        self,
        arrival_s: np.ndarray,
        prompt_tokens: np.ndarray,
        output_tokens: np.ndarray,
        priority: np.ndarray,
        pool: np.ndarray,
    ) -> None:
        n = len(arrival_s)
        self.n = n
        self.arrival_s = np.asarray(arrival_s, dtype=np.float64)
        self.pool = np.asarray(pool, dtype=np.int64)
        # A prefill always processes at least one token and yields one token.
        self.prompt_arr = np.maximum(np.asarray(prompt_tokens, dtype=np.int64), 1)
        self.target_arr = np.maximum(np.asarray(output_tokens, dtype=np.int64), 1)
        self.arrival: list[float] = self.arrival_s.tolist()
        # vLLM's own arrival stamp (the API server renders the prompt: ``arrival_time`` in vLLM 0.32's
        # ``renderers/base.py``), from which its TTFT and e2e histograms count: the arrival plus the shares of
        # the request overhead and admission delay outside that window (the simulator adds them,
        # :mod:`serving.sim.engine`). Equal to the arrival where those shares are 0 (the default).
        self.stamp: list[float] = list(self.arrival)
        self.prompt: list[int] = self.prompt_arr.tolist()
        self.target: list[int] = self.target_arr.tolist()
        self.priority: list[int] = np.asarray(priority, dtype=np.int64).tolist()
        self.ctx: list[int] = [0] * n  # KV tokens held on the current instance
        self.gen: list[int] = [0] * n  # tokens generated so far (streamed to the client)
        self.prefill_left: list[int] = list(self.prompt)  # tokens still to prefill here
        self.join: list[int] = [0] * n  # decode step of the instance when the request joined its batch
        self.join_seq: list[int] = [0] * n  # which joining that was (tells stale finish-heap entries apart)
        self.pool_of: list[int] = self.pool.tolist()
        self.prompt_counted: list[bool] = [False] * n
        # the TTFT histogram has the request (once, at the engine's first token; a re-prefill after a
        # preemption, or a deferred first token reaching the client later, is not observed again)
        self.ttft_observed: list[bool] = [False] * n
        # the entry role's router counters (requests, prompt and predicted output tokens) have counted it: a
        # request routed again after its instance failed is the same offered load, counted once
        self.entry_counted: list[bool] = [False] * n
        # index of the prefill instance still holding the request's KV until a decode instance admits it
        # (-1: none); see Instance.held
        self.kv_src: list[int] = [-1] * n
        # the output length the router was told (the oracle target unless the simulator has a predictor)
        self.predicted: list[float] = [float(t) for t in self.target]
        self.promoted: list[bool] = [False] * n  # tail promotion done (once per request)
        self.where: list[int] = [-1] * n  # index of the instance it was last queued at (-1: none yet)
        # the client's first-token and completion times (NaN: not yet), preemptions and completions (must end
        # at exactly 1 per request): written once per request, as lists; read as arrays (the properties below)
        self.first_s: list[float] = [math.nan] * n
        self.done_s: list[float] = [math.nan] * n
        self.preempted: list[int] = [0] * n
        self.completed: list[int] = [0] * n

    @property
    def t_first_s(self) -> np.ndarray:
        """The client's first-token time per request (NaN: none yet); a new array."""
        return np.array(self.first_s, dtype=np.float64)

    @property
    def t_done_s(self) -> np.ndarray:
        """Completion time per request (NaN: not completed); a new array."""
        return np.array(self.done_s, dtype=np.float64)

    @property
    def preemptions(self) -> np.ndarray:
        """Times each request was preempted; a new array."""
        return np.array(self.preempted, dtype=np.int64)

    @property
    def completions(self) -> np.ndarray:
        """Times each request completed (1 when done, 0 before); a new array."""
        return np.array(self.completed, dtype=np.int64)

    def reset_for_recompute(self, rid: int) -> None:
        """The request lost its KV: it must prefill its prompt plus all but the last generated token."""
        self.ctx[rid] = 0
        self.prefill_left[rid] = self.prompt[rid] + max(self.gen[rid] - 1, 0)


class Histogram:
    """Per-bucket (non-cumulative) counts with Prometheus ``le`` semantics; the last bucket is +Inf."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value_s: float, weight: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value_s)] += weight
        self.sum += value_s * weight

    def observe_linear(self, first_s: float, slope_s: float, steps: int, weight: int) -> None:
        """Observe ``first_s + slope_s·k`` for k in [0, steps), each ``weight`` times (``slope_s >= 0``)."""
        if steps <= 0 or weight <= 0:
            return
        last_s = first_s + slope_s * (steps - 1)
        bounds = self.bounds
        lo = bisect_left(bounds, first_s)
        self.sum += weight * (first_s * steps + slope_s * steps * (steps - 1) / 2.0)
        # last_s >= first_s > bounds[lo - 1]: in bucket lo too when last_s <= bounds[lo] (the usual case)
        if lo == len(bounds) or last_s <= bounds[lo]:
            self.counts[lo] += weight * steps
            return
        hi = bisect_left(bounds, last_s)
        below = 0  # observations <= bounds[b]
        for b in range(lo, hi):
            upto = min(math.floor((self.bounds[b] - first_s) / slope_s) + 1, steps)
            self.counts[b] += weight * (upto - below)
            below = upto
        self.counts[hi] += weight * (steps - below)


class SegmentResult:
    """What finishing a segment produced, for the simulator to act on."""

    __slots__ = ("completed", "handoff")

    def __init__(self) -> None:
        self.completed: list[int] = []  # requests that generated their last token here
        self.handoff: list[int] = []  # prefill role: requests whose prefill finished (KV to move)


class Instance:
    """A vLLM server of one role in one pool, with its lifecycle state and exported metrics."""

    def __init__(
        self,
        index: int,
        instance_id: str,
        pool_index: int,
        pool: str,
        role: str,
        node: str,
        profile: ProfileLike,
        latency: LatencyLike,
        marked: bool,
        now_s: float,
        *,
        kv_capacity_tokens: int | None = None,
        slowdown: float = 1.0,
        interference: Interference | None = None,
    ) -> None:
        self.index = index
        self.instance_id = instance_id
        self.pool_index = pool_index
        self.pool = pool
        self.role = role
        self.node = node
        self.profile = profile
        self.latency = latency
        self.marked = marked
        self.gpus = int(profile.gpus)
        self.block_size = int(profile.block_size)
        kv_tokens = int(profile.kv_capacity_tokens) if kv_capacity_tokens is None else kv_capacity_tokens
        self.total_blocks = kv_tokens // self.block_size
        # PD-mixed node: the other instance of the node, and the factor this one's steps slow down by while
        # that one is busy (only decode instances are slowed; see PoolSpec.mixed_node_slowdown)
        self.sibling: Instance | None = None
        self.slowdown = slowdown
        self.interference = interference  # set: the slowdown is derived per decode run (overrides slowdown)
        self.max_seqs = int(profile.max_num_seqs)
        self.max_batched = int(profile.max_num_batched_tokens)
        # lifecycle
        self.state = "provisioning"
        self.dest = "active"  # provisioning: state once ready; draining: "standby" or "gone"
        self.t_alloc_s = now_s
        self.t_release_s = math.nan
        self.version = 0  # bumps invalidate pending segment/lifecycle events
        # batching
        self.load = 0  # requests held: waiting + running (what a least-loaded router compares)
        self.admitting = 0  # requests on their way in (the admission delay), counted in load too
        self.waiting: list[tuple[int, int]] = []  # heap of (priority, request id)
        self.prefilling: list[int] = []
        self.decoding: dict[int, None] = {}  # ordered set of decoding request ids
        self.step = 0  # decode steps executed so far
        self._finish: list[tuple[int, int, int]] = []  # heap of (finish step, rid, join sequence number)
        self._joins = 0
        self._ctx_offset_sum = 0  # sum over decoding of (ctx_at_join - join)
        self._phase = [0] * self.block_size  # histogram of (ctx_at_join - join) mod block_size
        self.used_blocks = 0
        # prefill role: KV blocks kept for requests handed off, until the decode instance admits them
        # (request id -> blocks, part of used_blocks)
        self.held: dict[int, int] = {}
        # decode role: requests admitted with KV from a prefill instance since the simulator last looked
        # (it frees their blocks there)
        self.pulled: list[int] = []
        # decode role: requests in the segment in progress whose first step yields their first token (at
        # _fresh_t_s, the end of that step); _seg_fresh: how many the segment started with (for the ITL)
        self._fresh: list[int] = []
        self._fresh_t_s = math.nan
        self._seg_fresh = 0
        # wake-up after an idle spell (module doc): when the instance last ran out of work (NaN: working)
        self._wake_s = float(getattr(latency, "wake_up_ms", 0.0)) / 1000.0
        self._idle_after_s = float(getattr(latency, "idle_after_s", math.inf))
        self._idle_since_s = now_s  # created idle (initial instances: loaded and warmed up at t=0)
        # decode stalls (module doc): S in ms (0: off), the pattern's stalled positions and prefix counts
        self._stall_ms = float(getattr(latency, "decode_stall_ms", 0.0) or 0.0)
        stall_p = float(getattr(latency, "decode_stall_fraction", 0.0) or 0.0)
        self._stall_at: list[int] = []
        self._stall_cum: list[int] = [0]
        if self._stall_ms > 0.0 and stall_p > 0.0:
            seed = int(getattr(latency, "decode_stall_seed", 0) or 0)
            bits = np.random.default_rng([seed, index]).random(STALL_PATTERN_STEPS) < stall_p
            self._stall_at = np.flatnonzero(bits).tolist()
            self._stall_cum = np.concatenate([[0], np.cumsum(bits)]).astype(np.int64).tolist()
        else:
            self._stall_ms = 0.0
        # deferred first tokens (module doc): the fraction as a threshold on a 32-bit hash of the request index
        q = float(getattr(latency, "first_token_deferred_fraction", 0.0) or 0.0)
        self._defer_below = int(min(max(q, 0.0), 1.0) * 2**32)
        # the segment in progress
        self.busy = False
        self.seg_start_s = 0.0
        self.seg_end_s = math.nan
        self._run = False  # True: a decode run; False: one iteration
        self._run_steps = 0
        self._run_batch = 0
        self._run_first_ms = 0.0
        self._run_slope_ms = 0.0
        # Decode-step ms per KV token for each batch size (the model is affine in context, see module doc)
        self._ms_per_ctx: dict[int, float] = {}
        # a decode step's ms, (batch, context) -> iteration_ms(0, 0, batch, context): the operator model's
        # unchecked path (the same float) when it is that model itself, else through iteration_ms
        self._decode_ms = latency.decode_ms if type(latency) is OperatorLatencyModel else self._decode_step_ms
        self._it_chunks: list[tuple[int, int]] = []
        self._it_decode = 0
        self._it_ms = 0.0
        # metrics
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.preemptions_total = 0
        self.success_total = 0
        self.router_requests_total = 0
        self.router_prompt_tokens_total = 0  # entry role: prompt tokens of the requests routed here
        self.handoffs_total = 0  # prefill role: KV handoffs (each also sampled one discarded token)
        self.tail_promotions_total = 0  # requests waiting here moved to the front (TailPolicy)
        self.standby_promotions_total = 0  # times this instance left standby for a tail request
        # tail requests this instance was promoted for (moved here when it is active)
        self.tail_rids: list[int] = []
        self.predicted_output_tokens_total = 0.0  # entry role: predicted outputs of the requests routed here
        self.ttft = Histogram(TTFT_BUCKETS_S)
        self.itl = Histogram(ITL_BUCKETS_S)
        self.e2e = Histogram(E2E_BUCKETS_S)

    # -- what the router and the exporter see ------------------------------------------------------
    @property
    def running(self) -> int:
        return len(self.decoding) + len(self.prefilling)

    @property
    def empty(self) -> bool:
        return not (self.decoding or self.prefilling or self.waiting or self.held)

    def kv_usage(self, now_s: float) -> float:
        """Fraction of KV blocks in use at ``now_s`` (a decode run's blocks counted as its steps finish)."""
        used = self.used_blocks
        if self.busy and self._run:
            used += self._new_blocks(self.step, self._steps_done(now_s))
        return used / self.total_blocks if self.total_blocks else 0.0

    def generation_tokens(self, now_s: float) -> int:
        """Counter value at ``now_s``, crediting the steps of a decode run already finished by then."""
        if self.busy and self._run:
            return self.generation_tokens_total + self._run_batch * self._steps_done(now_s)
        return self.generation_tokens_total

    def ctx_now(self, rid: int, req: RequestTable) -> int:
        """KV tokens ``rid`` holds here (committed steps only)."""
        if rid in self.decoding:
            return req.ctx[rid] + self.step - req.join[rid]
        return req.ctx[rid]

    def young_decoding(self, req: RequestTable, now_s: float, tokens: float) -> int:
        """Decoding sequences that have generated fewer than ``tokens`` tokens by ``now_s`` (the steps of a
        decode run in progress done by then included). O(batch): called once per arrival, and only for a
        latency model keyed on the streams' age."""
        done = self._steps_done(now_s) if self.busy and self._run else 0
        base = self.step + done
        gen, join = req.gen, req.join
        return sum(1 for rid in self.decoding if gen[rid] + base - join[rid] < tokens)

    # -- decode-run arithmetic ---------------------------------------------------------------------------
    def _stalls_before(self, n: int) -> int:
        """Stalled steps among the instance's decode steps [0, n) (the pattern repeats)."""
        q, r = divmod(n, STALL_PATTERN_STEPS)
        return q * self._stall_cum[STALL_PATTERN_STEPS] + self._stall_cum[r]

    def _run_ms(self, steps: int) -> float:
        ms = self._run_first_ms * steps + self._run_slope_ms * steps * (steps - 1) / 2.0
        if self._stall_ms:
            ms += self._stall_ms * (self._stalls_before(self.step + steps) - self._stalls_before(self.step))
        return ms

    def _stalled_in_run(self, s0: int, k: int) -> list[int]:
        """Offsets j in [0, k) of the stalled steps among decode steps s0 + j."""
        out: list[int] = []
        at, n = self._stall_at, STALL_PATTERN_STEPS
        base = (s0 // n) * n
        while base < s0 + k:
            lo = bisect_left(at, max(s0 - base, 0))
            hi = bisect_left(at, min(s0 + k - base, n))
            out += [base + p - s0 for p in at[lo:hi]]
            base += n
        return out

    def _steps_done(self, now_s: float) -> int:
        """Steps of the current run finished at or before ``now_s``."""
        x = (now_s - self.seg_start_s) * 1000.0
        k = self._run_steps
        if x <= 0.0:
            return 0
        if self._stall_ms:  # _run_ms(0) = 0 <= x < _run_ms(k): bisect (a stall breaks the closed form)
            if x >= self._run_ms(k):
                return k
            lo, hi = 0, k
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if self._run_ms(mid) <= x:
                    lo = mid
                else:
                    hi = mid
            return lo
        # no stalls: _run_ms(j) = a·j + s·j·(j - 1)/2, written inline (the same floats)
        a, s = self._run_first_ms, self._run_slope_ms
        if x >= a * k + s * k * (k - 1) / 2.0:
            return k
        if s <= 1e-12:
            j = int(x // a) if a > 0 else k
        else:
            b = a - s / 2.0
            j = int((-b + math.sqrt(b * b + 2.0 * s * x)) / s)
        j = min(max(j, 0), k)
        while j > 0 and a * j + s * j * (j - 1) / 2.0 > x:
            j -= 1
        while j < k and a * (j + 1) + s * (j + 1) * j / 2.0 <= x:
            j += 1
        return j

    def _new_blocks(self, first_step: int, steps: int) -> int:
        """KV blocks the decoding batch allocates over ``steps`` steps from ``first_step``."""
        bs = self.block_size
        full, rem = divmod(steps, bs)
        total = len(self.decoding) * full
        if rem > 0:
            # steps k = first_step + full·bs + j (j < rem) take phase[(-k) % bs]: the indices run down from
            # hi = (-first_step) % bs, one per step, wrapping below 0 to bs - 1 (at most two slices)
            phase = self._phase
            hi = (-first_step) % bs
            lo = hi - rem + 1
            if lo >= 0:
                total += sum(phase[lo : hi + 1])
            else:
                total += sum(phase[: hi + 1]) + sum(phase[lo + bs :])
        return total

    def _steps_that_fit(self, steps: int, free_blocks: int) -> int:
        """Most steps (<= ``steps``) whose new KV blocks fit in ``free_blocks``."""
        n, bs = len(self.decoding), self.block_size
        if n * (steps // bs + 1) <= free_blocks:
            return steps
        # every sequence takes exactly one new block per block_size steps: skip whole cycles that surely fit
        cycles = min(steps // bs, max(free_blocks // n - 1, 0))
        k, used, phase = cycles * bs, cycles * n, self._phase
        while k < steps:
            used += phase[(-(self.step + k)) % bs]
            if used > free_blocks:
                return k
            k += 1
        return steps

    def _join_decode(self, rid: int, req: RequestTable) -> None:
        step = self.step
        joins = self._joins = self._joins + 1
        req.join[rid] = step
        req.join_seq[rid] = joins
        offset = req.ctx[rid] - step
        self._ctx_offset_sum += offset
        self._phase[offset % self.block_size] += 1
        self.decoding[rid] = None
        heapq.heappush(self._finish, (step + req.target[rid] - req.gen[rid], rid, joins))

    def _leave_decode(self, rid: int, req: RequestTable) -> None:
        """Remove from the batch and write back its KV length and token count."""
        del self.decoding[rid]
        offset = req.ctx[rid] - req.join[rid]
        self._ctx_offset_sum -= offset
        self._phase[offset % self.block_size] -= 1
        steps = self.step - req.join[rid]
        req.ctx[rid] += steps
        req.gen[rid] += steps

    def _first_finish_step(self, req: RequestTable) -> int:
        heap = self._finish
        while heap:
            step, rid, seq = heap[0]
            if rid in self.decoding and req.join_seq[rid] == seq:
                return step
            heapq.heappop(heap)
        raise AssertionError(f"{self.instance_id}: decoding batch without a finish step")

    # -- work in -------------------------------------------------------------------------------------
    def enqueue(self, rid: int, priority: int, now_s: float, *, routed: bool = True) -> bool:
        """Queue a request; True when a decode run in progress was cut short (its end time moved).
        ``routed=False``: moved here from another instance's queue (not a new routing: not counted)."""
        heapq.heappush(self.waiting, (priority, rid))
        if routed:
            self.router_requests_total += 1
        self.load += 1
        return self.interrupt(now_s) if self.busy and self._run else False

    def promote_waiting(self, rid: int, priority: int) -> bool:
        """Give a waiting request a new priority (re-queued by it); False when it is not waiting here."""
        if not self.take_waiting(rid):
            return False
        heapq.heappush(self.waiting, (priority, rid))
        self.load += 1
        return True

    def take_waiting(self, rid: int) -> bool:
        """Remove ``rid`` from the waiting queue (not yet scheduled); False when it is not waiting here."""
        for k, (_, r) in enumerate(self.waiting):
            if r == rid:
                last = self.waiting.pop()
                if k < len(self.waiting):
                    self.waiting[k] = last
                    heapq.heapify(self.waiting)
                self.load -= 1
                return True
        return False

    def interrupt(self, now_s: float) -> bool:
        """End a decode run in progress at its current step boundary, so that the next segment is planned
        afresh; True when the run's end time moved."""
        if not (self.busy and self._run):
            return False
        keep = self._steps_done(now_s) + 1
        if keep >= self._run_steps:
            return False
        self._run_steps = keep
        self.seg_end_s = self.seg_start_s + self._run_ms(keep) / 1000.0
        return True

    def release_held(self, rid: int) -> None:
        """A decode instance has pulled ``rid``'s KV: free the blocks kept for it here."""
        self.used_blocks -= self.held.pop(rid)

    def drop_held(self) -> list[int]:
        """On failure: the requests whose KV was kept here for a pull (it is lost with the instance)."""
        rids = list(self.held)
        for rid in rids:
            self.release_held(rid)
        return rids

    def evict_all(self, now_s: float, req: RequestTable) -> list[int]:
        """On failure: every request queued or running here (not those in :attr:`held`, see
        :meth:`drop_held`). Decode steps finished by ``now_s`` are kept (their tokens reached the client);
        the step or iteration in progress is lost, and with it a first token not yet produced."""
        if self.busy and self._run:
            done = self._steps_done(now_s)
            if done < self._run_steps:  # the run's end event, if due, has been processed already
                self._commit_steps(done)
                if done > 0:
                    self._flush_first_tokens(req)
        self._fresh = []  # the first step was not finished: no first token reached the client
        decoding = list(self.decoding)
        for rid in decoding:
            self._leave_decode(rid, req)
        rids = [rid for _, rid in self.waiting] + self.prefilling + decoding
        self.waiting, self.prefilling, self.decoding, self._finish = [], [], {}, []
        self.used_blocks = 0
        self.load = 0
        self.admitting = 0  # those on their way in are re-routed when their delay ends (Simulator._on_admit)
        self.busy = False
        self.version += 1
        for rid in rids:
            req.reset_for_recompute(rid)
        return rids

    # -- scheduling ----------------------------------------------------------------------------------
    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _preempt_one(self, req: RequestTable) -> None:
        running = [*self.decoding, *self.prefilling]
        victim = max(running, key=lambda r: (req.priority[r], r))
        if victim in self.decoding:
            self._leave_decode(victim, req)
        else:
            self.prefilling.remove(victim)
        self.used_blocks -= self._blocks(req.ctx[victim])
        req.reset_for_recompute(victim)
        req.preempted[victim] += 1
        self.preemptions_total += 1
        heapq.heappush(self.waiting, (req.priority[victim], victim))

    def _factor(self, batch: int, context_tokens: float) -> float:
        sibling = self.sibling
        if sibling is None or not sibling.busy or self.role != "decode":
            return 1.0
        if self.interference is None:
            return self.slowdown
        # the sibling's iteration in progress: its prompt tokens (a decode run there counts as one token each)
        prefill = sum(c for _, c in sibling._it_chunks) if not sibling._run else sibling._run_batch
        return self.interference.slowdown(batch, context_tokens, prefill)

    def _step_need(self) -> int:
        return self._phase[(-self.step) % self.block_size] if self.decoding else 0

    def schedule(self, now_s: float, req: RequestTable) -> float | None:
        """Plan the next segment from ``now_s``; its end time, or None when there is nothing to run."""
        # Runs once per segment: the request table's columns and the queues are bound to locals, and block
        # counts are ceil(tokens / block_size) written inline (as _blocks).
        if not (self.decoding or self.prefilling or self.waiting):  # nothing to run (the loop's last case)
            self.busy = False
            if math.isnan(self._idle_since_s):
                self._idle_since_s = now_s
            return None
        bs = self.block_size
        total_blocks = self.total_blocks
        phase = self._phase
        decoding, prefilling, waiting = self.decoding, self.prefilling, self.waiting
        r_ctx, r_left, r_first = req.ctx, req.prefill_left, req.first_s
        heappop = heapq.heappop
        while True:
            need = phase[(-self.step) % bs] if decoding else 0
            while decoding and self.used_blocks + need > total_blocks:
                self._preempt_one(req)
                need = phase[(-self.step) % bs] if decoding else 0
            free = total_blocks - self.used_blocks - need
            budget = self.max_batched - len(decoding)
            chunks: list[tuple[int, int]] = []
            for rid in prefilling:
                if budget <= 0:
                    break
                ctx = r_ctx[rid]
                chunk = r_left[rid]
                if budget < chunk:
                    chunk = budget
                nb = -(-(ctx + chunk) // bs) - -(-ctx // bs)
                if nb > free:
                    break
                free -= nb
                budget -= chunk
                chunks.append((rid, chunk))
            n_running = len(decoding) + len(prefilling)
            max_seqs = self.max_seqs
            while waiting and budget > 0 and n_running < max_seqs:
                rid = waiting[0][1]
                ctx = r_ctx[rid]
                left = r_left[rid]
                if left == 0:  # KV arrived from a prefill instance: joins the decode batch
                    base = -(-ctx // bs)
                    step_block = 1 if ctx % bs == 0 else 0
                    if base + step_block > free:
                        break
                    heappop(waiting)
                    free -= base + step_block
                    need += step_block
                    self.used_blocks += base
                    budget -= 1
                    self._join_decode(rid, req)
                    if req.kv_src[rid] >= 0:
                        self.pulled.append(rid)
                    if r_first[rid] != r_first[rid]:  # NaN: no first token yet
                        self._fresh.append(rid)
                else:
                    chunk = left if left < budget else budget
                    nb = -(-(ctx + chunk) // bs) - -(-ctx // bs)
                    if nb > free:
                        break
                    heappop(waiting)
                    free -= nb
                    budget -= chunk
                    prefilling.append(rid)
                    chunks.append((rid, chunk))
                n_running += 1
            if chunks:
                return self._start_iteration(now_s, req, chunks, need)
            if decoding:
                return self._start_decode_run(now_s, req)
            if not prefilling:
                self.busy = False
                if not waiting and math.isnan(self._idle_since_s):
                    self._idle_since_s = now_s
                return None
            # Partial prefills hold every free block and nothing decodes: free room by preemption.
            self._preempt_one(req)

    def _wake_up(self, now_s: float) -> float:
        """When the segment starting at ``now_s`` can start: later by the wake-up cost after an idle spell."""
        idle_since, self._idle_since_s = self._idle_since_s, math.nan
        if self._wake_s > 0.0 and now_s - idle_since >= self._idle_after_s:
            return now_s + self._wake_s
        return now_s

    def _start_iteration(
        self, now_s: float, req: RequestTable, chunks: list[tuple[int, int]], need: int
    ) -> float:
        if self._wake_s > 0.0:
            now_s = self._wake_up(now_s)
        else:
            self._idle_since_s = math.nan
        n_dec = len(self.decoding)
        prefill_tokens = 0
        prefill_ctx = 0
        bs = self.block_size
        r_ctx = req.ctx
        blocks = 0
        for rid, chunk in chunks:
            ctx = r_ctx[rid]
            prefill_tokens += chunk
            prefill_ctx += ctx
            blocks += -(-(ctx + chunk) // bs) - -(-ctx // bs)  # _blocks(ctx + chunk) - _blocks(ctx)
        self.used_blocks += blocks + need
        decode_ctx = self._ctx_offset_sum + n_dec * self.step
        dt_ms = float(
            self.latency.iteration_ms(
                prefill_tokens, prefill_ctx, n_dec, decode_ctx, prefill_seqs=len(chunks)
            )
        )
        self._it_chunks = chunks
        self._it_decode = n_dec
        self._it_ms = dt_ms
        self._run = False
        self.busy = True
        self.seg_start_s = now_s
        self.seg_end_s = now_s + dt_ms / 1000.0
        self._seg_fresh = len(self._fresh)
        self._fresh_t_s = self.seg_end_s
        return self.seg_end_s

    def _decode_step_ms(self, batch: int, context_tokens: int) -> float:
        return float(self.latency.iteration_ms(0, 0, batch, context_tokens))

    def _start_decode_run(self, now_s: float, req: RequestTable) -> float:
        if self._wake_s > 0.0:
            now_s = self._wake_up(now_s)
        else:
            self._idle_since_s = math.nan
        n = len(self.decoding)
        step = self.step
        # the first finish step: the heap's head when it is current, else _first_finish_step pops stale ones
        head = self._finish[0] if self._finish else (0, -1, 0)
        if head[1] in self.decoding and req.join_seq[head[1]] == head[2]:
            steps = head[0] - step
        else:
            steps = self._first_finish_step(req) - step
        if steps > DECODE_RUN_MAX_STEPS:
            steps = DECODE_RUN_MAX_STEPS
        free = self.total_blocks - self.used_blocks
        if n * (steps // self.block_size + 1) > free:  # else every step's new blocks surely fit
            steps = self._steps_that_fit(steps, free)
        if steps < 1:
            steps = 1
        ctx0 = self._ctx_offset_sum + n * step
        first = self._decode_ms(n, ctx0)
        per_ctx = self._ms_per_ctx.get(n)
        if per_ctx is None:
            far = float(self.latency.iteration_ms(0, 0, n, ctx0 + n * 1024))
            per_ctx = self._ms_per_ctx[n] = max((far - first) / (n * 1024), 0.0)
        factor = 1.0 if self.sibling is None else self._factor(n, ctx0)
        first *= factor
        slope = per_ctx * n * factor
        self._run = True
        self._run_steps = steps
        self._run_batch = n
        self._run_first_ms = first
        self._run_slope_ms = slope
        self.busy = True
        self.seg_start_s = now_s
        if self._stall_ms:
            self.seg_end_s = now_s + self._run_ms(steps) / 1000.0
            self._fresh_t_s = now_s + self._run_ms(1) / 1000.0
        else:  # _run_ms(steps) without stalls, inline
            self.seg_end_s = now_s + (first * steps + slope * steps * (steps - 1) / 2.0) / 1000.0
            self._fresh_t_s = now_s + first / 1000.0
        self._seg_fresh = len(self._fresh)
        return self.seg_end_s

    # -- finishing a segment -------------------------------------------------------------------------
    def finish_segment(self, now_s: float, req: RequestTable) -> SegmentResult:
        """Apply the segment that ends at ``now_s``; the caller then calls :meth:`schedule` again."""
        self.busy = False
        out = SegmentResult()
        if self._run:
            self._commit_steps(self._run_steps)
            if self._fresh:
                self._flush_first_tokens(req)
            self._complete_decoded(now_s, req, out)
            return out
        if self._it_decode:
            self.step += 1
            self.generation_tokens_total += self._it_decode
            self.itl.observe(self._it_ms / 1000.0, self._it_decode - self._seg_fresh)
            if self._fresh:
                self._flush_first_tokens(req)
            self._complete_decoded(now_s, req, out)
        self._finish_chunks(now_s, req, out)
        return out

    def _commit_steps(self, k: int) -> None:
        """Account the first ``k`` steps of the current decode run."""
        s0 = self.step
        self.used_blocks += self._new_blocks(s0, k)
        self.step = s0 + k
        batch = self._run_batch
        self.generation_tokens_total += batch * k
        first_s, slope_s = self._run_first_ms / 1000.0, self._run_slope_ms / 1000.0
        # a request's first token is no inter-token gap: step 0 is not an ITL sample for the fresh ones
        fresh = self._seg_fresh if k > 0 else 0
        itl = self.itl
        if fresh:
            itl.observe_linear(first_s, slope_s, 1, batch - fresh)
            itl.observe_linear(first_s + slope_s, slope_s, k - 1, batch)
        else:
            itl.observe_linear(first_s, slope_s, k, batch)
        if self._stall_ms and k > 0:  # the stalled steps' samples move up by the stall
            stall_s = self._stall_ms / 1000.0
            for j in self._stalled_in_run(s0, k):
                weight = self._run_batch - fresh if j == 0 else self._run_batch
                value = first_s + slope_s * j
                self.itl.observe(value, -weight)
                self.itl.observe(value + stall_s, weight)

    def settle(self, now_s: float, req: RequestTable) -> None:
        """Deliver the first tokens of the segment in progress if its first step has ended by ``now_s``
        (a decode run is priced whole; this credits its first step on time for a scrape or a report)."""
        if self._fresh and now_s >= self._fresh_t_s:
            self._flush_first_tokens(req)

    def _flush_first_tokens(self, req: RequestTable) -> None:
        """The segment's first step has ended: its fresh requests' first tokens reach the client."""
        for rid in self._fresh:
            self._first_token(rid, self._fresh_t_s, req)
        self._fresh = []

    def _complete(self, rid: int, now_s: float, req: RequestTable, out: SegmentResult) -> None:
        if self._defer_below:
            self._first_token(rid, now_s, req, final=True)  # a deferred first token, if any
        req.done_s[rid] = now_s
        req.completed[rid] += 1
        self.success_total += 1
        self.load -= 1
        self.e2e.observe(now_s - req.stamp[rid])  # the server's view: from vLLM's arrival stamp
        out.completed.append(rid)

    def _complete_decoded(self, now_s: float, req: RequestTable, out: SegmentResult) -> None:
        heap = self._finish
        step, decoding, join_seq, bs = self.step, self.decoding, req.join_seq, self.block_size
        while heap and heap[0][0] <= step:
            _, rid, seq = heapq.heappop(heap)
            if rid not in decoding or join_seq[rid] != seq:
                continue
            self._leave_decode(rid, req)
            self.used_blocks -= -(-req.ctx[rid] // bs)  # _blocks
            self._complete(rid, now_s, req, out)

    def _first_token(self, rid: int, now_s: float, req: RequestTable, *, final: bool = False) -> None:
        """``final``: the request's last token (a deferred first token is delivered with it)."""
        if not req.ttft_observed[rid]:  # the server's histogram: the engine's first token, deferred or not,
            req.ttft_observed[rid] = True  # from vLLM's arrival stamp (RequestTable.stamp)
            self.ttft.observe(now_s - req.stamp[rid])
        if (
            self._defer_below
            and not final
            and req.target[rid] > 1
            and (rid * 2654435761 + 97) % 2**32 < self._defer_below
        ):
            return  # the client gets it with the request's last token (module doc)
        if math.isnan(req.first_s[rid]):
            req.first_s[rid] = now_s

    def _finish_chunks(self, now_s: float, req: RequestTable, out: SegmentResult) -> None:
        r_ctx, r_left = req.ctx, req.prefill_left
        for rid, chunk in self._it_chunks:
            r_ctx[rid] += chunk
            left = r_left[rid] = r_left[rid] - chunk
            if left > 0:
                continue
            self.prefilling.remove(rid)
            self.generation_tokens_total += 1
            if not req.prompt_counted[rid]:
                req.prompt_counted[rid] = True
                self.prompt_tokens_total += req.prompt[rid]
            if self.role == "prefill":
                # The proxy sent max_tokens=1 here and drops this token; the decode instance samples the
                # client's tokens. The KV stays here until a decode instance admits the request (pulls it).
                self.load -= 1
                self.held[rid] = self._blocks(req.ctx[rid])
                req.kv_src[rid] = self.index
                self.handoffs_total += 1
                out.handoff.append(rid)
                continue
            req.gen[rid] += 1
            if req.gen[rid] >= req.target[rid]:
                self._first_token(rid, now_s, req)
                self.used_blocks -= self._blocks(req.ctx[rid])
                self._complete(rid, now_s, req, out)
            else:
                self._first_token(rid, now_s, req)
                self._join_decode(rid, req)
        self._it_chunks = []
