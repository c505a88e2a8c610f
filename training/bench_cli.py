"""``pdscale bench``: benchmarks on the simulator.

The group itself (``pdscale bench --trace ...``, no subcommand) replays every scaling policy side by side
(training/policy_bench.py; issue 7); ``seed-table`` re-runs the seed article's P99 table.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from serving.sim.seed_table import Quantile, SeedTable
    from training.policy_bench import PolicyFigures, TraceBench

bench_app = typer.Typer(
    name="bench",
    rich_markup_mode="rich",
)  # the help is the callback's docstring below


def _fail(message: str, code: int = 2) -> typer.Exit:
    Console(stderr=True).print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code=code)


@bench_app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    trace: Annotated[
        list[Path] | None,
        typer.Option(
            "--trace", "-t", help="Trace file (Azure CSV, Mooncake JSONL, BurstGPT CSV); repeat for several."
        ),
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy",
            "-p",
            help="Policy to run (repeat; default static-peak reactive dynamo-like predictive oracle).",
        ),
    ] = None,
    profile: Annotated[
        str | None, typer.Option(help="Hardware profile MODEL/GPU (default llama3-8b/a100).")
    ] = None,
    slo_ttft_ms: Annotated[float | None, typer.Option(help="TTFT SLO, ms (default 1000).")] = None,
    slo_itl_ms: Annotated[
        float | None, typer.Option(help="Mean inter-token latency SLO, ms (default 50).")
    ] = None,
    duration_s: Annotated[
        float | None, typer.Option(help="Replay only each trace's first DURATION_S seconds.")
    ] = None,
    fmt: Annotated[
        str | None, typer.Option("--format", "-f", help="Force the trace format (azure, mooncake, burstgpt).")
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", help="Controller config (YAML); pools[0].policy configures the predictive policy."
        ),
    ] = None,
    forecaster: Annotated[
        str, typer.Option(help="Predictive policy's forecaster: default (shipped checkpoint) or holt.")
    ] = "default",
    json_out: Annotated[Path | None, typer.Option("--json", help="Write every figure as JSON here.")] = None,
    plots: Annotated[
        Path | None, typer.Option("--plots", help="Write capacity-<trace>.png and ttft-cdf-<trace>.png here.")
    ] = None,
    max_reorder_s: Annotated[
        float,
        typer.Option(
            "--max-reorder-s",
            help="Rows may arrive this many seconds before an earlier row (re-sorted); inf accepts any order.",
        ),
    ] = 1.0,
) -> None:
    """Every scaling policy side by side on the same traces: SLO attainment, latency, GPU cost.

    With no subcommand, replays each --trace through the simulated P/D cluster
    (one pool, --profile, the given SLOs) once per policy:
    [bold]static-peak[/] (sized once for the trace's busiest 60 s), [bold]reactive[/] (HPA-like),
    [bold]dynamo-like[/] (Dynamo planner's SLA mode), [bold]predictive[/] (pdscale),
    [bold]oracle[/] (knows the future, pays the same cold starts: the cost floor).
    With no --trace: the bundled Azure 2023 conversation trace.

    One table per trace: SLO attainment (TTFT and ITL within the SLO;
    unfinished or rejected = miss), TTFT and per-request mean ITL P50/P99, GPU-seconds,
    their ratio to the oracle's ('-' when the oracle did not run), and scale
    events after the starting fleet. Several traces: a last table aggregates
    them (GPU-s summed, SLO weighted by requests, percentiles pooled).

    --config CONTROLLER.yaml benchmarks the predictive policy with that file's
    pools[0].policy (how a pdscale tune result is checked); the file's profile
    and SLOs are not used (give --profile, --slo-ttft-ms, --slo-itl-ms).
    --forecaster holt pins the Holt baseline instead of the shipped checkpoint,
    so runs compare policy logic only.

    --json OUT writes (unknown = null, TRACE = the file's stem):
      traces: {TRACE: {source, format, requests, duration_s, profile,
               slo_ttft_ms, slo_itl_ms, policies: {POLICY: FIGURES}}}
      policies: {POLICY: FIGURES aggregated over the traces}
      settings: {policies, forecaster, tick_s, predictive_policy}
      FIGURES = {error (null unless that replay failed), requests, completed, unfinished, rejected (fit no
                 instance's KV cache: refused, as vLLM does), over_context (served past max_model_len), slo_attainment,
                 ttft_ms: {p50, p90, p99}, itl_ms: {p50, p90, p99},
                 gpu_seconds, gpu_hours, gpu_ratio_to_oracle, scale_events, wall_s}

    --plots DIR writes per trace capacity-TRACE.png (arrivals per 10 s against
    active instances by role, one panel per policy) and ttft-cdf-TRACE.png
    (one TTFT CDF per policy, log x, the SLO as a line).

    A replay that fails (e.g. an SLO the profile cannot meet for the trace's
    prompts) is shown as failed with its reason; the others still run, the
    JSON and plots are still written, and the command exits 1.

    Subcommands work as before: pdscale bench seed-table --help.

    Examples:

      pdscale bench --json bench.json --plots bench-plots

      pdscale bench -t datasets/mooncake/synthetic_trace.jsonl -t other.csv --config tuned.yaml

      pdscale bench --policy predictive --policy oracle --forecaster holt --duration-s 600
    """
    if ctx.invoked_subcommand is not None:
        if trace or policy or json_out or plots or config:
            raise _fail(
                f"bench options go without a subcommand; `pdscale bench {ctx.invoked_subcommand}` takes its own"
            )
        return
    _run_bench(
        trace or [], policy or [], profile, slo_ttft_ms, slo_itl_ms, duration_s, fmt, config, forecaster,
        json_out, plots, max_reorder_s,
    )  # fmt: skip


def _run_bench(
    traces: list[Path],
    policies: list[str],
    profile: str | None,
    slo_ttft_ms: float | None,
    slo_itl_ms: float | None,
    duration_s: float | None,
    fmt: str | None,
    config: Path | None,
    forecaster: str,
    json_out: Path | None,
    plots: Path | None,
    max_reorder_s: float = 1.0,
) -> None:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from controller.config import ConfigError, PolicyConfig
    from serving.sim.replay_cli import default_trace_path
    from serving.workload.readers import read_trace
    from training.policy_bench import (
        FORECASTERS,
        POLICIES,
        BenchSettings,
        aggregate,
        bench_json,
        load_predictive_config,
        run_trace,
        trace_names,
        write_plots,
    )

    if forecaster not in FORECASTERS:
        raise _fail(f"--forecaster must be one of {', '.join(FORECASTERS)}, got {forecaster!r}")
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise _fail(f"--duration-s must be a finite number > 0, got {duration_s}")
    try:
        predictive = load_predictive_config(config) if config is not None else PolicyConfig()
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    settings = BenchSettings(
        policies=tuple(policies) if policies else POLICIES,
        profile=profile,
        slo_ttft_ms=slo_ttft_ms,
        slo_itl_ms=slo_itl_ms,
        predictive=predictive,
        forecaster="holt" if forecaster == "holt" else "default",
    )
    problems = settings.problems()
    if problems:
        raise _fail("; ".join(problems))
    try:
        paths = traces or [default_trace_path()]
        for path in paths:
            if not path.is_file():
                raise FileNotFoundError(f"trace file not found: {path}")
        loaded = []
        for path in paths:
            requests = read_trace(path, fmt, max_reorder_s=max_reorder_s)
            if duration_s is not None:
                requests = requests.window(0.0, duration_s)
            if len(requests) == 0:
                raise ValueError(
                    f"{path}: no requests" + (f" in the first {duration_s:g} s" if duration_s else "")
                )
            loaded.append(requests)
        settings.fleet()  # an unknown profile fails here, before any replay
    except (OSError, ValueError, KeyError) as exc:
        raise _fail(str(exc)) from None

    console = Console()
    if not console.is_terminal:
        console = Console(width=132)  # a file or a pipe: the table in full rather than folded to 80 columns
    names = trace_names(paths)
    benches: list[TraceBench] = []
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[now]}"), TimeElapsedColumn(),
        console=Console(stderr=True), transient=True,
    )  # fmt: skip
    n_policies = len(settings.policies)
    try:
        with progress:
            task = progress.add_task("bench", total=len(paths) * n_policies, now="")
            last = {"done": -1.0}

            def tick(trace_name: str, policy_name: str, done: float) -> None:
                if done - last["done"] < 0.01 and done < 1.0:
                    return  # a redraw per 1 % of a replay, not per simulated second
                last["done"] = -1.0 if done >= 1.0 else done
                index = names.index(trace_name) * n_policies + settings.policies.index(policy_name)
                progress.update(
                    task,
                    completed=index + done,
                    description=f"{trace_name} / {policy_name}",
                    now=f"{done:.0%}",
                )

            for name, requests in zip(names, loaded, strict=True):
                benches.append(run_trace(name, requests, settings, progress=tick))
    except (OSError, ValueError, KeyError, NotImplementedError) as exc:
        raise _fail(str(exc)) from None

    for b in benches:
        _print_bench(console, b.name, b, b.figures)
    if len(benches) > 1:
        _print_bench(console, "all traces", None, aggregate(benches))
    if json_out is not None:
        json_out.write_text(json.dumps(bench_json(benches, settings), indent=2) + "\n")
        console.print(f"wrote {json_out}")
    if plots is not None:
        for b in benches:
            for path in write_plots(b, plots):
                console.print(f"wrote {path}")
    failed = sum(len(b.errors) for b in benches)
    if failed:
        raise _fail(f"{failed} of {len(benches) * n_policies} replays failed (reasons above)", code=1)


def _print_bench(
    console: Console, title: str, bench: TraceBench | None, figures: Mapping[str, PolicyFigures]
) -> None:
    def num(x: float, spec: str) -> str:
        return "-" if not math.isfinite(x) else format(x, spec)

    if bench is not None:
        pool = bench.fleet.pools[0]
        caption = (
            f"{len(bench.trace):,} requests over {bench.trace.duration_s:,.0f} s; {pool.profile}; "
            f"SLO TTFT ≤ {pool.slo_ttft_ms:g} ms, ITL ≤ {pool.slo_itl_ms:g} ms; ITL = per-request mean; "
            "scales = scale events after the starting fleet"
        )
    else:
        caption = "GPU-s and scale events summed, SLO weighted by requests, percentiles pooled"
    rejected = any(f.rejected for f in figures.values())  # a column only when some request was rejected
    out = Table(title=f"policies side by side — {title}", caption=caption)
    out.add_column("policy", no_wrap=True)
    for label in (
        "SLO met",
        "TTFT p50/p99 ms",
        "ITL p50/p99 ms",
        "GPU-s",
        "/oracle",
        "scales",
        "unfin.",
        *(["rej."] * rejected),
        "wall s",
    ):
        out.add_column(label, justify="right")
    for name, f in figures.items():
        if f.error is not None:
            out.add_row(name, "[red]failed[/]", *["-"] * (7 + rejected))
            continue
        out.add_row(
            name,
            num(100.0 * f.slo_attainment, ".2f") + ("%" if math.isfinite(f.slo_attainment) else ""),
            f"{num(f.ttft_ms['p50'], ',.0f')}/{num(f.ttft_ms['p99'], ',.0f')}",
            f"{num(f.itl_ms['p50'], ',.1f')}/{num(f.itl_ms['p99'], ',.1f')}",
            num(f.gpu_seconds, ",.0f"),
            num(f.gpu_ratio_to_oracle, ".2f"),
            f"{f.scale_events:,}",
            f"{f.unfinished:,}",
            *([f"{f.rejected:,}"] * rejected),
            num(f.wall_s, ".1f"),
        )
    console.print(out)
    for name, f in figures.items():
        if f.error is not None:
            console.print(f"[red]{name} failed:[/] {f.error}", highlight=False, soft_wrap=True)


@bench_app.command("seed-table")
def seed_table_cmd(
    qps: Annotated[
        list[float] | None, typer.Option("--qps", help="Arrival rate, req/s (repeat; default 20 24 30).")
    ] = None,
    gpus: Annotated[int, typer.Option(min=2, help="Single-GPU instances in each setup.")] = 6,
    prefill: Annotated[
        int | None,
        typer.Option(help="P/D prefill instances (decode = gpus - prefill); default: sweep, keep the best."),
    ] = None,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, help="vLLM max_num_seqs of every instance.")
    ] = 24,
    profile: Annotated[str, typer.Option(help="Hardware profile MODEL/GPU.")] = "llama3-8b/a100",
    duration_s: Annotated[float, typer.Option(help="Seconds of Poisson arrivals per QPS point.")] = 300.0,
    drain_s: Annotated[
        float, typer.Option(help="Simulated seconds after the last arrival; unfinished then = never.")
    ] = 60.0,
    timeout_ms: Annotated[float, typer.Option(help="A percentile above this reads 'timeout'.")] = 30_000.0,
    itl_bound_ms: Annotated[
        float, typer.Option(help="Split choice: decode keeps up when mean-ITL P99 <= this.")
    ] = 50.0,
    isl: Annotated[
        int | None, typer.Option(help="Fixed prompt tokens (with --osl) instead of resampled lengths.")
    ] = None,
    osl: Annotated[int | None, typer.Option(help="Fixed output tokens (with --isl).")] = None,
    lengths_trace: Annotated[
        Path | None,
        typer.Option(help="Trace whose (prompt, output) pairs are resampled (default: bundled Azure conv)."),
    ] = None,
    router: Annotated[str, typer.Option(help="P/D router policy.")] = "context-aware",
    long_context_prefill: Annotated[
        int, typer.Option(min=0, help="Prefill instances the context-aware router marks long-context.")
    ] = 0,
    high_memory_decode: Annotated[
        int, typer.Option(min=0, help="Decode instances the context-aware router marks high-memory.")
    ] = 0,
    headline: Annotated[
        str, typer.Option(help="Metric of the ratios and split choice: ttft, itl, e2e.")
    ] = "ttft",
    seed: Annotated[int, typer.Option(help="Seed of arrivals and length draws.")] = 0,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the result as JSON here.")] = None,
) -> None:
    """The seed article's table on the simulator: P99 latency, colocated FCFS vs P/D, at QPS 20/24/30.

    The article claims P99 158 / 423 / timeout ms (colocated) vs 76 / 98 / 153 ms (P/D, context-aware
    router) at batch size 24. Both setups get the same --gpus single-GPU instances: --gpus colocated
    vLLM servers (least-loaded, FCFS) vs a prefill/decode split (every split is tried and the one failing
    at the fewest QPS points, then with the lowest worst-case P99, is kept for all points; --prefill fixes
    it). Arrivals are Poisson, the same request sequence compressed for each QPS (seeded); lengths are
    resampled from the bundled Azure 2023 conversation trace unless --isl/--osl fix them.

    The headline is TTFT P99 (the article's figures fit TTFT, see serving/sim/seed_table.py); mean ITL
    and end-to-end P50/P99 are reported too. "timeout": above --timeout-ms, where a request unfinished
    --drain-s after the last arrival counts as infinitely late. Ratios are colocated / P/D.

    Examples:

      pdscale bench seed-table --json seed-table.json

      pdscale bench seed-table --gpus 8 --prefill 4 --isl 512 --osl 128 --qps 20 --qps 30
    """
    from serving.sim.replay_cli import default_trace_path
    from serving.sim.seed_table import SeedTableConfig, fixed_lengths, seed_table, trace_lengths

    config = SeedTableConfig(
        profile=profile,
        max_num_seqs=batch_size,
        qps=tuple(qps) if qps else SeedTableConfig().qps,
        gpus=gpus,
        prefill=prefill,
        duration_s=duration_s,
        drain_s=drain_s,
        timeout_ms=timeout_ms,
        itl_bound_ms=itl_bound_ms,
        pd_router=router,
        long_context_prefill=long_context_prefill,
        high_memory_decode=high_memory_decode,
        headline=headline,
        seed=seed,
    )
    problems = config.problems()
    if problems:
        raise _fail("; ".join(problems))
    if (isl is None) != (osl is None):
        raise _fail("--isl and --osl go together (fixed lengths), or give neither (resampled lengths)")
    console = Console()
    try:
        if isl is not None and osl is not None:
            lengths = fixed_lengths(isl, osl)
        else:
            lengths = trace_lengths(lengths_trace or default_trace_path())
        with console.status("simulating...") as status:
            table = seed_table(config, lengths, progress=lambda msg: status.update(f"simulating {msg}"))
    except (ValueError, OSError) as exc:
        raise _fail(str(exc)) from exc
    _print(console, table)
    if json_out is not None:
        json_out.write_text(json.dumps(table.to_json(), indent=2) + "\n")
        console.print(f"wrote {json_out}")


def _print(console: Console, table: SeedTable) -> None:
    from serving.sim.seed_table import claim_ratio, describe_sweep, shape_verdict

    c = table.config
    h = c.headline.upper()

    def ms(q: Quantile) -> str:
        if q.timeout:
            return "[red]timeout[/]"
        return "unknown" if math.isnan(q.ms) else f"{q.ms:,.0f}"

    def claim(x: float | None) -> str:
        return "timeout" if x is None else f"{x:,.0f}"

    p, d = table.chosen_prefill, c.gpus - table.chosen_prefill
    out = Table(
        title=(
            f"Seed table: {c.profile}, batch size {c.max_num_seqs}, {c.gpus} GPUs "
            f"({c.gpus} colocated vs {p}P+{d}D {c.pd_router}), {c.duration_s:g} s Poisson per QPS, seed {c.seed}"
        ),
        caption=f"lengths: {table.lengths['source']}; ms; ratio = colocated / P/D; timeout > {c.timeout_ms:g} ms",
    )
    out.add_column("QPS", justify="right")
    for label in (
        f"colocated {h} P50/P99",
        f"P/D {h} P50/P99",
        "ratio P99",
        "claim coloc / P/D P99",
        "claim ratio",
    ):
        out.add_column(label, justify="right")
    out.add_column("ITL P99 coloc / P/D", justify="right")
    out.add_column("E2E P99 coloc / P/D", justify="right")
    for r in table.rows:
        col, pd = r.colocated.metrics, r.pd.metrics
        hk = c.headline
        out.add_row(
            f"{r.qps:g}",
            f"{ms(col[hk].p50)} / {ms(col[hk].p99)}",
            f"{ms(pd[hk].p50)} / {ms(pd[hk].p99)}",
            r.ratio.text(),
            "-" if r.claim is None else f"{claim(r.claim.colocated_p99_ms)} / {claim(r.claim.pd_p99_ms)}",
            "-" if r.claim is None else claim_ratio(r.claim, c.timeout_ms).text(),
            f"{ms(col['itl'].p99)} / {ms(pd['itl'].p99)}",
            f"{ms(col['e2e'].p99)} / {ms(pd['e2e'].p99)}",
        )
    console.print(out)
    if len(table.sweep) > 1:
        console.print("P/D splits tried:")
        for line in describe_sweep(table):
            console.print(f"  {line}", highlight=False)
    console.print(shape_verdict(table), highlight=False)
    console.print(f"simulated in {table.wall_s:.1f} s wall", highlight=False)
