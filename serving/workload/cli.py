"""``pdscale trace``: inspect, summarise and generate request traces."""

from __future__ import annotations

import json
import math
import sys
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from serving.workload import formats as F
from serving.workload.errors import TraceError, TraceWarning
from serving.workload.readers import DEFAULT_MAX_REORDER_S, iter_trace_chunks
from serving.workload.stats import StatsAccumulator, TraceStats
from serving.workload.trace import Trace, concat_traces

trace_app = typer.Typer(
    name="trace",
    help=(
        "Request traces: Azure LLM CSV, Mooncake JSONL, BurstGPT CSV (detected from the file).\n\n"
        "Example: pdscale trace stats datasets/mooncake/synthetic_trace.jsonl --json stats.json"
    ),
    no_args_is_help=True,
    rich_markup_mode="rich",
)

_FORMAT_HELP = "Force the format: azure, mooncake or burstgpt (default: detect from the first line)."
_REORDER_HELP = "Rows may go back in time by at most this many seconds (re-sorted, with a warning)."


def _fail(message: str) -> typer.Exit:
    Console(stderr=True).print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return (
            "unknown (NaN)" if math.isnan(value) else f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.1f}"
        )
    return str(value)


@trace_app.command("stats")
def stats(
    file: Annotated[Path, typer.Argument(help="Trace file (CSV or JSONL).")],
    fmt: Annotated[str | None, typer.Option("--format", "-f", help=_FORMAT_HELP)] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the figures as JSON here.")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Draw request and token rates to this PNG.")
    ] = None,
    max_reorder_s: Annotated[float, typer.Option(help=_REORDER_HELP)] = DEFAULT_MAX_REORDER_S,
) -> None:
    """Summarise a trace: request count, span, mean / peak rates, burstiness, token lengths.

    Bins are aligned to the first arrival (1 s and 5 s); peaks are the largest bin count / width;
    cv_5s is the population std / mean of the 5 s counts, empty and last partial bins included.
    Streams the file, so it works on traces larger than memory allows as objects.

    Example: pdscale trace stats datasets/azure2023/AzureLLMInferenceTrace_code.dev_before_1850.csv --json code.json --plot code.png
    """
    acc = StatsAccumulator()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TraceWarning)
        try:
            for chunk in iter_trace_chunks(file, fmt, max_reorder_s=max_reorder_s):
                acc.add(chunk)
        except (TraceError, ValueError) as e:
            raise _fail(str(e)) from None
    result = acc.result()
    notes = [str(w.message) for w in caught if issubclass(w.category, TraceWarning)]
    _print_stats(file, result, notes)
    if json_out is not None:
        payload = {"file": str(file), **result.to_json_dict(), "warnings": notes}
        json_out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    if plot is not None:
        _plot(file, *acc.per_second(), plot)


def _print_stats(file: Path, result: TraceStats, notes: list[str]) -> None:
    table = Table(title=f"{file} ({result.format})", show_header=True)
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in asdict(result).items():
        if key == "models":
            for name, count in result.models.items():
                table.add_row(f"model {name}", f"{count:,}")
        else:
            table.add_row(key, _fmt(value))
    console = Console()
    console.print(table)
    for note in notes:
        console.print(f"[yellow]warning:[/] {note}", highlight=False, soft_wrap=True)


def _plot(file: Path, counts: np.ndarray, prompt: np.ndarray, output: np.ndarray, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.arange(len(counts))
    fig, (ax1, ax2) = plt.subplots(2, 1, sharex=True, figsize=(10, 6))
    ax1.plot(t, counts, lw=0.6, label="1 s")
    n5 = -(-len(counts) // 5)
    c5 = np.zeros(n5 * 5)
    c5[: len(counts)] = counts
    ax1.step(np.arange(n5) * 5, c5.reshape(-1, 5).sum(1) / 5, where="post", lw=1.0, label="5 s mean")
    ax1.set_ylabel("requests / s")
    ax1.legend()
    ax2.plot(t, prompt, lw=0.6, color="tab:green", label="prompt")
    ax2.set_ylabel("prompt tokens / s")
    ax3 = ax2.twinx()
    ax3.plot(t, output, lw=0.6, color="tab:red", alpha=0.8, label="output")
    ax3.set_ylabel("output tokens / s", color="tab:red")
    ax2.legend(handles=[*ax2.get_lines(), *ax3.get_lines()], loc="upper right")
    ax2.set_xlabel("seconds from first arrival")
    fig.suptitle(str(file))
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


@trace_app.command("head")
def head(
    file: Annotated[Path, typer.Argument(help="Trace file (CSV or JSONL).")],
    rows: Annotated[int, typer.Option("--rows", "-n", min=1, help="How many requests to show.")] = 10,
    fmt: Annotated[str | None, typer.Option("--format", "-f", help=_FORMAT_HELP)] = None,
) -> None:
    """Show the first requests of a trace as the readers see them (after parsing and re-basing).

    Example: pdscale trace head datasets/mooncake/synthetic_trace.jsonl -n 5
    """
    try:
        chosen = F.detect_format(file) if fmt is None else F.check_format(fmt)
        got: list[Trace] = []
        for part in iter_trace_chunks(file, chosen, chunk_rows=max(rows, 1024)):
            got.append(part)
            if sum(len(g) for g in got) >= rows:
                break
    except (TraceError, ValueError) as e:
        raise _fail(str(e)) from None
    chunk = concat_traces(got)
    table = Table(title=f"{file} ({chosen}, start {chunk.start_time})")
    for name in ("arrival_s", "prompt_tokens", "output_tokens", "model", "failed"):
        table.add_column(name, justify="right")
    for i in range(min(rows, len(chunk))):
        code = int(chunk.model[i])
        model = chunk.model_names[code] if code >= 0 else "-"
        table.add_row(
            f"{chunk.arrival_s[i]:.6f}",
            str(chunk.prompt_tokens[i]),
            str(chunk.output_tokens[i]),
            model,
            "yes" if chunk.failed[i] else "",
        )
    Console().print(table)


@trace_app.command("generate")
def generate_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="File to write.")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="azure, mooncake or burstgpt.")] = "azure",
    duration_s: Annotated[float, typer.Option(help="Length of the trace in seconds.")] = 600.0,
    seed: Annotated[int, typer.Option(help="Random seed; same seed and options, same trace.")] = 0,
    rate_rps: Annotated[float, typer.Option(help="Long-run mean arrival rate.")] = 5.0,
    burst_multiplier: Annotated[float, typer.Option(help="Rate in a burst / calm rate (1 = none).")] = 4.0,
    calm_mean_s: Annotated[float, typer.Option(help="Mean time between bursts.")] = 120.0,
    burst_mean_s: Annotated[float, typer.Option(help="Mean burst length.")] = 15.0,
    interarrival_cv: Annotated[float, typer.Option(help="CV of inter-arrivals (1 = Poisson).")] = 1.0,
    diurnal_amplitude: Annotated[float, typer.Option(help="Diurnal swing, 0 to <1.")] = 0.0,
    diurnal_period_s: Annotated[float, typer.Option(help="Diurnal period.")] = 86_400.0,
    prompt_median: Annotated[float, typer.Option(help="Median prompt tokens (lognormal).")] = 1000.0,
    output_median: Annotated[float, typer.Option(help="Median output tokens (lognormal).")] = 150.0,
    failure_prob: Annotated[float, typer.Option(help="Share of failed requests (0 output tokens).")] = 0.0,
    model: Annotated[list[str] | None, typer.Option(help="Model name (repeat for a mix).")] = None,
) -> None:
    """Generate a seeded synthetic trace (Markov-modulated bursts, diurnal cycle, Gamma gaps).

    The mean rate is --rate-rps; bursts multiply it by --burst-multiplier for about --burst-mean-s
    seconds every --calm-mean-s seconds; --interarrival-cv above 1 makes arrivals clumpier.

    Example: pdscale trace generate --out /tmp/w.csv --format azure --duration-s 600 --seed 1 --rate-rps 8
    """
    from dataclasses import replace

    from serving.workload.synthetic import LengthDist, SyntheticParams, generate
    from serving.workload.writers import write_trace

    base = SyntheticParams()
    params = SyntheticParams(
        duration_s=duration_s,
        rate_rps=rate_rps,
        burst_multiplier=burst_multiplier,
        calm_mean_s=calm_mean_s,
        burst_mean_s=burst_mean_s,
        interarrival_cv=interarrival_cv,
        diurnal_amplitude=diurnal_amplitude,
        diurnal_period_s=diurnal_period_s,
        prompt=replace(base.prompt, median_tokens=prompt_median),
        output=replace(LengthDist(max_tokens=base.output.max_tokens), median_tokens=output_median),
        failure_prob=failure_prob,
        model_names=tuple(model or ()),
    )
    try:
        F.check_format(fmt)
        trace = generate(params, seed)
    except ValueError as e:
        raise _fail(str(e)) from None
    write_trace(trace, out, fmt)
    Console().print(f"wrote {len(trace):,} requests over {trace.duration_s:,.1f} s to {out} ({fmt})")


if __name__ == "__main__":  # pragma: no cover
    trace_app(sys.argv[1:])
