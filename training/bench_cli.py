"""``pdscale bench``: benchmarks on the simulator. ``seed-table`` re-runs the seed article's P99 table.

The group's own ``pdscale bench --trace ...`` (policies side by side) comes with issue 7; until then the
group without a subcommand says so and exits non-zero.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from serving.sim.seed_table import Quantile, SeedTable

bench_app = typer.Typer(
    name="bench",
    help=(
        "Benchmarks on the simulated P/D cluster.\n\nExample: pdscale bench seed-table --json seed-table.json"
    ),
    rich_markup_mode="rich",
)


def _fail(message: str, code: int = 2) -> typer.Exit:
    Console(stderr=True).print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code=code)


@bench_app.callback(invoke_without_command=True)
def bench(ctx: typer.Context) -> None:
    """Benchmarks on the simulated P/D cluster (subcommands below).

    Example: pdscale bench seed-table --qps 20 --qps 24 --qps 30 --json seed-table.json
    """
    if ctx.invoked_subcommand is None:
        raise _fail(
            "not implemented yet: the side-by-side policy benchmark (pdscale bench --trace ...) comes with "
            "issue 7; run `pdscale bench seed-table` for the seed article's P99 table"
        )


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
