"""``pdscale replay``: replay a request trace through the P/D cluster simulator under a scaling policy."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from serving.sim.fleet import FleetSpec
from serving.sim.router import GatewayPolicy

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


def _with_placement(fleet: FleetSpec, placement: str | None, slowdown: float | None) -> FleetSpec:
    """The one-pool fleet with ``--placement`` / ``--mixed-node-slowdown`` applied (validated by FleetSpec)."""
    pool = fleet.pools[0]
    changes: dict[str, object] = {}
    if placement is not None:
        changes["placement"] = placement
    if slowdown is not None:
        changes["mixed_node_slowdown"] = slowdown
    pool = dataclasses.replace(pool, **changes)  # type: ignore[arg-type]
    if pool.placement != "mixed-node" and slowdown is not None:
        raise ValueError("--mixed-node-slowdown applies to --placement mixed-node only")
    return dataclasses.replace(fleet, pools=(pool,))


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
    fleet_file: Annotated[
        Path | None,
        typer.Option(
            "--fleet",
            help="Fleet file (YAML): gpu_budget and pools, each with its own profile, trace, SLOs and bounds.",
        ),
    ] = None,
    budget_split: Annotated[
        str,
        typer.Option(
            "--budget-split",
            help="With --fleet: 'shared' (one controller, whole budget) or 'static' (split by peak demand).",
        ),
    ] = "shared",
    standby: Annotated[
        int, typer.Option("--standby", min=0, help="Warm-standby instances per role (fixed policy).")
    ] = 0,
    placement: Annotated[
        str | None,
        typer.Option(
            "--placement",
            help="dedicated, or mixed-node: each node hosts a prefill and a decode instance (KV split 40/60);"
            " the controller's policies then scale whole nodes.",
        ),
    ] = None,
    mixed_node_slowdown: Annotated[
        float | None,
        typer.Option(
            help="mixed-node: decode steps this many times slower while the node's prefill works (default:"
            " derived from the operator timings, serving/sim/interference.py).",
        ),
    ] = None,
    tail_fraction: Annotated[
        float | None,
        typer.Option(
            "--tail-fraction",
            min=0.0,
            max=1.0,
            help="Tail promotion: a request queued past this fraction of the TTFT SLO jumps the queue and, when"
            " the pool has a warm standby, one is promoted for it (default: off).",
        ),
    ] = None,
    max_reorder_s: Annotated[
        float,
        typer.Option(
            "--max-reorder-s",
            help="Rows may arrive this many seconds before an earlier row (re-sorted); inf accepts any order.",
        ),
    ] = 1.0,
    gateway_queue: Annotated[
        str,
        typer.Option(
            "--gateway-queue",
            help="on: hold requests at the pool's gateway while every instance of their role has"
            " --gateway-max-waiting requests waiting, FCFS by class, until one has room (instances that come up"
            " later serve them); off: route each request at once to an instance's own queue.",
        ),
    ] = "off",
    gateway_max_waiting: Annotated[
        int | None,
        typer.Option(
            "--gateway-max-waiting",
            min=1,
            help="With --gateway-queue on: an instance's waiting"
            " requests below which it takes one from the gateway (default 5).",
        ),
    ] = None,
    predict_output: Annotated[
        bool,
        typer.Option(
            "--predict-output",
            help="Route on predicted output lengths (learned online from completions) instead of the trace's"
            " true lengths.",
        ),
    ] = False,
) -> None:
    """Replay a trace through the simulated P/D cluster; report latency, SLO attainment and GPU cost.

    The simulator runs vLLM-style continuous batching (chunked prefill, paged KV cache, recompute preemption).
    A prefill instance hands each request's KV to a decode instance (--mixed: colocated instances instead).
    Every simulated second the policy reads the per-instance vLLM metrics and sets the instance counts.
    New instances cold-start (120 s), warm standby activates in 5 s, scale-down drains.
    The replay runs until every request has completed: none is dropped. A request no instance can hold (a
    prompt larger than the KV cache) is rejected, as a real vLLM server refuses it, counted as `rejected` and as
    an SLO miss; one warning names the first by its line.

    Policies: [bold]static-peak[/] (capacity model on the trace's busiest 60 s and its shorter bursts: meets the
    SLO at a high cost),
    [bold]fixed[/] (--prefill P --decode D held constant); the controller registers more.

    With no --trace it replays the bundled Azure 2023 conversation trace (12k requests, 34 min).

    Example: pdscale replay --policy fixed --prefill 2 --decode 3 --json out.json --plot out.png

    Tail requests: --tail-fraction 0.5 promotes a request that has waited half its TTFT SLO, and a warm standby
    for it (counted as tail_promotions / standby_promotions per pool in the JSON).
    Example: pdscale replay --policy fixed --prefill 2 --decode 2 --standby 1 --tail-fraction 0.5

    Gateway queue: --gateway-queue on holds requests at the pool's gateway (FCFS by class) while every instance
    of their role has --gateway-max-waiting requests waiting, so that instances which come up later serve them
    (the JSON gains gateway_peak per pool and role). Off by default.
    Example: pdscale replay --policy reactive --gateway-queue on

    [bold]Fleets[/] (several models under one GPU budget): --fleet FLEET.yaml names gpu_budget and pools, each
    with name, profile, trace (relative to the file; `model:` selects rows of a multi-model trace such as
    BurstGPT's), slo_ttft_ms, slo_itl_ms, optional prefill/decode bounds and policy overrides.
    --budget-split shared: one policy decides all pools each tick with the whole budget (when it binds, the
    pool at the highest SLO risk gets the GPUs; a pool's peak-proportional share is guaranteed to it and only
    borrowed while it does not plan to use it); static: the budget is split in proportion to each trace's
    peak demand and each pool replays alone in its share. The JSON holds the fleet's figures and pools → name.
    With two pools or more, shared also runs the controller's fleet reserve (each pool held at its last burst's
    SLO floor, one reserve pooled for all); a one-pool fleet runs without it, so it replays as --policy P does
    with the file's bounds and gpu_budget (bounds default to 0..64 per role in both; --policy's budget is 1,024
    GPUs, a fleet file names its own).

    Example: pdscale replay --fleet examples/fleet-two-models.yaml --policy predictive --budget-split static
    """
    if fleet_file is not None:
        given = {
            "--trace": trace, "--config": config, "--profile": profile, "--slo-ttft-ms": slo_ttft_ms,
            "--slo-itl-ms": slo_itl_ms, "--prefill": prefill, "--decode": decode, "--mixed": mixed,
            "--router": router, "--format": fmt, "--plot": plot, "--tail-fraction": tail_fraction,
            "--standby": standby or None, "--predict-output": predict_output or None,
            "--placement": placement, "--mixed-node-slowdown": mixed_node_slowdown,
            "--gateway-queue on": None if gateway_queue == "off" else gateway_queue,
            "--gateway-max-waiting": gateway_max_waiting,
        }  # fmt: skip
        clash = [k for k, v in given.items() if v is not None]
        if clash:
            raise _fail(f"--fleet takes pools, traces and SLOs from the fleet file; drop {', '.join(clash)}")
        _replay_fleet(fleet_file, policy, budget_split, duration_s, tick_s, json_out)
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from serving.sim.engine import TailPolicy
    from serving.sim.fleet import load_fleet, single_pool
    from serving.sim.replay import PolicyOptions, make_policy, replay
    from serving.workload.outlen import OutputLengthPredictor
    from serving.workload.readers import read_trace

    console = Console()
    try:
        path = trace or default_trace_path()
        requests = read_trace(path, fmt, max_reorder_s=max_reorder_s)
        if duration_s is not None:
            requests = requests.window(0.0, duration_s)
        if config is not None:
            fleet = load_fleet(str(config))
        else:
            fleet = single_pool(prefill=prefill or 1, decode=decode or 1, mixed=mixed or 0)
        fleet = _override(fleet, profile, slo_ttft_ms, slo_itl_ms, router)
        if len(fleet.pools) != 1:
            raise ValueError(f"{config}: the CLI replays one trace, so the fleet needs exactly one pool")
        if placement is not None or mixed_node_slowdown is not None:
            fleet = _with_placement(fleet, placement, mixed_node_slowdown)
        chosen = make_policy(
            policy, PolicyOptions(prefill=prefill, decode=decode, mixed=mixed, standby=standby)
        )
        tail = TailPolicy(fraction=tail_fraction) if tail_fraction is not None else None
        gateway = _gateway(gateway_queue, gateway_max_waiting)
        predictor = OutputLengthPredictor() if predict_output else None
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

            report = replay(
                fleet, {fleet.pools[0].name: requests}, chosen, tick_s=tick_s, progress=tick, tail=tail,
                output_predictor=predictor, gateway=gateway,
            )  # fmt: skip
    except (OSError, ValueError, KeyError, NotImplementedError) as exc:
        raise _fail(str(exc)) from None

    table = Table(title=f"replay of {path.name} — policy {report.policy}, profile {report.profile}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    rows = [
        ("requests / completed / dropped", f"{report.requests:,} / {report.completed:,} / {report.dropped}"),
        ("unfinished", f"{report.unfinished:,}"),
        *([("rejected (fit no instance's KV cache; SLO misses)", f"{report.rejected:,}")] if report.rejected else []),
        *([("over max_model_len (served anyway)", f"{report.over_context:,}")] if report.over_context else []),
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


def _gateway(switch: str, max_waiting: int | None) -> GatewayPolicy | None:
    """``--gateway-queue on|off`` as the replay's gateway policy (None = off); ``--gateway-max-waiting``
    without ``--gateway-queue on`` is refused (it would be ignored)."""
    if switch not in ("on", "off"):
        raise ValueError(f"--gateway-queue must be on or off, got {switch!r}")
    if switch == "off":
        if max_waiting is not None:
            raise ValueError("--gateway-max-waiting applies with --gateway-queue on only")
        return None
    return GatewayPolicy() if max_waiting is None else GatewayPolicy(max_waiting=max_waiting)


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


def _replay_fleet(
    path: Path, policy: str, split: str, duration_s: float | None, tick_s: float, json_out: Path | None
) -> None:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from serving.sim.fleet_file import SPLITS, load_fleet_file, replay_fleet

    console = Console()
    if split not in SPLITS:
        raise _fail(f"--budget-split {split!r}: expected one of {', '.join(SPLITS)}")
    try:
        fleet = load_fleet_file(path, duration_s=duration_s)
        progress = Progress(
            TextColumn("replay {task.fields[label]}"), BarColumn(), TextColumn("{task.fields[sim]}"),
            TimeElapsedColumn(), console=Console(stderr=True), transient=True,
        )  # fmt: skip
        with progress:
            task = progress.add_task("replay", total=None, sim="", label="")

            def tick(label: str, now_s: float, end_s: float) -> None:
                if int(now_s) % 30 == 0:
                    progress.update(
                        task, total=max(end_s, 1.0), completed=min(now_s, end_s), sim=f"t={now_s:,.0f}s",
                        label=label,
                    )  # fmt: skip

            result = replay_fleet(
                fleet.spec, fleet.traces, policy, split=split, pool_params=fleet.policy_params,
                tick_s=tick_s, progress=tick,
            )  # fmt: skip
    except (OSError, ValueError, KeyError, NotImplementedError) as exc:
        raise _fail(str(exc)) from None

    doc = result.to_json()
    table = Table(
        title=f"fleet replay of {path.name} — policy {doc['policy']}, budget {doc['gpu_budget']} GPUs {split}"
    )
    rejected = doc["rejected"] > 0  # a column only when a pool rejected requests (fit no KV cache)
    for column in ("pool", "profile", "budget / peak GPUs", "requests", "completed", *(["rejected"] * rejected),
                   "SLO attained", "TTFT p90 ms", "ITL p90 ms", "GPU-hours"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("pool", "profile") else "right")

    def pct(x: float | None) -> str:
        return "unknown" if x is None else f"{x:.2%}"

    def ms(x: float | None) -> str:
        return "unknown" if x is None else f"{x:,.0f}"

    for name, p in doc["pools"].items():
        table.add_row(
            name, p["profile"], f"{p['gpu_budget']} / {p['peak_demand_gpus']}", f"{p['requests']:,}",
            f"{p['completed']:,}", *([f"{p['rejected']:,}"] * rejected), pct(p["slo_attainment"]),
            ms(p["ttft_ms"]["p90"]), ms(p["itl_ms"]["p90"]), f"{p['gpu_hours']:,.2f}",
        )  # fmt: skip
    table.add_row(
        "[bold]fleet[/]", "", f"{doc['gpu_budget']}", f"{doc['requests']:,}", f"{doc['completed']:,}",
        *([f"{doc['rejected']:,}"] * rejected), pct(doc["slo_attainment"]), ms(doc["ttft_ms"]["p90"]),
        ms(doc["itl_ms"]["p90"]), f"{doc['gpu_hours']:,.2f}",
    )  # fmt: skip
    console.print(table)
    if json_out is not None:
        json_out.write_text(json.dumps(doc, indent=2) + "\n")
        console.print(f"wrote {json_out}")
