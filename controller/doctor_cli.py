"""``pdscale doctor``: check a live deployment and say what to fix (``controller.doctor`` does the work)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from controller.config import ConfigError, ControllerConfig, load_yaml_model
from controller.doctor import DEFAULT_WINDOW_S, Check, exit_code, parse_duration_s

_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def _fail(message: str) -> typer.Exit:
    Console(stderr=True).print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


def doctor_cmd(
    prometheus: Annotated[
        str | None,
        typer.Option("--prometheus", "-p", help="Prometheus base URL (default: the config's source.url)."),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="Controller config (YAML): pools, profiles, SLOs, tick, labels, checkpoint.",
        ),
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(help="Kubeconfig for the RBAC and Deployment checks (default: the config's, if any)."),
    ] = None,
    context: Annotated[str | None, typer.Option(help="Kubeconfig context (default: current).")] = None,
    in_cluster: Annotated[
        bool, typer.Option("--in-cluster", help="Use the pod's service account (run inside the cluster).")
    ] = False,
    namespace: Annotated[
        str | None, typer.Option(help="Namespace of the pools' Deployments (default: the config's).")
    ] = None,
    leases: Annotated[
        bool,
        typer.Option(
            "--leases/--no-leases", help="Check Lease RBAC too (needed with --leader-elect, the default)."
        ),
    ] = True,
    router: Annotated[
        str | None, typer.Option("--router", help="Router base URL: check its /health.")
    ] = None,
    checkpoint: Annotated[
        Path | None, typer.Option(help="Forecaster checkpoint (default: the config's, else the shipped one).")
    ] = None,
    window: Annotated[
        str, typer.Option(help="Window of the failure-sign queries (30s, 15m, 1h).")
    ] = f"{DEFAULT_WINDOW_S / 60:g}m",
    tick_s: Annotated[
        float | None, typer.Option(min=0.001, help="Control tick, seconds (default: the config's, else 1).")
    ] = None,
    bearer_token_file: Annotated[
        Path | None, typer.Option(help="File whose content is sent to Prometheus as a Bearer token.")
    ] = None,
    timeout_s: Annotated[float, typer.Option(min=0.1, help="Per HTTP request, seconds.")] = 10.0,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the checks as JSON here.")
    ] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 on a warning too.")] = False,
) -> None:
    """Check a live pdscale deployment; print each check with its verdict and the fix.

    Checks: Prometheus reachable and its scrape interval short enough for the control tick; the clock skew
    between Prometheus and this machine; vLLM metrics present for every pool (either spelling, vllm:x or
    vllm_x) with labels that map to instance, pool and role; the forecaster checkpoint's schema against this
    controller and the metrics available; the controller's RBAC (SelfSubjectAccessReview: list
    deployments, get/patch deployments/scale, get/create/update leases) and each pool's Deployments; the
    router's /health. Then signs of known failure cases over --window: decode KV usage pinned near 1 with
    preemptions, prefill throughput under the hardware profile while queued, a slow control tick, and tail
    TTFT over the SLO while capacity sits idle (routing imbalance).

    Verdicts: ok, warn, fail, skip (input not given: the fix column says how to run it). Exit code 1 when
    a check failed (with --strict: or warned), 2 on a usage error, 0 otherwise. Run it from the controller's
    pod (--in-cluster) to check the controller's own service account and clock.

    Examples:
      pdscale doctor --prometheus http://prometheus:9090
      pdscale doctor --config controller.yaml --kubeconfig ~/.kube/config --router http://router:8080
      pdscale doctor --config controller.yaml --in-cluster --window 1h --json doctor.json --strict
    """
    from controller.doctor import DoctorInputs, KubeClientProbe, PromHttp, RouterHttp, run_doctor

    cfg: ControllerConfig | None = None
    if config is not None:
        try:
            cfg = load_yaml_model(config, ControllerConfig)
        except ConfigError as exc:
            raise _fail(str(exc)) from None
    try:
        window_s = parse_duration_s(window)
    except ValueError as exc:
        raise _fail(f"--window: {exc}") from None
    try:
        inputs = DoctorInputs.build(
            cfg, window_s=window_s, tick_s=tick_s, checkpoint=checkpoint, namespace=namespace, leases=leases
        )
    except ValueError as exc:
        raise _fail(str(exc)) from None

    url = prometheus or (cfg.source.url if cfg is not None else None)
    token_file = bearer_token_file or (cfg.source.bearer_token_file if cfg is not None else None)
    try:
        token = token_file.read_text().strip() if token_file is not None else None
    except OSError as exc:
        raise _fail(f"--bearer-token-file: {exc}") from None
    ca_file = cfg.source.ca_file if cfg is not None else None
    prom = (
        PromHttp(url, timeout_s=timeout_s, bearer_token=token, ca_file=str(ca_file) if ca_file else None)
        if url
        else None
    )

    kube = None
    kube_hint = ""
    kc = kubeconfig or (cfg.actuator.kubeconfig if cfg is not None else None)
    if in_cluster or kc is not None:
        from controller.actuators.kubernetes import api_client

        try:
            client = api_client(kubeconfig=kc, context=context, in_cluster=in_cluster)
        except Exception as exc:  # a kubeconfig that does not load, no service account outside a pod
            raise _fail(f"cannot build a Kubernetes client: {type(exc).__name__}: {exc}") from None
        kube = KubeClientProbe(client, request_timeout_s=timeout_s)
    else:
        kube_hint = "pass --kubeconfig FILE (or --in-cluster from the controller's pod) to review its RBAC"

    checks = run_doctor(
        inputs,
        prom=prom,
        kube=kube,
        router=RouterHttp(router, timeout_s=timeout_s) if router else None,
        kube_hint=kube_hint,
    )
    if prom is not None:
        prom.close()
    console = Console()
    console.print(checks_table(checks))
    counts = {v: sum(1 for c in checks if c.verdict == v) for v in ("ok", "warn", "fail", "skip")}
    console.print(", ".join(f"[{_STYLE[v]}]{n} {v}[/]" for v, n in counts.items()))
    if json_out is not None:
        doc = {
            "checks": [c.to_json() for c in checks],
            "counts": counts,
            "exit_code": exit_code(checks, strict=strict),
        }
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        console.print(f"wrote {json_out}")
    raise typer.Exit(code=exit_code(checks, strict=strict))


def checks_table(checks: list[Check]) -> Table:
    table = Table(title="pdscale doctor", show_lines=True)
    for col in ("check", "subject", "verdict", "detail", "fix"):
        table.add_column(col, overflow="fold")
    for c in checks:
        style = _STYLE[c.verdict]
        table.add_row(c.name, c.subject, f"[{style}]{c.verdict}[/]", c.detail, c.fix)
    return table
