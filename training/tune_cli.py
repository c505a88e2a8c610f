"""``pdscale tune``: Optuna sweeps of the predictive controller on trace replays (logic in training/tune.py)."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from training.tune import Comparison, Evaluation


def _fail(message: str) -> typer.Exit:
    Console(stderr=True).print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


def _pct(x: float) -> str:
    return "unknown" if math.isnan(x) else f"{x:.2%}"


def tune_cmd(
    trace: Annotated[
        list[str],
        typer.Option(
            "--trace",
            "-t",
            help="Training trace (Azure CSV, Mooncake JSONL, BurstGPT CSV), optionally FILE:key=value,... with "
            "keys ttft_ms, itl_ms, duration_s, slo_target (this trace's own); repeat (each trace weighs the same).",
        ),
    ],
    trials: Annotated[
        int,
        typer.Option("--trials", "-n", min=1, help="Finished trials the study should hold (all workers)."),
    ] = 50,
    storage: Annotated[
        str | None,
        typer.Option(
            help="Optuna RDB URL; default sqlite:///tune.db beside --out (PostgreSQL for many machines)."
        ),
    ] = None,
    study: Annotated[
        str, typer.Option("--study", help="Study name; workers with the same name share it.")
    ] = ("pdscale-tune"),
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Best trial as a controller config (default STUDY-best.yaml)."),
    ] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the results as JSON here.")] = None,
    plots: Annotated[
        Path | None,
        typer.Option("--plots", help="Write Pareto front, history and importance PNGs to this folder."),
    ] = None,
    objective: Annotated[
        str,
        typer.Option(
            help="improve (beat the defaults on every trace: GPU-s ratio, SLO kept), pareto (NSGA-II, SLO "
            "violation and GPU-s) or constrained (SLO >= target, min GPU-s)."
        ),
    ] = "improve",
    slo_target: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            max=1.0,
            help="SLO attainment to reach; default 0.99 (constrained, pareto), none (improve: keep each trace's "
            "defaults' SLO; a target above a trace's defaults is chased when reachable).",
        ),
    ] = None,
    penalty: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            help="GPU-s (ratio) x (1 + PENALTY x SLO deficit); default 100 (improve), 10 (constrained).",
        ),
    ] = None,
    chunks: Annotated[
        int, typer.Option(min=1, help="Split each trace into CHUNKS time windows: one pruning step each.")
    ] = 3,
    forecaster: Annotated[
        str, typer.Option(help="default (the shipped learned checkpoint) or holt (cheaper baseline).")
    ] = "default",
    duration_s: Annotated[
        float | None, typer.Option(help="Tune on each --trace's first DURATION_S seconds only.")
    ] = None,
    holdout: Annotated[
        list[str] | None,
        typer.Option(
            "--holdout",
            "--test-trace",
            help="Held-out trace (FILE[:key=value,...] as --trace): replay defaults and best on it afterwards, "
            "with a verdict; repeat.",
        ),
    ] = None,
    around_defaults: Annotated[
        float | None,
        typer.Option(
            min=1.0,
            help="Search only near the defaults: floats within x/FACTOR..x*FACTOR, integers +-1 (default: all).",
        ),
    ] = None,
    profile: Annotated[str, typer.Option(help="Hardware profile MODEL/GPU.")] = "llama3-8b/a100",
    slo_ttft_ms: Annotated[float, typer.Option(help="TTFT SLO, ms.")] = 1000.0,
    slo_itl_ms: Annotated[float, typer.Option(help="Mean inter-token latency SLO, ms.")] = 50.0,
    seed: Annotated[int, typer.Option(help="Sampler seed; this worker uses SEED + WORKER_INDEX.")] = 0,
    worker_index: Annotated[
        int, typer.Option(min=0, help="Give each worker on a study its own index (distinct sampler seeds).")
    ] = 0,
    prune_startup: Annotated[
        int, typer.Option(min=0, help="Constrained: no pruning before this many trials have finished.")
    ] = 5,
    prune_warmup: Annotated[
        int, typer.Option(min=0, help="Constrained: no pruning before this step (chunk index, from 0).")
    ] = 1,
) -> None:
    """Tune the predictive controller's parameters with Optuna; each trial replays the traces in the simulator.

    Searched (training/tune.py SEARCH_SPACE): buffer multiplier, standby prefill/decode counts, burst
    threshold, QPS change-rate alert, ramp-up, scale-down delay, headroom, P:D ratio bounds.

    [bold]--objective improve[/] (default): beat the shipped defaults on every training trace. The defaults
    are replayed once first; per trace a trial scores GPU-s / defaults' GPU-s x (1 + PENALTY x SLO deficit),
    the deficit against max(defaults' SLO, target) when the target is reachable (the defaults or the most
    generous corner of the space reach it), else against the defaults' own SLO (no --slo-target by default:
    every trace keeps its defaults' SLO); the study minimises the mean
    over traces (each weighs the same). Below 1 = fewer GPU-s with every trace's SLO kept. Pruned per chunk
    against the median, like constrained.
    [bold]--objective constrained[/]: minimise GPU-seconds x (1 + PENALTY x SLO deficit) with TPE;
    a penalty rather than an Optuna constraint, so that the search still weighs cost while no trial reaches
    the target. After each chunk the objective projected from the chunks done so far is reported and a trial
    worse than the median of the completed trials at the same chunk is pruned (after --prune-startup trials
    and --prune-warmup chunks). Each chunk is replayed on its own (the fleet starts warm; nothing carries
    over a boundary).
    [bold]--objective pareto[/]: NSGA-II on (SLO violation rate, GPU-seconds), a Pareto front; Optuna cannot
    prune multi-objective studies, so every trial replays every chunk.

    Written config: improve, the least score; otherwise of the completed trials meeting --slo-target, the one
    with the least GPU-s; when none does, the least penalised GPU-s (constrained) or the best SLO (pareto).
    Its pool carries --slo-ttft-ms/--slo-itl-ms (not a trace's own). `pdscale config check` and `pdscale controller --config` take it
    as it is; it lists only the fields that differ from the defaults.

    Workers: every `pdscale tune` pointed at the same --storage and --study shares the study; each runs trials
    until the study holds --trials finished (complete + pruned) trials, counting the ones others are running.
    SQLite suits one machine; give several machines a PostgreSQL URL. Give each worker its own --worker-index.

    --holdout (alias --test-trace) replays the shipped defaults and the tuned config on held-out traces: the
    split table (a row per training and held-out trace) with a verdict each: dominates (better on SLO or GPU-s,
    worse on neither; 0.1 point and 1 % tolerances), same, trade-off, worse.

    Example:
      pdscale tune --trace datasets/azure2023/AzureLLMInferenceTrace_code.dev_before_1850.csv --duration-s 1800
        --trials 50 --study code30 --out best.yaml --plots plots/
        --holdout datasets/azure2023/AzureLLMInferenceTrace_conv.dev_before_1850.csv
        --holdout datasets/mooncake/synthetic_trace.jsonl:ttft_ms=10000
    """
    import logging
    import warnings

    import optuna
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from serving.workload.readers import read_trace
    from training import tune

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("controller.forecasting").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    console = Console()
    wall0 = time.perf_counter()
    if objective not in tune.MODES:
        raise _fail(f"--objective {objective!r}: expected one of {tune.MODES}")
    settings = tune.TuneSettings(
        mode=cast("tune.Mode", objective),
        slo_target=tune.DEFAULT_SLO_TARGET[objective] if slo_target is None else slo_target,
        penalty=tune.DEFAULT_PENALTY[objective] if penalty is None else penalty,
        chunks=chunks,
        forecaster=forecaster,
        traces=tuple(trace),
        duration_s=duration_s,
        profile=profile,
        slo_ttft_ms=slo_ttft_ms,
        slo_itl_ms=slo_itl_ms,
        around_defaults=around_defaults,
    )
    problems = settings.problems()
    if problems:
        raise _fail("; ".join(problems))
    out = out or Path(f"{study}-best.yaml")
    url = storage or f"sqlite:///{(out.parent / 'tune.db').as_posix()}"
    try:
        train_specs = [tune.parse_trace_spec(t, "--trace") for t in trace]
        test_specs = [tune.parse_trace_spec(t, "--holdout") for t in holdout or []]
        train = [(sp.text, read_trace(Path(sp.path))) for sp in train_specs]
        tests = [(sp.text, read_trace(Path(sp.path))) for sp in test_specs]
        steps = tune.load_steps(settings, train)
        test_steps = tune.load_steps(replace(settings, duration_s=None), tests, chunks=1, option="--holdout")
        make_forecaster = tune.forecaster_factory(forecaster)
        the_study = tune.open_study(
            settings, tune.storage_for(url), study, seed=seed, worker=worker_index, n_trials=trials,
            prune_startup=prune_startup, prune_warmup=prune_warmup,
        )  # fmt: skip
    except (OSError, ValueError) as exc:
        raise _fail(str(exc)) from None
    _warn_same_index(the_study, worker_index, console)
    console.print(
        f"study [bold]{study}[/] at {url}: {settings.mode}, {len(steps)} step(s) per trial, "
        f"forecaster {forecaster}, worker {worker_index} (seed {seed + worker_index})",
        highlight=False,
    )
    baseline = None
    if settings.mode == "improve":
        baseline = tune.make_baseline(steps, make_forecaster, settings.slo_target)
        for name, b in baseline.to_json().items():
            probe = b["probe_slo_attainment"]
            console.print(
                f"defaults on {name}: SLO {_pct(b['default']['slo_attainment'])}, "
                f"{b['default']['gpu_seconds']:,.0f} GPU-s; target {b['slo_target']:.2%} "
                + ("reached" if probe is None else f"{'reachable' if b['target_reachable'] else 'unreachable'} "
                   f"(most generous config: {_pct(probe)})")
                + f"; a trial must keep SLO >= {b['reference_slo']:.2%}",
                highlight=False,
            )  # fmt: skip
    objective_fn = tune.make_objective(settings, steps, make_forecaster, worker_index, baseline)
    progress = Progress(
        TextColumn(f"worker {worker_index}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[best]}"),
        TimeElapsedColumn(), console=Console(stderr=True),
    )  # fmt: skip
    with progress:
        done0, _ = tune.finished_count(the_study)
        task = progress.add_task("trials", total=trials, completed=min(done0, trials), best="")

        def on_trial(st: optuna.Study, _trial: optuna.trial.FrozenTrial) -> None:
            done, _ = tune.finished_count(st)
            cands = tune.candidates(st)
            best = ""
            if cands:
                c = tune.choose_for(cands, settings, baseline).candidate
                best = f"best #{c.number}: SLO {c.slo_attainment:.2%}, {c.gpu_seconds:,.0f} GPU-s"
                if c.score is not None:
                    best += f", score {c.score:.3f}"
            progress.update(task, completed=min(done, trials), best=best)

        mine = tune.run_worker(the_study, objective_fn, trials, on_trial=on_trial)
    doc = _report(the_study, settings, study, url, out, mine, console, baseline)
    if doc is None:
        raise typer.Exit(code=1)
    if baseline is not None:
        doc["baseline"] = baseline.to_json()
        doc["defaults_score"] = baseline.default_score(settings.penalty)
    chosen = tune.config_from_params(doc["best"]["params"])
    comparisons = tune.split_table(
        steps, test_steps, chosen, make_forecaster, train_default=baseline.default if baseline else None
    )
    console.print(_comparison_table(comparisons))
    if baseline is not None:
        doc["defaults_better"] = not doc["best"]["feasible"]  # the defaults were kept
    else:
        on_train = [c for c in comparisons if c.role == "train"]
        d_slo = sum(c.default.slo_attainment * c.default.requests for c in on_train) / max(
            sum(c.default.requests for c in on_train), 1
        )
        defaults = tune.Candidate(10**9, d_slo, sum(c.default.gpu_seconds for c in on_train))
        best = tune.Candidate(doc["best"]["trial"], doc["best"]["slo_attainment"], doc["best"]["gpu_seconds"])
        doc["defaults_better"] = (
            tune.choose([best, defaults], settings.slo_target, settings.choice_penalty).candidate is defaults
        )
    if doc["defaults_better"] and baseline is not None:
        console.print(
            "[yellow]warning:[/] no trial beat the shipped defaults on the training traces: the written config is "
            "the defaults (more --trials may find one; the split table then compares the defaults with themselves)",
            highlight=False,
        )
    elif doc["defaults_better"]:
        console.print(
            "[yellow]warning:[/] the shipped defaults beat every trial on the training traces by the same rule: "
            "run more --trials before deploying the written config",
            highlight=False,
        )
    doc["comparisons"] = [c.to_json() for c in comparisons]
    doc["held_out_verdicts"] = {c.name: c.verdict for c in comparisons if c.role == "held-out"}
    if plots is not None:
        files, notes = tune.write_plots(the_study, plots, settings.mode)
        doc["plots"] = [str(p) for p in files]
        doc["plot_notes"] = notes
        for note in notes:
            console.print(f"[yellow]plot left out:[/] {note}", highlight=False)
        console.print(f"wrote {len(files)} plot(s) to {plots}")
    doc["wall_s"] = time.perf_counter() - wall0
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(_clean(doc), indent=2) + "\n", encoding="utf-8")
        console.print(f"wrote {json_out}")


def _warn_same_index(study: Any, worker_index: int, console: Console) -> None:
    from optuna.trial import TrialState

    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    if any(t.user_attrs.get("worker") == worker_index for t in running):
        console.print(
            f"[yellow]warning:[/] another worker with --worker-index {worker_index} is running on this study: "
            "with the same seed its samples repeat yours; give each worker its own index",
            highlight=False,
        )


def _report(
    study: Any,
    settings: Any,
    name: str,
    url: str,
    out: Path,
    mine: int,
    console: Console,
    baseline: Any = None,
) -> dict[str, Any] | None:
    """Choose, write and print the best trial; the JSON document so far (None when nothing completed)."""
    from optuna.trial import TrialState

    from training import tune

    states = [t.state for t in study.get_trials(deepcopy=False)]
    counts = {
        s.name.lower(): sum(x is s for x in states)
        for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    }
    cands = tune.candidates(study)
    console.print(
        f"{counts['complete']} complete, {counts['pruned']} pruned, {counts['fail']} failed trial(s) "
        f"in the study ({mine} run by this worker)",
        highlight=False,
    )
    if not cands:
        Console(stderr=True).print("[bold red]error:[/] no completed trial: no config written")
        return None
    choice = tune.choose_for(cands, settings, baseline)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(tune.config_yaml(choice, settings, name, url), encoding="utf-8")
    c = choice.candidate
    front = tune.pareto_front(cands)
    which = "the shipped defaults" if c.number == tune.DEFAULTS_TRIAL else f"trial {c.number}"
    table = Table(title=f"chosen: {which} — {choice.rule}")
    table.add_column("parameter")
    table.add_column("default", justify="right")
    table.add_column("tuned", justify="right")
    default = tune.config_from_params({}).model_dump()
    for key, value in tune.changed_fields(tune.config_from_params(c.params)).items():
        table.add_row(key, f"{default[key]:g}", f"{value:.4g}")
    console.print(table)
    console.print(
        f"{which}: SLO {c.slo_attainment:.2%}, {c.gpu_seconds:,.0f} GPU-s; Pareto front: {len(front)} "
        f"trial(s); wrote {out}",
        highlight=False,
    )
    return {
        "study": name,
        "storage": url,
        "settings": settings.to_attrs(),
        "trials": {**counts, "this_worker": mine},
        "best": {
            "trial": c.number,
            "rule": choice.rule,
            "feasible": choice.feasible,
            "slo_attainment": c.slo_attainment,
            "gpu_seconds": c.gpu_seconds,
            "score": c.score,
            "params": dict(c.params),
            "config": str(out),
        },
        "pareto_front": [
            {"trial": f.number, "slo_attainment": f.slo_attainment, "gpu_seconds": f.gpu_seconds}
            for f in front
        ],
    }


def _comparison_table(comparisons: list[Comparison]) -> Table:
    table = Table(title="defaults vs tuned: training traces, then held-out traces")
    cols = (
        "trace",
        "role",
        "SLO default",
        "SLO tuned",
        "GPU-s default",
        "GPU-s tuned",
        "tuned/default",
        "verdict",
    )
    for col in cols:
        table.add_column(col, justify="left" if col in ("trace", "role", "verdict") else "right")

    def gpu(e: Evaluation) -> str:
        return f"{e.gpu_seconds:,.0f}"

    for c in comparisons:
        table.add_row(
            c.name, c.role, _pct(c.default.slo_attainment), _pct(c.tuned.slo_attainment), gpu(c.default),
            gpu(c.tuned), f"{c.gpu_ratio:.2f}", c.verdict,
        )  # fmt: skip
    return table


def _clean(x: Any) -> Any:
    """NaN and inf as null, so the JSON is standard."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


if __name__ == "__main__":  # `python -m training.tune_cli ...` until `pdscale tune` is registered
    typer.run(tune_cmd)
