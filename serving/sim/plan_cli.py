"""``pdscale plan``: prefill and decode instances (and GPUs, and cost) a load needs to meet its SLOs.

The lead registers it: ``app.command("plan")(plan_cmd)``. The logic lives in :mod:`serving.sim.plan`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from serving.sim.engine import served_trace
from serving.sim.fleet import single_pool
from serving.sim.hardware import ProfileError
from serving.sim.plan import (
    DEFAULT_HEADROOM,
    DEFAULT_MIN_ATTAINMENT,
    DEFAULT_MIXED_NODE_SLOWDOWN,
    DEFAULT_MIXED_NODE_TOTAL,
    DEFAULT_PREFILL_MEM_FRAC,
    DEFAULT_WINDOW_S,
    PLACEMENT_MODES,
    LoadPoint,
    MixedNodePlan,
    NodePartition,
    PlacementComparison,
    Plan,
    PlanError,
    ProfilePlan,
    Sizing,
    Verification,
    compare_placements,
    parse_prices,
    plan_capacity,
    plan_mixed_node,
    poisson_trace,
    trace_sizings,
    verify_plan,
)

_console = Console()


def plan_cmd(
    slo_ttft_ms: Annotated[float, typer.Option(min=0.001, help="P90 time-to-first-token SLO, ms.")],
    slo_itl_ms: Annotated[
        float, typer.Option(min=0.001, help="Inter-token latency SLO (per request mean), ms.")
    ],
    rate_rps: Annotated[
        float | None, typer.Option(min=0, help="Request rate to size for (not with --trace).")
    ] = None,
    isl: Annotated[float | None, typer.Option(min=1, help="Mean input (prompt) length, tokens.")] = None,
    osl: Annotated[float | None, typer.Option(min=1, help="Mean output length, tokens.")] = None,
    profile: Annotated[
        list[str] | None,
        typer.Option(help="Hardware profile MODEL/GPU; repeat to compare (default llama3-8b/a100)."),
    ] = None,
    headroom: Annotated[
        float, typer.Option(min=0, help="Size for (1 + headroom) x the load.")
    ] = DEFAULT_HEADROOM,
    trace: Annotated[
        Path | None, typer.Option(exists=True, dir_okay=False, help="Take load and lengths from this trace.")
    ] = None,
    window_s: Annotated[
        float, typer.Option(min=1, help="Window for --trace sizing (peak, p99, p90 windows), s.")
    ] = DEFAULT_WINDOW_S,
    price: Annotated[
        list[str] | None,
        typer.Option(help="PROFILE=USD_PER_GPU_HOUR, repeatable: adds a cost column."),
    ] = None,
    explain: Annotated[
        bool, typer.Option(help="Print the intermediate quantities of the capacity model.")
    ] = False,
    verify: Annotated[
        bool,
        typer.Option(
            help="Replay at the plan (first profile) and at one instance fewer per pool: the trace, or a "
            "120-s Poisson trace of --rate-rps with fixed --isl/--osl. Uses the plan's headroom."
        ),
    ] = False,
    placement: Annotated[
        str,
        typer.Option(
            help="dedicated (one instance per node), mixed-node (a prefill and a decode instance per node, "
            "GPU memory split), or compare (replay both and choose)."
        ),
    ] = "dedicated",
    prefill_mem_frac: Annotated[
        float, typer.Option(help="mixed-node: the prefill instance's --gpu-memory-utilization.")
    ] = DEFAULT_PREFILL_MEM_FRAC,
    decode_mem_frac: Annotated[
        float | None,
        typer.Option(help="mixed-node: the decode instance's share (default 0.9 - --prefill-mem-frac)."),
    ] = None,
    mixed_node_slowdown: Annotated[
        float | None,
        typer.Option(
            help="mixed-node: decode steps are this many times slower while the prefill works "
            "(default: derived from the operator timings, serving/sim/interference.py)."
        ),
    ] = DEFAULT_MIXED_NODE_SLOWDOWN,
    min_attainment: Annotated[
        float, typer.Option(min=0, max=1, help="compare/verify: SLO attainment a placement must reach.")
    ] = DEFAULT_MIN_ATTAINMENT,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the plan as JSON here.")] = None,
) -> None:
    """How many prefill and decode instances (and GPUs) a load needs to meet its TTFT and ITL SLOs.

    The answer comes from the capacity model the controller uses (serving/sim/capacity.py): prefill is an
    M/D/1 queue of packed prompt iterations kept within the P90 TTFT SLO, decode the largest batch whose
    step meets the ITL SLO (bounded by max_num_seqs and the KV cache). Each pool is rounded up on its own;
    the table also shows one ceil over the sum, which starves a pool whenever it is smaller (marked 'starves').

    With several --profile options you get a comparison (GPUs, P:D ratio, and cost with --price). With
    --trace the load comes from the trace: the peak --window-s (60 s) window, the p99 and p90 windows, and the mean
    (prefill sized by prompt tokens, decode by generated tokens). The JSON's top level is the first
    profile (at the peak with --trace); every profile is under "profiles".

    --placement mixed-node sizes PD-mixed nodes instead: each node runs a prefill and a decode vLLM with
    --gpu-memory-utilization --prefill-mem-frac (0.4) and --decode-mem-frac (0.5), so each has its own,
    smaller KV cache, and its steps run slower while the node's prefill works (by default derived from the
    operator timings: a hybrid iteration of the decode batch and an equal time slice of prefill, over the
    step alone — a model, not a measurement; --mixed-node-slowdown S fixes it), so decode is sized for the ITL SLO
    divided by the mean slowdown at the planned prefill load. --placement compare replays both plans through
    the simulator (fixed policy, the trace or a 120-s Poisson trace of --rate-rps), adds mixed nodes one at a
    time while the replay misses --min-attainment and mixed-node uses no more GPUs than dedicated, and picks
    the placement that meets --min-attainment with fewer GPUs, saying why. JSON: "placement" is the
    chosen placement (its counts are the top-level prefill/decode/gpus/nodes), "placement_comparison"
    holds both replays.

    Examples:

      pdscale plan --rate-rps 20 --isl 1024 --osl 256 --slo-ttft-ms 500 --slo-itl-ms 30 --explain

      pdscale plan --rate-rps 20 --isl 1024 --osl 256 --slo-ttft-ms 500 --slo-itl-ms 30 \\
        --profile llama3-8b/a100 --profile llama2-7b/h100 --price llama2-7b/h100=4.0 --price llama3-8b/a100=2.0

      pdscale plan --trace datasets/mooncake/synthetic_trace.jsonl --slo-ttft-ms 6000 --slo-itl-ms 60 --json plan.json

      pdscale plan --rate-rps 20 --isl 1024 --osl 256 --slo-ttft-ms 500 --slo-itl-ms 30 --placement compare
    """
    profiles = profile or ["llama3-8b/a100"]
    rejected = 0  # requests of --trace that fit no instance of the first profile
    try:
        prices = parse_prices(price or [])
        if trace is not None:
            if rate_rps is not None or isl is not None or osl is not None:
                raise PlanError("--trace gives the load and lengths: drop --rate-rps/--isl/--osl")
            from serving.workload.readers import read_trace

            loaded = read_trace(trace)
            everything = len(loaded)
            # sized as the simulator serves it: without the requests no instance of the first profile holds
            loaded = served_trace(single_pool(profile=profiles[0]).pools[0], loaded)
            rejected = everything - len(loaded)
            if rejected:
                _console.print(
                    f"{rejected:,} of {everything:,} requests fit no {profiles[0]} instance's KV cache: a real vLLM "
                    "server refuses them (HTTP 400) and the simulator rejects them, so they are not sized for"
                )
            sizings = trace_sizings(loaded, window_s)
        else:
            if rate_rps is None or isl is None or osl is None:
                raise PlanError("give --rate-rps, --isl and --osl (or --trace FILE)")
            loaded = None
            sizings = (Sizing.steady(LoadPoint(rate_rps, isl, osl)),)
        plans = [
            plan_capacity(profiles, s, slo_ttft_ms, slo_itl_ms, headroom=headroom, prices=prices)
            for s in sizings
        ]
        if placement not in PLACEMENT_MODES:
            raise PlanError(f"--placement {placement!r}: expected one of {', '.join(PLACEMENT_MODES)}")
        mixed: MixedNodePlan | None = None
        if placement != "dedicated":
            share = decode_mem_frac
            if share is None:
                share = round(DEFAULT_MIXED_NODE_TOTAL - prefill_mem_frac, 4)
            part = NodePartition(prefill_mem_frac, share, mixed_node_slowdown)
            first = plans[0]
            mixed = plan_mixed_node(
                first.first.profile, first.sizing, slo_ttft_ms, slo_itl_ms, headroom=headroom, partition=part
            )
    except (PlanError, ProfileError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    _print_table(plans, bool(prices))
    _print_rounding(plans[0])
    if explain:
        for p in plans[0].profiles:
            _print_explain(p, plans[0])
    result: dict[str, object] = dict(plans[0].to_json())
    if trace is not None:
        result["trace"] = str(trace)
        result["rejected"] = rejected
        result["window_s"] = window_s
        result["sizings"] = {pl.sizing.name: pl.to_json() for pl in plans}
    if (verify or placement == "compare") and loaded is None:
        assert rate_rps is not None and isl is not None and osl is not None
        if rate_rps <= 0:
            raise typer.BadParameter(f"--{'verify' if verify else 'placement compare'} needs --rate-rps > 0")
        loaded = poisson_trace(rate_rps, round(isl), round(osl))
    if verify:
        assert loaded is not None
        v = verify_plan(plans[0].first, loaded, slo_ttft_ms, slo_itl_ms, min_attainment=min_attainment)
        _print_verification(v)
        result["verification"] = _verification_json(v)
    result["placement_mode"] = placement
    result.update(_placement_result(placement, plans[0].first, mixed))
    if mixed is not None:
        _print_mixed(mixed)
    if placement == "compare":
        assert mixed is not None and loaded is not None
        comparison = compare_placements(
            plans[0].first, mixed, loaded, slo_ttft_ms, slo_itl_ms, min_attainment=min_attainment
        )
        _print_comparison(comparison)
        result["placement_comparison"] = comparison.to_json()
        result.update(_placement_result(comparison.winner, plans[0].first, mixed))
        if comparison.winner == "mixed-node":  # the measured node count, which a search may have raised
            m = comparison.mixed_node
            result.update(prefill=m.nodes, decode=m.nodes, nodes=m.nodes, gpus=m.gpus)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result, indent=2) + "\n")
        _console.print(f"wrote {json_out}")


def _placement_result(chosen: str, dedicated: ProfilePlan, mixed: MixedNodePlan | None) -> dict[str, object]:
    """The top-level fields for the chosen placement ("compare" before the replays: dedicated's counts)."""
    out: dict[str, object] = {}
    if mixed is not None:
        out["mixed_node"] = mixed.to_json()
    if chosen == "mixed-node":
        assert mixed is not None
        out.update(
            placement=chosen, prefill=mixed.nodes, decode=mixed.nodes, nodes=mixed.nodes, gpus=mixed.gpus
        )
    else:
        out.update(
            placement="dedicated",
            prefill=dedicated.prefill,
            decode=dedicated.decode,
            nodes=dedicated.instances,
            gpus=dedicated.gpus,
        )
    return out


def _print_mixed(m: MixedNodePlan) -> None:
    kv_pre, kv_dec = m.kv_tokens()
    p = m.partition
    _console.print(
        f"[bold]mixed-node: {m.nodes} nodes = {m.gpus} GPUs[/bold] (prefill needs {m.prefill}, decode {m.decode}; "
        f"--gpu-memory-utilization {p.prefill_mem_frac:g} / {p.decode_mem_frac:g}: KV {kv_pre:,} / {kv_dec:,} "
        f"tokens against {m.profile.kv_capacity_tokens:,} dedicated; decode sized for the ITL SLO / "
        f"{m.effective_slowdown:.2f}: steps x{m.busy_slowdown:.3g} "
        f"({'derived from the operator timings' if p.slowdown is None else 'given'}) while the node's prefill works, "
        f"{m.prefill_busy:.0%} of the time)",
        highlight=False,
    )


def _print_comparison(c: PlacementComparison) -> None:
    table = Table(title=f"placement replay (fixed policy; meets = SLO attainment ≥ {c.min_attainment:g})")
    for col in ("placement", "prefill", "decode", "nodes", "GPUs", "GPU·s", "attainment", "P90 TTFT ms",
                "mean ITL ms", "unfinished", "meets"):  # fmt: skip
        table.add_column(col, justify="left" if col == "placement" else "right")
    for k in (c.dedicated, c.mixed_node):
        table.add_row(
            k.placement + (" *" if k.placement == c.winner else ""), str(k.prefill), str(k.decode), str(k.nodes),
            str(k.gpus), f"{k.gpu_seconds:,.0f}", f"{k.slo_attainment:.4f}", _num(k.ttft_p90_ms, ".1f"),
            _num(k.itl_mean_ms, ".2f"), str(k.unfinished), "yes" if k.meets else "no",
        )  # fmt: skip
    _console.print(table)
    if len(c.mixed_node_tried) > 1:
        steps = ", ".join(f"{n} nodes → {a:.4f}" for n, a in c.mixed_node_tried)
        _console.print(f"mixed-node replays (attainment): {steps}", highlight=False)
    _console.print(f"[bold]placement: {c.winner}[/bold] — {c.reason}", highlight=False)
    _console.print(
        "mixed-node figures rest on the simulator's interference model (decode steps slowed while the node's "
        "prefill works, derived from kernel timings unless --mixed-node-slowdown; prefill not slowed): a "
        "model, not a measurement on a real mixed node",
        highlight=False,
    )


def _num(x: float, fmt: str = ".2f") -> str:
    return "—" if not math.isfinite(x) else format(x, fmt)


def _print_table(plans: list[Plan], priced: bool) -> None:
    first = plans[0]
    title = (
        f"SLO P90 TTFT {first.slo_ttft_ms:g} ms, ITL {first.slo_itl_ms:g} ms, headroom {first.headroom:.0%}"
    )
    table = Table(title=title)
    for col in ("sizing", "load", "profile", "TP", "prefill", "decode", "GPUs", "P:D"):
        table.add_column(col, justify="left" if col in ("sizing", "profile", "load") else "right")
    if priced:
        table.add_column("USD/h", justify="right")
    table.add_column("one ceil", justify="right")
    for plan in plans:
        s = plan.sizing
        pl, dl = s.prefill_load, s.decode_load
        load = f"{pl.rate_rps:.1f}×{pl.mean_prompt_tokens:.0f}in {dl.rate_rps:.1f}×{dl.mean_output_tokens:.0f}out"
        best = min(plan.profiles, key=lambda p: (p.cost_usd_per_hour if priced else p.gpus, p.gpus))
        for i, p in enumerate(plan.profiles):
            row = [
                s.name if i == 0 else "",
                load if i == 0 else "",
                p.profile.name + (" *" if len(plan.profiles) > 1 and p is best else ""),
                str(p.profile.gpus),
                f"{p.prefill} ({p.prefill_share:.2f}{' burst' if p.prefill > p.prefill_need.prefill else ''})",
                f"{p.decode} ({p.decode_share:.2f}{' burst' if p.decode > p.decode_need.decode else ''})",
                str(p.gpus),
                f"{p.prefill}:{p.decode}",
            ]
            if priced:
                row.append(_num(p.cost_usd_per_hour))
            row.append(f"{p.single_ceil_total}" + (" starves" if p.starved_by_single_ceil else ""))
            table.add_row(*row)
    _console.print(table)
    _console.print(
        "load: req/s × mean prompt tokens (prefill sizing), req/s × mean output tokens (decode sizing); "
        "prefill/decode: instances (share = load / one instance's capacity); one ceil: ⌈p + d⌉, the "
        "single ceil over the sum ('starves': no split of it covers both pools); 'burst': raised to clear a "
        "burst shorter than the window within the TTFT SLO (peak sizing, as static-peak)"
    )
    if any(len(pl.profiles) > 1 for pl in plans):
        _console.print("* cheapest (by USD/h where priced, else by GPUs)")


def _print_rounding(plan: Plan) -> None:
    p = plan.first
    _console.print(
        f"[bold]{p.profile.name}: {p.prefill} prefill + {p.decode} decode = {p.instances} instances, "
        f"{p.gpus} GPUs[/bold] (each pool rounded up on its own: ⌈{p.prefill_share:.2f}⌉ + "
        f"⌈{p.decode_share:.2f}⌉"
        + (
            f"; the trace's bursts need at least {p.burst_floor[0]} + {p.burst_floor[1]}"
            if any(p.burst_floor)
            else ""
        )
        + ")."
    )
    total = p.single_ceil_total
    if p.starved_by_single_ceil:
        _console.print(
            f"One ceil over the sum would give ⌈{p.prefill_share + p.decode_share:.2f}⌉ = {total} instances: "
            f"any split of {total} leaves prefill below {p.prefill_share:.2f} or decode below "
            f"{p.decode_share:.2f} instances, so that pool's queue grows without bound (starved)."
        )
    else:
        _console.print(f"One ceil over the sum gives the same total ({total}): no pool is starved here.")


def _print_explain(p: ProfilePlan, plan: Plan) -> None:
    pre, dec = p.prefill_need.prefill_capacity, p.decode_need.decode_capacity
    table = Table(title=f"{p.profile.name}: why ({plan.sizing.name} sizing)")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    rows = [
        ("prefill load (with headroom)", f"{p.prefill_need.prefill_load_tps:,.0f} prompt tok/s"),
        ("prefill per instance at the SLO", f"{pre.tokens_per_s:,.0f} prompt tok/s"),
        ("  utilisation ρ (M/D/1)", f"{pre.utilisation:.3f}"),
        ("  prompts per iteration", str(pre.prompts_per_iteration)),
        ("  iteration time", f"{pre.iteration_ms:.1f} ms"),
        ("  lone-request TTFT (incl. KV transfer)", f"{pre.min_ttft_ms:.1f} ms"),
        ("decode load (with headroom)", f"{p.decode_need.decode_load_tps:,.0f} gen tok/s"),
        ("decode per instance at the SLO", f"{dec.tokens_per_s:,.0f} gen tok/s"),
        ("  max batch", str(dec.max_batch)),
        ("  bounded by", dec.limited_by),
        ("  step time at max batch", f"{dec.step_ms:.2f} ms"),
        ("  KV cache holds", f"{dec.kv_max_batch} sequences"),
    ]
    for k, v in rows:
        table.add_row(k, v)
    _console.print(table)


def _verification_json(v: Verification) -> dict[str, object]:
    def one(c: object) -> object:
        if c is None:
            return None
        d = dict(vars(c))
        return {k: (None if isinstance(x, float) and not math.isfinite(x) else x) for k, x in d.items()}

    return {
        "min_attainment": v.min_attainment,
        "planned": one(v.planned),
        "one_fewer_prefill": one(v.one_fewer_prefill),
        "one_fewer_decode": one(v.one_fewer_decode),
        "tight": v.tight,
        "notes": list(v.notes),
    }


def _print_verification(v: Verification) -> None:
    table = Table(title=f"replay check (meets = SLO attainment ≥ {v.min_attainment:g})")
    for col in (
        "case",
        "prefill",
        "decode",
        "attainment",
        "P90 TTFT ms",
        "mean ITL ms",
        "unfinished",
        "meets",
        "P90 ok",
    ):
        table.add_column(col, justify="left" if col == "case" else "right")
    for name, c in (
        ("planned", v.planned),
        ("prefill − 1", v.one_fewer_prefill),
        ("decode − 1", v.one_fewer_decode),
    ):
        if c is None:
            continue
        table.add_row(
            name, str(c.prefill), str(c.decode), f"{c.slo_attainment:.4f}", _num(c.ttft_p90_ms, ".1f"),
            _num(c.itl_mean_ms, ".2f"), str(c.unfinished), "yes" if c.meets else "no",
            "yes" if c.meets_p90 else "no",
        )  # fmt: skip
    _console.print(table)
    for note in v.notes:
        _console.print(f"note: {note}")
    _console.print(
        "meets: SLO attainment (per request TTFT and mean ITL within the SLOs) >= the threshold; "
        "P90 ok: P90 TTFT and mean ITL within the SLOs (what the capacity model sizes for)"
    )
    if v.tight:
        _console.print("the plan is tight: it meets, and one fewer in each pool does not")
    else:
        _console.print("[yellow]the plan is NOT tight by attainment (see the rows above)[/yellow]")
