"""``pdscale controller`` and ``pdscale config``: the controller daemon and its configuration."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from controller.config import ConfigError, ControllerConfig, load_yaml_model

if TYPE_CHECKING:
    from controller.daemon import DaemonOptions, PoolFactory

config_app = typer.Typer(
    help="Validate controller configuration files.\n\nExample: pdscale config check controller.yaml",
    no_args_is_help=True,
)


def _fail(message: str, code: int = 2) -> typer.Exit:
    Console(stderr=True).print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code=code)


@config_app.command("check")
def check_cmd(path: Annotated[Path, typer.Argument(help="Controller config (YAML).")]) -> None:
    """Validate a controller config; print every broken rule with the field it concerns.

    Exit code 0 when valid, 2 otherwise. Nothing is rewritten: a bad value is reported, never corrected.
    A valid file is summarised, with what its optional parts turn on: a local pool (actuator.pool), the GPU budget and each pool's
    guaranteed share (pools[].gpu_share), the router drain before scale-down (actuator.router_admin) and
    the online forecast combination (forecaster_combination) and the onset burst detector
    (forecaster_burst_detector). See docs/OPERATIONS.md for each.

    Example: pdscale config check controller.yaml
    """
    try:
        cfg = load_yaml_model(path, ControllerConfig)
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    console = Console()
    console.print(f"[green]ok[/]: {path} — {len(cfg.pools)} pool(s): {', '.join(p.name for p in cfg.pools)}; "
                  f"source {cfg.source.kind}, actuator {cfg.actuator.kind}, tick {cfg.tick_s:g} s")  # fmt: skip
    for line in config_summary(cfg):
        console.print(f"  {line}", highlight=False, soft_wrap=True)


def config_summary(cfg: ControllerConfig) -> list[str]:
    """What the optional parts of a valid config turn on, one line each (``pdscale config check``)."""
    lines = []
    lp = cfg.actuator.pool
    if lp is not None:
        lines.append(
            f"local pool {cfg.pools[0].name}: {lp.prefill} prefill + {lp.decode} decode, standby "
            f"{lp.standby_prefill} + {lp.standby_decode}, {lp.placement}; model "
            f"{lp.model_dir or 'tiny (built under work_dir)'}; router port {lp.router_port or 'free'}"
        )
    if cfg.gpu_budget is not None:
        shares = cfg.gpu_shares()
        given = ", ".join(f"{name} {n}" for name, n in shares.items()) or "none (SLO risk alone decides)"
        lines.append(f"GPU budget {cfg.gpu_budget}; guaranteed shares: {given}")
    ra = cfg.actuator.router_admin
    if ra is not None:
        routers = ", ".join(f"{name} -> {r.url}" for name, r in ra.pools.items())
        marking = "pods marked for deletion" if ra.mark_pods else "pods not marked"
        lines.append(
            f"router drain before scale-down: {routers}; timeout {ra.drain_timeout_s:g} s; {marking}"
        )
    lines.append(f"online forecast combination: {cfg.forecaster_combination}")
    lines.append(f"onset burst detector: {'on' if cfg.forecaster_burst_detector else 'off'}")
    lines.append(f"forecaster length guard: {'on' if cfg.forecaster_length_guard else 'off'}")
    holds = ", ".join(
        f"{p.name} {p.policy.silence_hold_s:g} s" if p.policy.silence_hold_s > 0 else f"{p.name} off"
        for p in cfg.pools
    )
    lines.append(f"silence hold (no scale-down while arrivals have stopped dead): {holds}")
    corrections = ", ".join(
        f"{p.name} {_latency_correction_line(p.policy.latency_correction, p.placement)}" for p in cfg.pools
    )
    lines.append(f"latency correction (capacities at the engines' measured speed): {corrections}")
    return lines


def _latency_correction_line(mode: str, placement: str) -> str:
    if mode == "off":
        return "off"
    if placement == "mixed-node":
        return "not applied (mixed-node)"
    return "on" if mode == "slower" else "on, faster engines too"


def controller_cmd(
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="Controller config (YAML); none = the embedded default."),
    ] = None,
    trace: Annotated[
        Path | None, typer.Option("--trace", "-t", help="Trace for the simulated cluster (default: bundled).")
    ] = None,
    duration_s: Annotated[
        float | None, typer.Option(help="Replay only the trace's first DURATION_S seconds.")
    ] = None,
    speed: Annotated[
        float,
        typer.Option(help="Virtual seconds per wall second for the live view (0 = as fast as possible)."),
    ] = 0.0,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write both runs' figures as JSON here.")
    ] = None,
    once: Annotated[
        bool, typer.Option("--once", help="Live daemon: run one tick and exit (1 if it failed).")
    ] = False,
    max_ticks: Annotated[
        int | None, typer.Option(min=1, help="Live daemon: stop after this many ticks.")
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Kubernetes actuator in advisory mode: read the cluster, patch nothing."
        ),
    ] = False,
    metrics_port: Annotated[
        int | None,
        typer.Option(min=0, max=65535, help="Serve /metrics, /healthz, /readyz here (overrides the config)."),
    ] = None,
    leader_elect: Annotated[
        bool, typer.Option("--leader-elect", help="Elect one leader among replicas with a Kubernetes Lease.")
    ] = False,
    lease_name: Annotated[
        str, typer.Option(help="Name of the leader-election Lease.")
    ] = "pdscale-controller",
    lease_namespace: Annotated[
        str | None, typer.Option(help="Namespace of the Lease (default: the actuator's).")
    ] = None,
    identity: Annotated[
        str | None, typer.Option(help="This replica's identity in the Lease (default: hostname-pid).")
    ] = None,
    in_cluster: Annotated[
        bool, typer.Option("--in-cluster", help="Use the pod's service account instead of a kubeconfig.")
    ] = False,
    log_format: Annotated[
        str, typer.Option(help="Live daemon log format on stderr: json (one object per line) or text.")
    ] = "json",
) -> None:
    """Run the controller: every tick read the pools' metrics, forecast the next 5 s, decide prefill, decode
    and warm-standby replicas, and apply them.

    With no --config it runs the embedded default: a simulated prefill/decode cluster (llama3-8b on A100)
    replaying the bundled Azure 2023 conversation trace at accelerated time, with a live view of the
    decisions and their reasons, then the same trace under a reactive HPA-like policy, and a summary of
    both (SLO attainment, latency, GPU-seconds).

    With a --config whose source is `prometheus` and actuator `kubernetes` (or `dry-run`, advisory: log and
    export what it would do) it runs the live daemon: every tick_s it reads the pools' replicas from the
    cluster, scrapes Prometheus, decides and patches the Deployments' /scale. Errors are logged (JSON lines
    on stderr), counted in /metrics and the loop goes on; SIGTERM/SIGINT finish the tick and exit 0.
    --leader-elect lets several replicas run with one of them applying. Optional parts of the config: pools'
    guaranteed GPU shares (pools[].gpu_share under gpu_budget), draining the router's backends before a
    scale-down (actuator.router_admin), and the onset burst detector (forecaster_burst_detector, off by
    default); docs/OPERATIONS.md section 7 has a snippet for each.

    With actuator `local` (one pool) the daemon owns a local P/D pool of vLLM servers (actuator.pool: model_dir,
    work_dir, prefill, decode, standby_decode, placement, ...): it starts them and the router in-process (the
    router's URL is logged, event pool_up), heals dead servers, scales them by the plan (promoting warm
    standby first) and stops every server on exit, SIGTERM included. Source `direct` scrapes those servers'
    and the router's /metrics itself each tick (no Prometheus); an unreachable server reads as unknown load
    (hold), never as idle. examples/controller-local.yaml is a complete file.

    Examples:
      pdscale controller
      pdscale controller --trace datasets/azure2023/AzureLLMInferenceTrace_code.dev_before_1850.csv --json out.json
      pdscale controller --config controller.yaml
      pdscale controller --config live.yaml --once --log-format text
      pdscale controller --config live.yaml --leader-elect --metrics-port 9100
      pdscale controller --config examples/controller-local.yaml --metrics-port 9100
    """
    from controller.demo import run_demo, summary_table
    from serving.sim.replay_cli import default_trace_path

    cfg = ControllerConfig()
    if config is not None:
        try:
            cfg = load_yaml_model(config, ControllerConfig)
        except ConfigError as exc:
            raise _fail(str(exc)) from None
    if cfg.source.kind != "simulator":
        options = _daemon_options(
            cfg, dry_run, metrics_port, leader_elect, lease_name, lease_namespace, identity, in_cluster
        )
        raise typer.Exit(code=run_live_daemon(cfg, options, 1 if once else max_ticks, log_format))
    if len(cfg.pools) != 1:
        raise _fail("the simulated controller runs one pool today; several pools come with issue 8")
    path = trace or cfg.simulator.trace or default_trace_path()
    pool = cfg.pools[0]
    console = Console()
    try:
        result = run_demo(
            path,
            profile=pool.profile,
            policy=pool.policy,
            slo_ttft_ms=pool.slo_ttft_ms,
            slo_itl_ms=pool.slo_itl_ms,
            checkpoint=cfg.forecaster_checkpoint,
            duration_s=duration_s if duration_s is not None else cfg.simulator.duration_s,
            speed=speed or cfg.simulator.speed,
            console=console,
        )
    except (OSError, ValueError) as exc:
        raise _fail(str(exc)) from None
    console.print(summary_table(result, path.name))
    if json_out is not None:
        doc = {
            "trace": str(path),
            "forecaster": result.forecaster,
            "policies": {"predictive": result.predictive.to_json(), "reactive": result.reactive.to_json()},
        }
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        console.print(f"wrote {json_out}")


def _daemon_options(
    cfg: ControllerConfig,
    dry_run: bool,
    metrics_port: int | None,
    leader_elect: bool,
    lease_name: str,
    lease_namespace: str | None,
    identity: str | None,
    in_cluster: bool,
) -> DaemonOptions:
    from pydantic import ValidationError

    from controller.config import format_validation_error
    from controller.daemon import DaemonOptions
    from controller.leader import LeaderSettings

    if dry_run and cfg.actuator.kind != "kubernetes":
        raise _fail("--dry-run goes with actuator.kind 'kubernetes' (kind 'dry-run' is advisory already)")
    leader = None
    if leader_elect:
        fields: dict[str, str] = {
            "lease_name": lease_name,
            "namespace": lease_namespace or cfg.actuator.namespace,
        }
        if identity is not None:
            fields["identity"] = identity
        try:
            leader = LeaderSettings(**fields)
        except ValidationError as exc:
            raise _fail(format_validation_error(exc, "--lease-*")) from None
    port = metrics_port if metrics_port is not None else cfg.metrics_port
    return DaemonOptions(dry_run=dry_run, leader=leader, metrics_port=port, in_cluster=in_cluster)


def run_live_daemon(
    cfg: ControllerConfig,
    options: DaemonOptions,
    max_ticks: int | None,
    log_format: str,
    *,
    pool_factory: PoolFactory | None = None,
) -> int:
    """Build and run the live daemon; return the exit code. Configuration problems are reported (exit 2),
    not raised. SIGTERM stops it cleanly at any point, a local pool's start-up included (its servers are
    stopped). ``pool_factory``: see ``build_daemon`` (tests inject fake servers)."""
    from controller.daemon import build_daemon, configure_logging, serve

    try:
        configure_logging(log_format)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    # A local pool starts inside build_daemon (a minute of vLLM start-up): SIGTERM then must unwind through
    # PoolManager.up's clean-up, not kill the process and orphan its servers (serve installs its own handler).
    previous = _interrupt_on_sigterm()
    daemon = None
    try:
        try:
            daemon = build_daemon(cfg, options, pool_factory=pool_factory)
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # a kubeconfig that does not load, an unreadable token file, ...
            raise _fail(f"cannot start the controller: {type(exc).__name__}: {exc}") from None
        return serve(daemon, metrics_port=options.metrics_port, max_ticks=max_ticks)
    except KeyboardInterrupt:
        return 0  # a requested stop, during start-up or after: everything started was stopped
    finally:
        if daemon is not None:
            if previous is not None:  # a further SIGTERM must not interrupt stopping the servers
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            daemon.close()  # idempotent: serve closed it already unless interrupted before or during it
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _interrupt_on_sigterm() -> signal.Handlers | Callable[[int, FrameType | None], Any] | int | None:
    """SIGTERM raises KeyboardInterrupt (as Ctrl-C does) until restored; None off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_interrupt)
