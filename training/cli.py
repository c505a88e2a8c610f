"""``train-forecaster``: fit the LSTM+attention load forecaster, evaluate it, export inference checkpoints.

Heavy imports (torch, lightning) happen inside the commands, so ``--help`` is instant.
"""

from __future__ import annotations

import json
import logging
import math
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from training.fit import FrameSource, TraceSource
    from training.replay_frames import ReplaySource

app = typer.Typer(
    name="train-forecaster",
    help=(
        "Train and export the LSTM+attention forecaster of per-node load (next 5 s) and burst onsets.\n\n"
        "Typical run: fit on request traces (time-ordered split, the last 30 % held out), then evaluate "
        "the checkpoint on the held-out part.\n\n"
        "Example: train-forecaster fit --trace datasets/azure2023/AzureLLMInferenceTrace_code.dev_before_1850.csv "
        "--out runs/code --epochs 10"
    ),
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_show_locals=False,
)
console = Console(stderr=True)


def _parse_end_s(text: str | None) -> float:
    """``None`` → now; a number → Unix seconds; otherwise an ISO 8601 time (UTC when no zone is given)."""
    if text is None:
        return time.time()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError as e:
        raise typer.BadParameter(
            f"--end {text!r}: give Unix seconds or an ISO time (2026-11-29T10:00:00Z)"
        ) from e
    if when.tzinfo is None:
        from datetime import UTC

        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _synthetic_fn(shapes: str = "mmpp", rate_range: tuple[float, float] | None = None) -> Any:
    """The workload generator's synthetic traffic as ``(rng, duration_s) -> Trace`` (``training.synthetic``;
    ``rate_range`` None: its ``DEFAULT_RATE_RANGE``)."""
    from training.synthetic import DEFAULT_RATE_RANGE, synthetic_fn

    return synthetic_fn(shapes, DEFAULT_RATE_RANGE if rate_range is None else rate_range)


# fit and tune read Prometheus the same way (one definition of the option they share)
RoleLabelOption = Annotated[
    str,
    typer.Option(
        "--role-label",
        help="Prometheus label holding prefill/decode/mixed (as the controller's label_map.role); each "
        "channel counts the roles the controller counts; a series without it is a mixed instance.",
    ),
]


def _load_sources(
    trace: list[Path] | None,
    fmt: str | None,
    prometheus: str | None,
    *,
    range_: str,
    step: str,
    end: str | None,
    node_label: str,
    query_timeout_s: float,
    role_label: str = "role",
) -> tuple[list[TraceSource], list[FrameSource]]:
    """Read the ``--trace`` files and the ``--prometheus`` history: ``(TraceSource list, FrameSource list)``.

    Shared by ``fit`` and ``tune``, so both read their data the same way.
    """
    from serving.workload.readers import read_trace
    from training.data import sha256_file
    from training.fit import FrameSource, TraceSource
    from training.prometheus_history import connect, load_prometheus_history, parse_duration_s

    sources: list[TraceSource] = []
    for path in trace or []:
        if not path.is_file():
            raise typer.BadParameter(f"--trace {path}: no such file")
        tr = read_trace(path, fmt)
        if not tr.duration_s > 0:  # else the checkpoint would learn the synthetic traces alone, silently
            raise typer.BadParameter(
                f"--trace {path}: {len(tr):,} request(s), all on one timestamp (the trace spans 0 s): no series "
                "to learn from; pass a trace that lasts (minutes at least)"
            )
        sources.append(TraceSource(name=str(path), trace=tr, sha256=sha256_file(path)))
        console.print(
            f"[green]read[/] {path}: {len(tr):,} requests over {tr.duration_s:,.0f} s ({tr.format})"
        )
    frames: list[FrameSource] = []
    if prometheus is not None:
        step_s = parse_duration_s(step)
        range_s = parse_duration_s(range_)
        end_s = _parse_end_s(end)
        client = connect(prometheus, query_timeout_s)
        frame = load_prometheus_history(
            client,
            end_s=end_s,
            range_s=range_s,
            step_s=step_s,
            node_label=node_label,
            role_label=role_label,
            timeout_s=query_timeout_s,
            progress=lambda m: console.print(f"[dim]query[/] {m}"),
        )
        if not frame.node_ids:
            raise typer.BadParameter(
                f"--prometheus {prometheus}: no vLLM series with label {node_label!r} in the last {range_}"
            )
        console.print(
            f"[green]read[/] {prometheus}: {len(frame.node_ids)} nodes × {len(frame.times_s):,} steps"
        )
        frames.append(FrameSource(name=prometheus, frame=frame))
    return sources, frames


def _check_replay_options(
    replay: list[str] | None, fmt: str | None, policy: str, speed: float, profile: str
) -> list[ReplaySource]:
    """The replay options are valid and each ``--replay`` names a trace file or a workload (before anything is
    replayed); the sources it names (``training.replay_frames.replay_source``)."""
    from serving.sim.hardware import get_profile
    from training.replay_frames import REPLAY_POLICIES, replay_source

    if policy not in REPLAY_POLICIES:
        raise typer.BadParameter(f"--replay-policy {policy!r}: known are {', '.join(REPLAY_POLICIES)}")
    if not (math.isfinite(speed) and speed > 0):
        raise typer.BadParameter(f"--replay-speed {speed}: give a finite number > 0")
    try:
        get_profile(profile)
    except (KeyError, ValueError) as exc:
        raise typer.BadParameter(f"--replay-profile {profile!r}: {exc}") from exc
    out = []
    for spec in replay or []:
        try:
            out.append(replay_source(spec, fmt))
        except ValueError as e:
            raise typer.BadParameter(f"--replay {e}") from e
        row = out[-1].info["scored_row"]
        if row is not None:
            console.print(
                f"[yellow]note[/] --replay {spec} has the requests of the reference row {row!r}: a model trained "
                "on it is no longer scored on unseen traffic there"
            )
    return out


def _replay_sources(
    replay: list[ReplaySource], policy: str, speed: float, profile: str, *, quiet: bool = False
) -> list[FrameSource]:
    """Replay each ``--replay`` source through the simulator (``training.replay_frames.replay_frame``) with a
    progress bar; each becomes a frame source of kind "replay" whose summary names what was replayed (the trace
    file and its sha256, or the workload; the requests' sha256; the reference row it is, if any), the policy,
    the profile, the SLOs and the speed."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from training.fit import FrameSource
    from training.replay_frames import replay_frame

    out: list[FrameSource] = []
    for src in replay:
        tr = src.trace
        bar = Progress(
            TextColumn(f"replay {Path(src.spec).name}"), BarColumn(),
            TextColumn("{task.completed:,.0f}/{task.total:,.0f} s"), TimeElapsedColumn(), console=console,
            disable=quiet, transient=False,
        )  # fmt: skip
        with bar:
            task = bar.add_task("replay", total=tr.duration_s / speed)

            def tick(now_s: float, end_s: float, task: Any = task, bar: Progress = bar) -> None:
                bar.update(task, completed=min(now_s, end_s), total=end_s)

            try:
                got = replay_frame(
                    tr, policy=policy, profile=profile, speed=speed, slo_ttft_ms=src.slo_ttft_ms,
                    slo_itl_ms=src.slo_itl_ms, progress=tick,
                )  # fmt: skip
            except ValueError as e:  # an empty or zero-span trace (the options were checked before)
                raise typer.BadParameter(f"--replay {src.spec}: {e}") from e
        info = {**src.info, **got.info}
        out.append(FrameSource(name=f"replay:{src.spec}", frame=got.frame, kind="replay", info=info))
        console.print(
            f"[green]replayed[/] {src.spec} under {policy} ({profile}, speed {speed:g}): "
            f"{len(got.frame.times_s):,} ticks, SLO {got.info['replay_slo_attainment']:.2%}"
        )
    return out


@app.command("fit")
def fit_cmd(
    trace: Annotated[
        list[Path] | None,
        typer.Option(
            "--trace", help="Request trace file (repeatable): Azure CSV, Mooncake JSONL, BurstGPT CSV."
        ),
    ] = None,
    fmt: Annotated[
        str | None, typer.Option("--format", help="Trace format; detected from the file when omitted.")
    ] = None,
    prometheus: Annotated[
        str | None,
        typer.Option("--prometheus", help="Prometheus URL to read per-node vLLM metric history from."),
    ] = None,
    replay: Annotated[
        list[str] | None,
        typer.Option(
            "--replay",
            help="What to replay through the simulator (repeatable): a request trace file (or file:PATH), or a "
            "workload of bench_policies.py --workloads (code, conv, sine, mmpp, ramp, mmpp-diurnal, mmpp-holdout, "
            "mooncake; NAME@SEED for another seed of a generated one, e.g. mmpp@101) on that workload's SLOs. "
            "Trains on the per-pool inputs the loop's forecaster receives each tick (tokens counted as "
            "generated; running, waiting, KV, TTFT/ITL filled in), not on the trace's arrivals. Combinable with "
            "--trace and --prometheus. A reference row's workload (mmpp, code, ...) is then no longer unseen: "
            "the summary records it (scored_row).",
        ),
    ] = None,
    replay_policy: Annotated[
        str,
        typer.Option(
            "--replay-policy",
            help="Policy driving the replay: 'reactive' (default) or 'dynamo-like' (no forecaster: the inputs "
            "do not depend on any checkpoint; recorded as the predictive pipeline would give them to one), "
            "'predictive' (the shipped checkpoint, what the controller loads by default) or 'predictive-holt' "
            "(the Holt baseline).",
        ),
    ] = "reactive",
    replay_speed: Annotated[
        float, typer.Option("--replay-speed", help="Replay the --replay traces this many times faster (> 0).")
    ] = 1.0,
    replay_profile: Annotated[
        str, typer.Option("--replay-profile", help="Hardware profile MODEL/GPU of the replayed pool.")
    ] = "llama3-8b/a100",
    range_: Annotated[
        str, typer.Option("--range", help="History to read from Prometheus, ending at --end: 90m, 6h, 7d.")
    ] = "7d",
    step: Annotated[
        str, typer.Option("--step", help="Resolution of the Prometheus history (the model's step).")
    ] = "1s",
    end: Annotated[
        str | None,
        typer.Option("--end", help="End of the Prometheus range: Unix seconds or ISO time; default now."),
    ] = None,
    node_label: Annotated[
        str, typer.Option("--node-label", help="Prometheus label that names a node.")
    ] = "node",
    role_label: RoleLabelOption = "role",
    query_timeout_s: Annotated[
        float, typer.Option("--query-timeout-s", help="Timeout of each range query chunk.")
    ] = 60.0,
    out: Annotated[
        Path, typer.Option("--out", help="Run directory: Lightning logs and checkpoints go here.")
    ] = Path("runs"),
    epochs: Annotated[int, typer.Option(help="Maximum epochs (early stopping may end sooner).")] = 40,
    window: Annotated[int, typer.Option(help="Attention window, in steps (seconds).")] = 60,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Training sequence length in steps.")] = 256,
    burn_in: Annotated[int, typer.Option("--burn-in", help="Unscored first steps of each sequence.")] = 32,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Sequences per optimiser step.")] = 16,
    windows_per_epoch: Annotated[
        int, typer.Option("--windows-per-epoch", help="Random sequences drawn per epoch.")
    ] = 1024,
    hidden: Annotated[int, typer.Option(help="LSTM hidden size.")] = 64,
    layers: Annotated[int, typer.Option(help="LSTM layers.")] = 2,
    heads: Annotated[int, typer.Option(help="Attention heads (must divide --hidden).")] = 4,
    lr: Annotated[float, typer.Option(help="AdamW learning rate.")] = 3e-3,
    baseline_halflives: Annotated[
        str,
        typer.Option(
            "--baseline-halflives",
            help="Baseline skip: comma-separated EWMA half-lives in seconds (e.g. 10,60); the network then "
            "predicts a correction to these smoothed rates. Empty = off.",
        ),
    ] = "",
    pool_features: Annotated[
        bool,
        typer.Option(
            "--pool-features",
            help="Feature schema v2: add per-pool workload descriptors (arrival dispersion, mean prompt and "
            "output lengths over the node's history) so one model learns per-pool differences.",
        ),
    ] = False,
    level_halflife_s: Annotated[
        float,
        typer.Option(
            "--level-halflife-s",
            help="Feature schema v3: encode the rate inputs and the targets relative to the node's own "
            "trailing level (an EWMA of this half-life in seconds, e.g. 30), so a rate never seen in training "
            "is not out of distribution. 0 = off (absolute inputs, schema v1/v2).",
        ),
    ] = 0.0,
    level_of: Annotated[
        str,
        typer.Option(
            "--level-of",
            help="With --level-halflife-s: each target relative to its own rate's level ('own') or every "
            "target and rate input relative to the arrival level ('arrivals').",
        ),
    ] = "own",
    rate_range: Annotated[
        str,
        typer.Option(
            "--rate-range",
            help="Rate factors of the augmented copies, LOW,HIGH (log-uniform; thinning / superposition).",
        ),
    ] = "0.2,12",
    token_range: Annotated[
        str,
        typer.Option(
            "--token-range",
            help="Prompt/output token-length factors of the augmented copies, LOW,HIGH (log-uniform, drawn "
            "separately for prompts and outputs); e.g. 0.25,8 to cover prompts far longer than the traces'.",
        ),
    ] = "0.5,2",
    token_drift: Annotated[
        float,
        typer.Option(
            "--token-drift",
            help="Also let each augmented copy's prompt and output lengths drift over time (log-space standard"
            " deviation; 5-min correlation), so the network does not read token rates as arrivals; 0 = off.",
        ),
    ] = 0.0,
    mask_tokens: Annotated[
        float,
        typer.Option(
            "--mask-tokens",
            help="Hide both token-rate channels for a whole training sequence with this probability (0-1), so"
            " the network also learns to forecast from the arrivals alone; 0 = off (the shipped recipe).",
        ),
    ] = 0.0,
    horizon_s: Annotated[
        int, typer.Option("--horizon-s", help="Forecast horizon: totals over the next N seconds.")
    ] = 5,
    burst_lead_s: Annotated[
        int, typer.Option("--burst-lead-s", help="Burst label starts this many s before an onset.")
    ] = 3,
    burst_after_s: Annotated[
        int, typer.Option("--burst-after-s", help="...and ends this many s after it.")
    ] = 2,
    holdout_frac: Annotated[
        float, typer.Option("--holdout-frac", help="Last fraction of each source held out (never read).")
    ] = 0.3,
    val_frac: Annotated[
        float, typer.Option("--val-frac", help="Fraction before the hold-out used for validation.")
    ] = 0.1,
    copies: Annotated[
        int, typer.Option(help="Augmented copies of each training trace (time/rate/token scaling).")
    ] = 12,
    synthetic: Annotated[
        int, typer.Option(help="Synthetic bursty traces (workload generator) added to training.")
    ] = 8,
    synthetic_duration_s: Annotated[float, typer.Option("--synthetic-duration-s")] = 1800.0,
    synthetic_shapes: Annotated[
        str,
        typer.Option(
            "--synthetic-shapes",
            help="Synthetic traffic shapes: 'mmpp' (bursts only) or 'mixed' (MMPP, 30 % on a slow wave of "
            "2-60 min, 30 % level shifts of up to x8).",
        ),
    ] = "mmpp",
    synthetic_rate_range: Annotated[
        str,
        typer.Option(
            "--synthetic-rate-range", help="Mean rates of the synthetic traces, req/s LOW,HIGH (log-uniform)."
        ),
    ] = "0.5,40",
    patience: Annotated[int, typer.Option(help="Early-stopping patience in epochs.")] = 15,
    seed: Annotated[
        int, typer.Option(help="Seed of everything (splits are by time; augmentation and init use it).")
    ] = 0,
    accelerator: Annotated[str, typer.Option(help="cpu, gpu, auto (GPU when present).")] = "auto",
    devices: Annotated[
        str, typer.Option(help="Number of devices or 'auto' (several GPUs: use --strategy ddp).")
    ] = "auto",
    strategy: Annotated[str, typer.Option(help="Lightning strategy: auto, ddp, ...")] = "auto",
    max_minutes: Annotated[
        float | None, typer.Option("--max-minutes", help="Stop training after this wall time.")
    ] = None,
    threads: Annotated[
        int | None,
        typer.Option(
            help="torch CPU threads; 0 = torch's choice. 1 is fastest for this small LSTM on a busy CPU."
        ),
    ] = 1,
    checkpoint_out: Annotated[
        Path | None, typer.Option("--checkpoint-out", help="Also copy the inference checkpoint to this path.")
    ] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the run summary as JSON here.")
    ] = None,
    quiet: Annotated[bool, typer.Option(help="No progress bar.")] = False,
    resume: Annotated[
        Path | None,
        typer.Option(
            help="Continue an earlier run of the same command from its Lightning .ckpt (e.g. last.ckpt)."
        ),
    ] = None,
) -> None:
    """Fit the forecaster on request traces and/or Prometheus history; write an inference checkpoint.

    Every source is split by time: the last --holdout-frac is never read (keep it for `evaluate`), the
    --val-frac before it is validation (early stopping, best epoch). Augmentation (time/rate/token
    scaling, superposition, synthetic bursts, channel masking) only sees the training part. Normalisation
    statistics come from the training part only.

    Writes OUT/forecaster.safetensors (weights + schema + normaliser + horizon + data summary) and
    OUT/lightning/ (CSV logs, best .ckpt).

    Examples:

      train-forecaster fit --trace datasets/azure2023/AzureLLMInferenceTrace_code.dev_before_1850.csv
        --trace datasets/azure2023/AzureLLMInferenceTrace_conv.dev_before_1850.csv --out runs/azure --epochs 20

      train-forecaster fit --prometheus http://127.0.0.1:9090 --range 7d --step 1s --out runs/prod

      train-forecaster fit --replay datasets/azure2023/AzureLLMInferenceTrace_code.dev_before_1850.csv
        --trace datasets/azure2023/AzureLLMInferenceTrace_code.dev_before_1850.csv --out runs/replay

      train-forecaster fit --trace datasets/azure2023/AzureLLMInferenceTrace_code.dev_before_1850.csv
        --replay mmpp@101 --replay sine@101 --replay-policy reactive --out runs/replay-gen

    --replay replays a trace or a named workload through the simulator (the engine of `pdscale replay`) under
    --replay-policy and trains on what the loop's forecaster received (or, under a baseline policy, would have
    received) each tick, per pool (docs/FORECASTER.md, "Training on replayed
    traces").
    """
    import dataclasses
    import shutil

    import numpy as np

    from forecaster.features import DEFAULT_SCHEMA, LEVEL_SCHEMA_VERSION, LEVEL_SOURCES, POOL_SCHEMA
    from training.augment import MaskingConfig
    from training.datamodule import WindowConfig
    from training.fit import AugmentConfig, LabelConfig, TrainerConfig, build_series, fit_forecaster

    if not trace and not replay and prometheus is None and synthetic == 0:
        raise typer.BadParameter(
            "give at least one --trace FILE, --replay FILE|WORKLOAD, --prometheus URL, or --synthetic N > 0"
        )
    # option checks before any source is read (a Prometheus range can take minutes)
    replays = _check_replay_options(replay, fmt, replay_policy, replay_speed, replay_profile)
    rates = _float_list(rate_range, "--rate-range")
    if len(rates) != 2 or not 0 < rates[0] <= rates[1]:
        raise typer.BadParameter(f"--rate-range {rate_range!r}: give LOW,HIGH with 0 < LOW <= HIGH")
    tokens = _float_list(token_range, "--token-range")
    if len(tokens) != 2 or not 0 < tokens[0] <= tokens[1]:
        raise typer.BadParameter(f"--token-range {token_range!r}: give LOW,HIGH with 0 < LOW <= HIGH")
    if not (token_drift >= 0 and math.isfinite(token_drift)):
        raise typer.BadParameter(
            f"--token-drift {token_drift!r}: give a log-space standard deviation >= 0 (0 = off)"
        )
    if not 0 <= mask_tokens <= 1:
        raise typer.BadParameter(f"--mask-tokens {mask_tokens!r}: give a probability in [0, 1] (0 = off)")
    syn_rates = _float_list(synthetic_rate_range, "--synthetic-rate-range")
    if len(syn_rates) != 2 or not 0 < syn_rates[0] <= syn_rates[1]:
        raise typer.BadParameter(
            f"--synthetic-rate-range {synthetic_rate_range!r}: give LOW,HIGH with 0 < LOW <= HIGH"
        )
    from training.synthetic import DEFAULT_RATE_RANGE, SHAPES

    if synthetic_shapes not in SHAPES:
        raise typer.BadParameter(f"--synthetic-shapes {synthetic_shapes!r}: one of {', '.join(SHAPES)}")
    if level_halflife_s < 0:
        raise typer.BadParameter(f"--level-halflife-s {level_halflife_s}: must be >= 0 seconds (0 = off)")
    if level_of not in LEVEL_SOURCES:
        raise typer.BadParameter(f"--level-of {level_of!r}: one of {', '.join(LEVEL_SOURCES)}")
    if level_of != "own" and level_halflife_s == 0:
        raise typer.BadParameter(f"--level-of {level_of!r} needs --level-halflife-s > 0 (it is off)")
    schema = POOL_SCHEMA if pool_features else DEFAULT_SCHEMA
    if level_halflife_s > 0:
        schema = dataclasses.replace(
            schema, version=LEVEL_SCHEMA_VERSION, level_halflife_s=level_halflife_s, level_of=level_of
        )
    sources, frames = _load_sources(
        trace, fmt, prometheus, range_=range_, step=step, end=end, node_label=node_label,
        query_timeout_s=query_timeout_s, role_label=role_label,
    )  # fmt: skip
    frames += _replay_sources(replays, replay_policy, replay_speed, replay_profile, quiet=quiet)
    labels = LabelConfig(
        horizon_s=horizon_s,
        lead_s=burst_lead_s,
        after_s=burst_after_s,
        holdout_frac=holdout_frac,
        val_frac=val_frac,
    )
    masking = MaskingConfig(token_prob=mask_tokens)
    augment = AugmentConfig(
        rate_range=(rates[0], rates[1]),
        token_range=(tokens[0], tokens[1]),
        token_drift=token_drift,
        copies_per_source=copies,
        synthetic_traces=synthetic,
        synthetic_duration_s=synthetic_duration_s,
        masking=masking,
    )
    series = build_series(
        sources,
        frames,
        labels=labels,
        augment=augment,
        synthetic=_synthetic_fn(synthetic_shapes, (syn_rates[0], syn_rates[1])) if synthetic > 0 else None,
        synthetic_info=None
        if synthetic_shapes == "mmpp" and syn_rates == DEFAULT_RATE_RANGE
        else {"shapes": synthetic_shapes, "rate_range": list(syn_rates)},
        seed=seed,
    )
    s = series.summary
    console.print(
        f"training: {s['train_series']} series, {s['train_steps']:,} steps, {s['train_onsets']} burst onsets; "
        f"validation: {s['val_series']} series, {s['val_steps']:,} steps, {s['val_onsets']} onsets"
    )
    result = fit_forecaster(
        series,
        out,
        window=WindowConfig(
            seq_len=seq_len,
            burn_in=burn_in,
            batch_size=batch_size,
            windows_per_epoch=windows_per_epoch,
            seed=seed,
        ),
        net_hidden=hidden,
        net_layers=layers,
        net_heads=heads,
        net_window=window,
        net_baseline_halflives=_float_list(baseline_halflives, "--baseline-halflives"),
        lr=lr,
        trainer=TrainerConfig(
            max_epochs=epochs,
            max_minutes=max_minutes,
            patience=patience,
            accelerator=accelerator,
            devices=devices,
            strategy=strategy,
            progress=not quiet,
            num_threads=threads or None,
        ),
        masking=masking,
        schema=schema,
        horizon_s=float(horizon_s),
        log=lambda m: console.print(m),
        resume=resume,
    )
    if checkpoint_out is not None:
        checkpoint_out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(result.checkpoint, checkpoint_out)
        console.print(f"[green]copied[/] checkpoint to {checkpoint_out}")
    table = Table(title="train-forecaster fit")
    table.add_column("field")
    table.add_column("value")
    for k, v in (
        ("checkpoint", str(result.checkpoint)),
        ("model_version", result.model_version),
        ("epochs", str(result.epochs)),
        ("best val_loss", f"{result.best_val_loss:.4f}"),
        (
            "train windows/s",
            f"{result.train_windows_per_s:,.0f}" if np.isfinite(result.train_windows_per_s) else "-",
        ),
        ("wall", f"{result.wall_s:,.1f} s"),
    ):
        table.add_row(k, v)
    Console().print(table)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(
            json.dumps(
                {
                    "checkpoint": str(result.checkpoint),
                    "lightning_ckpt": str(result.lightning_ckpt) if result.lightning_ckpt else None,
                    "model_version": result.model_version,
                    "epochs": result.epochs,
                    "best_val_loss": result.best_val_loss,
                    "train_windows_per_s": result.train_windows_per_s,
                    "wall_s": result.wall_s,
                    "summary": result.summary,
                },
                indent=2,
                allow_nan=False,
                default=str,
            )
        )


@app.command("export")
def export_cmd(
    checkpoint: Annotated[
        Path,
        typer.Option("--checkpoint", help="Lightning .ckpt written by `fit` (OUT/lightning/checkpoints/)."),
    ],
    out: Annotated[Path, typer.Option("--out", help="Inference checkpoint to write (.safetensors).")],
) -> None:
    """Write the small inference checkpoint (safetensors + metadata) from a Lightning .ckpt.

    The .ckpt must come from `train-forecaster fit` (its hyper-parameters carry the feature schema,
    normaliser, horizon and data summary). Loaded with torch.load(weights_only=True): no pickle code runs.

    Example: train-forecaster export --checkpoint runs/azure/lightning/checkpoints/last.ckpt --out model.safetensors
    """
    from training.export import export_lightning_checkpoint

    version = export_lightning_checkpoint(checkpoint, out)
    Console().print(f"wrote {out} (model_version {version})")


def _float_list(text: str, option: str) -> tuple[float, ...]:
    """``"10,60"`` → ``(10.0, 60.0)``; empty → ``()``; anything else not a positive number is an error."""
    out: list[float] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            v = float(part)
        except ValueError:
            raise typer.BadParameter(f"{option}: {part!r} is not a number") from None
        if not v > 0:
            raise typer.BadParameter(f"{option}: values must be positive, got {part!r}")
        out.append(v)
    return tuple(out)


def _int_list(text: str, option: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as e:
        raise typer.BadParameter(f"{option} {text!r}: give comma-separated integers, e.g. 30,60,120") from e
    if not values:
        raise typer.BadParameter(f"{option} {text!r}: give at least one value")
    return values


@app.command("tune")
def tune_cmd(
    trace: Annotated[
        list[Path] | None,
        typer.Option(
            "--trace", help="Request trace file (repeatable): Azure CSV, Mooncake JSONL, BurstGPT CSV."
        ),
    ] = None,
    fmt: Annotated[
        str | None, typer.Option("--format", help="Trace format; detected from the file when omitted.")
    ] = None,
    prometheus: Annotated[
        str | None,
        typer.Option("--prometheus", help="Prometheus URL to read per-node vLLM metric history from."),
    ] = None,
    range_: Annotated[str, typer.Option("--range", help="Prometheus history, ending at --end.")] = "7d",
    step: Annotated[str, typer.Option("--step", help="Resolution of the Prometheus history.")] = "1s",
    end: Annotated[
        str | None, typer.Option("--end", help="End of the Prometheus range: Unix seconds or ISO time.")
    ] = None,
    node_label: Annotated[
        str, typer.Option("--node-label", help="Prometheus label that names a node.")
    ] = "node",
    role_label: RoleLabelOption = "role",
    query_timeout_s: Annotated[float, typer.Option("--query-timeout-s")] = 60.0,
    trials: Annotated[int, typer.Option(help="Trials this process runs (others may join the study).")] = 20,
    storage: Annotated[
        str | None,
        typer.Option(help="Optuna storage URL; default sqlite:///OUT/tune.db. PostgreSQL for many machines."),
    ] = None,
    study: Annotated[str, typer.Option("--study", help="Study name (joined when it exists).")] = "forecaster",
    objective: Annotated[
        str,
        typer.Option(
            help="mae-ratio: learned MAE / best baseline MAE on each trace's validation slice (mean over "
            "traces; goal <= 0.85). val-loss: the best epoch's validation loss. Default: mae-ratio when "
            "--trace is given, else val-loss."
        ),
    ] = "auto",
    out: Annotated[
        Path, typer.Option("--out", help="Directory: trials/, best.safetensors, best.json, tune.db.")
    ] = Path("runs/tune"),
    plots: Annotated[
        Path | None, typer.Option(help="Write PNGs here: optimisation history, val_loss curves, importances.")
    ] = None,
    epochs: Annotated[int, typer.Option(help="Maximum epochs per trial.")] = 10,
    patience: Annotated[int, typer.Option(help="Early-stopping patience of a trial, in epochs.")] = 5,
    windows: Annotated[
        str, typer.Option(help="Attention windows to try (steps), comma-separated.")
    ] = "30,60,120",
    hidden_sizes: Annotated[
        str, typer.Option("--hidden-sizes", help="LSTM hidden sizes to try.")
    ] = "32,64,128",
    heads: Annotated[
        str, typer.Option(help="Attention head counts to try (each divides every hidden size).")
    ] = ("1,2,4,8"),
    lr_min: Annotated[float, typer.Option("--lr-min", help="Learning rate range, log-uniform.")] = 1e-3,
    lr_max: Annotated[float, typer.Option("--lr-max")] = 1e-2,
    layers: Annotated[int, typer.Option(help="LSTM layers (fixed in the sweep).")] = 2,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Training sequence length in steps.")] = 256,
    burn_in: Annotated[int, typer.Option("--burn-in", help="Unscored first steps of each sequence.")] = 32,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Sequences per optimiser step.")] = 16,
    windows_per_epoch: Annotated[
        int, typer.Option("--windows-per-epoch", help="Random sequences drawn per epoch.")
    ] = 1024,
    horizon_s: Annotated[int, typer.Option("--horizon-s", help="Forecast horizon in seconds.")] = 5,
    holdout_frac: Annotated[
        float, typer.Option("--holdout-frac", help="Last fraction of each source held out (never read).")
    ] = 0.3,
    val_frac: Annotated[
        float, typer.Option("--val-frac", help="Fraction before the hold-out: validation and the objective.")
    ] = 0.1,
    copies: Annotated[int, typer.Option(help="Augmented copies of each training trace.")] = 12,
    synthetic: Annotated[int, typer.Option(help="Synthetic bursty traces added to training.")] = 8,
    synthetic_duration_s: Annotated[float, typer.Option("--synthetic-duration-s")] = 1800.0,
    startup_trials: Annotated[
        int, typer.Option("--startup-trials", help="Completed trials before the median pruner prunes.")
    ] = 3,
    no_prune: Annotated[bool, typer.Option("--no-prune", help="Never prune (run every trial out).")] = False,
    enqueue_defaults: Annotated[
        bool,
        typer.Option(
            "--defaults-first/--no-defaults-first",
            help="A new study's first trial uses fit's defaults (window 60, hidden 64, 4 heads, lr 3e-3).",
        ),
    ] = True,
    arima: Annotated[
        bool, typer.Option("--arima/--no-arima", help="Count ARIMA among the baselines of mae-ratio.")
    ] = True,
    max_minutes_per_trial: Annotated[
        float | None, typer.Option("--max-minutes-per-trial", help="Wall limit of one trial's training.")
    ] = None,
    timeout_minutes: Annotated[
        float | None,
        typer.Option("--timeout-minutes", help="Start no new trial after this wall time (whole sweep)."),
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Seed of the data, of every trial's training and of the sampler.")
    ] = 0,
    accelerator: Annotated[str, typer.Option(help="cpu or gpu (one device per trial).")] = "cpu",
    threads: Annotated[int, typer.Option(help="torch CPU threads; 0 = torch's choice.")] = 1,
    quiet: Annotated[bool, typer.Option(help="No progress bar.")] = False,
) -> None:
    """Sweep the forecaster's hyper-parameters (attention window, hidden size, heads, learning rate) with Optuna.

    The data are read and split exactly as `fit` does (same options), once. Every trial trains with
    Lightning and reports val_loss after each epoch to Optuna's PyTorchLightningPruningCallback; the
    median pruner stops trials whose curve lags. A completed trial is scored by --objective: with traces,
    the learned model's MAE on each trace's validation slice over the best simple baseline's (the
    `evaluate` protocol; the hold-out stays unread for an honest `evaluate` later).

    Writes OUT/best.safetensors (the best trial, loadable like any `fit`/`export` checkpoint),
    OUT/best.json (params, score, per-trace figures), OUT/trials/ (every completed trial) and, by
    default, the study in OUT/tune.db. Run the same command in several shells with one --storage and
    --study to share the trials. Cost: one `fit` of --epochs per trial (5-6 minutes for 8 epochs of the
    default size on these 2 busy cores), plus a few seconds of scoring.

    Example:

      train-forecaster tune --trace datasets/azure2023/AzureLLMInferenceTrace_code.dev_before_1850.csv
        --trace datasets/azure2023/AzureLLMInferenceTrace_conv.dev_before_1850.csv
        --trials 20 --epochs 8 --out runs/tune --plots runs/tune/plots
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from training.augment import MaskingConfig
    from training.datamodule import WindowConfig
    from training.fit import AugmentConfig, LabelConfig, build_series
    from training.tune_forecaster import (
        Objective,
        SearchSpace,
        TuneConfig,
        TuneError,
        open_study,
        tune_forecaster,
        write_plots,
    )

    if not trace and prometheus is None and synthetic == 0:
        raise typer.BadParameter("give at least one --trace FILE, --prometheus URL, or --synthetic N > 0")
    # one Trainer per trial: its per-run banner (GPU available, fit stopped, ...) would bury the progress bar
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    if objective == "auto":
        chosen = Objective.mae_ratio if trace else Objective.val_loss
    else:
        try:
            chosen = Objective(objective)
        except ValueError as e:
            raise typer.BadParameter(f"--objective {objective!r}: one of auto, mae-ratio, val-loss") from e
    try:
        space = SearchSpace(
            windows=_int_list(windows, "--windows"),
            hidden_sizes=_int_list(hidden_sizes, "--hidden-sizes"),
            heads=_int_list(heads, "--heads"),
            lr_range=(lr_min, lr_max),
        )
        masking = MaskingConfig()
        config = TuneConfig(
            trials=trials,
            epochs=epochs,
            patience=patience,
            layers=layers,
            seed=seed,
            objective=chosen,
            window=WindowConfig(
                seq_len=seq_len,
                burn_in=burn_in,
                batch_size=batch_size,
                windows_per_epoch=windows_per_epoch,
                seed=seed,
            ),
            masking=masking,
            horizon_s=horizon_s,
            startup_trials=startup_trials,
            max_minutes_per_trial=max_minutes_per_trial,
            accelerator=accelerator,
            num_threads=threads or None,
            with_arima=arima,
            timeout_s=timeout_minutes * 60.0 if timeout_minutes is not None else None,
            enqueue_defaults=enqueue_defaults,
        )
        if storage is not None:
            open_study(storage, study, seed=seed)  # a bad URL fails before the data are read
    except (TuneError, ValueError) as e:
        console.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from e
    sources, frames = _load_sources(
        trace, fmt, prometheus, range_=range_, step=step, end=end, node_label=node_label,
        query_timeout_s=query_timeout_s, role_label=role_label,
    )  # fmt: skip
    labels = LabelConfig(horizon_s=horizon_s, holdout_frac=holdout_frac, val_frac=val_frac)
    series = build_series(
        sources,
        frames,
        labels=labels,
        augment=AugmentConfig(
            copies_per_source=copies,
            synthetic_traces=synthetic,
            synthetic_duration_s=synthetic_duration_s,
            masking=masking,
        ),
        synthetic=_synthetic_fn() if synthetic > 0 else None,
        seed=seed,
    )
    s = series.summary
    console.print(
        f"training: {s['train_series']} series, {s['train_steps']:,} steps; validation: {s['val_series']} "
        f"series, {s['val_steps']:,} steps; objective {chosen}"
    )
    pruner = None
    if no_prune:
        import optuna

        pruner = optuna.pruners.NopPruner()
    progress = Progress(
        TextColumn("[bold]trials"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=console,
        disable=quiet,
    )
    with progress:
        task = progress.add_task("", total=trials)

        def on_trial(st: Any, ft: Any) -> None:
            value = "pruned" if ft.value is None else f"{ft.value:.4f}"
            try:
                best = f"best {st.best_value:.4f} (#{st.best_trial.number})"
            except ValueError:
                best = "no trial completed yet"
            progress.update(task, advance=1, description=f"#{ft.number} {ft.state.name} {value}; {best}")

        try:
            result = tune_forecaster(
                series,
                out,
                traces=sources,
                labels=labels,
                space=space,
                config=config,
                storage=storage,
                study_name=study,
                pruner=pruner,
                on_trial=on_trial,
                log=lambda m: console.print(m),
            )
        except TuneError as e:
            console.print(f"[red]error:[/] {e}")
            raise typer.Exit(2) from e
    table = Table(title=f"train-forecaster tune: study {result.study_name}")
    table.add_column("field")
    table.add_column("value")
    table.add_row("best trial", f"#{result.best_number}")
    table.add_row(f"best {chosen}", f"{result.best_value:.4f}")
    for k, v in result.best_params.items():
        table.add_row(k, f"{v:.3g}" if isinstance(v, float) else str(v))
    for name, fig in (result.best_attrs.get("traces") or {}).items():
        table.add_row(
            f"  {Path(name).name}",
            f"learned MAE {fig['learned_mae']:.3f} / {fig['best_baseline']} {fig['best_baseline_mae']:.3f}"
            f" = {fig['mae_ratio']:.3f}",
        )
    table.add_row("trials by state", ", ".join(f"{k} {v}" for k, v in sorted(result.states.items())))
    table.add_row("checkpoint", str(result.checkpoint))
    table.add_row("summary", str(result.summary_json))
    table.add_row("wall", f"{result.wall_s:,.1f} s")
    Console().print(table)
    if plots is not None:
        import optuna

        st = optuna.load_study(study_name=result.study_name, storage=result.storage)
        for path in write_plots(st, plots, log=lambda m: console.print(m)):
            console.print(f"[green]wrote[/] {path}")


try:
    from training.evaluate import evaluate_cmd
except ModuleNotFoundError as _missing:
    if _missing.name != "training.evaluate":
        raise

    @app.command("evaluate")
    def evaluate_unavailable() -> None:
        """Evaluate a checkpoint on held-out traffic (not available yet in this build).

        Example: train-forecaster evaluate --checkpoint forecaster/checkpoints/forecaster.safetensors
        """
        console.print(
            "[red]train-forecaster evaluate is not available yet: training/evaluate.py is missing[/]"
        )
        raise typer.Exit(code=2)

else:
    app.command("evaluate")(evaluate_cmd)


def main() -> None:
    """Console-script entry point (``train-forecaster``)."""
    app()


if __name__ == "__main__":
    main()
