"""``pdscale replay``: replay a request trace through the P/D cluster simulator under a scaling policy."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from serving.sim.fleet import FleetSpec

DEFAULT_TRACE = Path("datasets/azure2023/AzureLLMInferenceTrace_conv.dev_before_1850.csv")
_REPO = Path(__file__).resolve().parents[2]


def default_trace_path() -> Path:
    """The bundled Azure 2023 conversation trace (in the checkout, else in ../shared beside it)."""
    for candidate in (_REPO / DEFAULT_TRACE, _REPO.parent / "shared" / DEFAULT_TRACE):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(
        f"default trace not found at {_REPO / DEFAULT_TRACE} nor {_REPO.parent / 'shared' / DEFAULT_TRACE}; "
        "pass --trace FILE"
    )


def _fail(message: str) -> typer.Exit:
    Console(stderr=True).print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


def _ms(d: dict[str, float]) -> str:
    return " / ".join("unknown" if math.isnan(d[k]) else f"{d[k]:,.1f}" for k in ("p50", "p90", "p99"))


def replay_cmd(
    trace: Annotated[
        Path | None,
        typer.Option("--trace", "-t", help="Trace file (Azure CSV, Mooncake JSONL, BurstGPT CSV)."),
    ] = None,
    policy: Annotated[str, typer.Option("--policy", "-p", help="Scaling policy by name.")] = "static-peak",
    profile: Annotated[
        str | None, typer.Option("--profile", help="Hardware profile MODEL/GPU (default llama3-8b/a100).")
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="Fleet config (YAML/JSON) with pools.")
    ] = None,
    slo_ttft_ms: Annotated[float | None, typer.Option(help="TTFT SLO, ms (default 1000).")] = None,
    slo_itl_ms: Annotated[
        float | None, typer.Option(help="Mean inter-token latency SLO, ms (default 50).")
    ] = None,
    prefill: Annotated[
        int | None, typer.Option("--prefill", help="Prefill instances (fixed policy).")
    ] = None,
    decode: Annotated[int | None, typer.Option("--decode", help="Decode instances (fixed policy).")] = None,
    mixed: Annotated[
        int | None, typer.Option("--mixed", help="Colocated P+D instances instead of a P/D split.")
    ] = None,
    router: Annotated[
        str | None, typer.Option(help="Router: round-robin, least-loaded, context-aware.")
    ] = None,
    fmt: Annotated[str | None, typer.Option("--format", "-f", help="Force the trace format.")] = None,
    duration_s: Annotated[
        float | None, typer.Option(help="Replay only the trace's first DURATION_S seconds.")
    ] = None,
    tick_s: Annotated[float, typer.Option(help="Policy tick, seconds of virtual time.")] = 1.0,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the report as JSON here.")] = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Draw load, capacity and TTFT to this PNG.")
    ] = None,
) -> None:
    """Replay a trace through the simulated P/D cluster; report latency, SLO attainment and GPU cost.

    The simulator runs vLLM-style continuous batching (chunked prefill, paged KV cache, recompute preemption).
    A prefill instance hands each request's KV to a decode instance (--mixed: colocated instances instead).
    Every simulated second the policy reads the per-instance vLLM metrics and sets the instance counts.
    New instances cold-start (120 s), warm standby activates in 5 s, scale-down drains.
    The replay runs until every request has completed: none is dropped.

    Policies: [bold]static-peak[/] (capacity model on the trace's busiest 60 s: meets the SLO at a high cost),
    [bold]fixed[/] (--prefill P --decode D held constant); the controller registers more.

    With no --trace it replays the bundled Azure 2023 conversation trace (12k requests, 34 min).

    Example: pdscale replay --policy fixed --prefill 2 --decode 3 --json out.json --plot out.png
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from serving.sim.fleet import load_fleet, single_pool
    from serving.sim.replay import PolicyOptions, make_policy, replay
    from serving.workload.readers import read_trace

    console = Console()
    try:
        path = trace or default_trace_path()
        requests = read_trace(path, fmt)
        if duration_s is not None:
            requests = requests.window(0.0, duration_s)
        if config is not None:
            fleet = load_fleet(str(config))
        else:
            fleet = single_pool(prefill=prefill or 1, decode=decode or 1, mixed=mixed or 0)
        fleet = _override(fleet, profile, slo_ttft_ms, slo_itl_ms, router)
        if len(fleet.pools) != 1:
            raise ValueError(f"{config}: the CLI replays one trace, so the fleet needs exactly one pool")
        chosen = make_policy(policy, PolicyOptions(prefill=prefill, decode=decode, mixed=mixed))
        progress = Progress(
            TextColumn("replay"), BarColumn(), TextColumn("{task.fields[sim]}"), TimeElapsedColumn(),
            console=Console(stderr=True), transient=True,
        )  # fmt: skip
        with progress:
            task = progress.add_task("replay", total=None, sim="")

            def tick(now_s: float, end_s: float) -> None:
                if int(now_s) % 30 == 0:
                    progress.update(
                        task, total=max(end_s, 1.0), completed=min(now_s, end_s), sim=f"t={now_s:,.0f}s"
                    )

            report = replay(fleet, {fleet.pools[0].name: requests}, chosen, tick_s=tick_s, progress=tick)
    except (OSError, ValueError, KeyError, NotImplementedError) as exc:
        raise _fail(str(exc)) from None

    table = Table(title=f"replay of {path.name} — policy {report.policy}, profile {report.profile}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    rows = [
        ("requests / completed / dropped", f"{report.requests:,} / {report.completed:,} / {report.dropped}"),
        ("unfinished", f"{report.unfinished:,}"),
        ("TTFT ms p50 / p90 / p99", _ms(report.ttft_ms)),
        ("ITL ms (per-request mean) p50 / p90 / p99", _ms(report.itl_ms)),
        (f"SLO attainment (TTFT≤{fleet.pools[0].slo_ttft_ms:g}, ITL≤{fleet.pools[0].slo_itl_ms:g} ms)",
         f"{report.slo_attainment:.2%}"),
        ("GPU-hours", f"{report.gpu_seconds / 3600:,.2f}"),
        ("scale events / preemptions", f"{report.scale_events} / {report.preemptions}"),
        ("simulated / wall seconds", f"{report.sim_end_s:,.0f} / {report.wall_s:,.1f}"),
    ]  # fmt: skip
    if report.timeline is not None:
        peak = {r: int(v.max()) for r, v in report.timeline.active.items() if v.max() > 0}
        rows.append(("peak active instances", ", ".join(f"{r} {n}" for r, n in peak.items())))
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    if json_out is not None:
        json_out.write_text(json.dumps(report.to_json(), indent=2) + "\n")
        console.print(f"wrote {json_out}")
    if plot is not None:
        from serving.sim.plots import plot_replay

        plot_replay(report, plot)
        console.print(f"wrote {plot}")


def _override(
    fleet: FleetSpec, profile: str | None, ttft: float | None, itl: float | None, router: str | None
) -> FleetSpec:
    import dataclasses

    changes: dict[str, object] = {}
    if profile is not None:
        changes["profile"] = profile
    if ttft is not None:
        changes["slo_ttft_ms"] = ttft
    if itl is not None:
        changes["slo_itl_ms"] = itl
    if router is not None:
        changes["router"] = router
    if not changes:
        return fleet
    pools = tuple(dataclasses.replace(p, **changes) for p in fleet.pools)  # type: ignore[arg-type]
    return dataclasses.replace(fleet, pools=pools)
