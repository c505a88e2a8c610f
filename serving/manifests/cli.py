"""``pdscale manifests``: render the Kubernetes objects, alert rules and dashboard into a folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from serving.manifests.render import render, write_rendering
from serving.manifests.spec import (
    DEFAULT_IMAGE,
    DRA_DEVICE_CLASS,
    PLACEHOLDER_IMAGE,
    PLACEMENTS,
    ManifestSpec,
    ManifestSpecError,
)
from serving.pools.local import DEFAULT_DECODE_MIN_SHARE, DEFAULT_PREFILL_SHARE


def _fail(message: str) -> typer.Exit:
    Console(stderr=True).print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


def manifests_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder to write into (created if missing).")],
    model: Annotated[
        str, typer.Option(help="Model vLLM serves (Hugging Face id or path).")
    ] = "meta-llama/Llama-3.1-8B-Instruct",
    served_model_name: Annotated[
        str | None, typer.Option(help="Name clients send as `model` (default: --model).")
    ] = None,
    pool: Annotated[
        str, typer.Option(help="Pool name (object name prefix and pdscale.io/pool label).")
    ] = "default",
    prefill: Annotated[int, typer.Option("--prefill", help="Initial active prefill instances.")] = 1,
    decode: Annotated[int, typer.Option("--decode", help="Initial active decode instances.")] = 1,
    standby_decode: Annotated[
        int, typer.Option("--standby-decode", help="Warm standby decode instances (their own Deployment).")
    ] = 2,
    namespace: Annotated[
        str, typer.Option("--namespace", "-n", help="Namespace of every object.")
    ] = "pdscale",
    image: Annotated[str, typer.Option(help="vLLM image (vllm-openai).")] = DEFAULT_IMAGE,
    pdscale_image: Annotated[
        str, typer.Option(help="Image with pdscale installed, for the controller and the router.")
    ] = PLACEHOLDER_IMAGE,
    gpus_per_instance: Annotated[
        int, typer.Option("--gpus-per-instance", help="GPUs per vLLM instance (tensor-parallel size).")
    ] = 1,
    max_prefill: Annotated[int, typer.Option(help="Most prefill replicas the controller may set.")] = 16,
    max_decode: Annotated[int, typer.Option(help="Most decode replicas (active + standby).")] = 16,
    profile: Annotated[str, typer.Option(help="Controller's hardware profile MODEL/GPU.")] = "llama3-8b/a100",
    slo_ttft_ms: Annotated[float, typer.Option(help="TTFT SLO for the controller, ms.")] = 500.0,
    slo_itl_ms: Annotated[float, typer.Option(help="Inter-token latency SLO for the controller, ms.")] = 50.0,
    prometheus_url: Annotated[
        str, typer.Option(help="Prometheus the controller reads.")
    ] = "http://prometheus-server.monitoring.svc:9090",
    controller_replicas: Annotated[
        int, typer.Option(help="Controller replicas (one leads through a Lease).")
    ] = 2,
    placement: Annotated[
        str, typer.Option(help=f"Where instances run: one of {', '.join(PLACEMENTS)}.")
    ] = "disaggregated",
    prefill_mem_frac: Annotated[
        float,
        typer.Option(help="mixed-node: prefill's --gpu-memory-utilization; decode gets 0.9 minus it."),
    ] = DEFAULT_PREFILL_SHARE,
    decode_mem_frac: Annotated[
        float | None,
        typer.Option(
            help="mixed-node: decode's --gpu-memory-utilization (default 0.9 - --prefill-mem-frac)."
        ),
    ] = None,
    decode_min_mem_frac: Annotated[
        float,
        typer.Option(help="mixed-node: the decode container's guaranteed minimum share of GPU memory."),
    ] = DEFAULT_DECODE_MIN_SHARE,
    gpu_sharing: Annotated[
        str,
        typer.Option(
            help="mixed-node: how both containers get the pod's GPUs: runtime (device plugin + NVIDIA runtime, "
            "whole-node pods) or dra (one shared ResourceClaim, Kubernetes >= 1.34)."
        ),
    ] = "runtime",
    dra_device_class: Annotated[
        str, typer.Option(help="--gpu-sharing dra: the DeviceClass to claim GPUs from.")
    ] = DRA_DEVICE_CLASS,
    router_drain: Annotated[
        bool,
        typer.Option(
            "--router-drain",
            help="The controller drains the router's backends before a scale-down and marks their pods for "
            "deletion: adds actuator.router_admin to its config and pods list/patch to its Role.",
        ),
    ] = False,
) -> None:
    """Render Deployments, Services, RBAC, the controller's config, alert rules and a Grafana dashboard.

    Writes numbered YAML files to apply with `kubectl apply -f OUT` (Namespace, the vLLM prefill and decode
    pools with NIXL KV transfer, the warm-standby decode Deployment, the router, the controller with its
    least-privilege RBAC and ConfigMap, monitoring ConfigMaps) and, under OUT/monitoring/, the Prometheus
    rules, a scrape configuration and the Grafana dashboard JSON. See docs/DEPLOY.md.

    The controller and the router run the image given by --pdscale-image; no image is published yet, so
    the default is a placeholder you must replace.

    --placement mixed-node puts one prefill and one decode container in each pod, sharing the node's GPUs
    (--gpu-memory-utilization 0.4 and 0.5 by default); --prefill and --decode must then be equal, and the
    controller scales the pd-mixed Deployment in nodes (both roles at the larger need, no standby). The two
    shares may add up to
    0.95 at most, and decode never gets less than --decode-min-mem-frac (0.3): a rendering that breaks
    either rule is refused with the option named. By default the prefill container requests the GPUs and
    the decode container sees the node's devices through the NVIDIA runtime (whole-node pods only);
    --gpu-sharing dra renders a ResourceClaimTemplate instead, one claim per pod shared by both containers.

    Examples:

      pdscale manifests --out deploy/ --model meta-llama/Llama-3.1-8B-Instruct --prefill 2 --decode 4

      pdscale manifests --out deploy/ --placement mixed-node --prefill 2 --decode 2 --gpus-per-instance 8

      pdscale manifests --out deploy/ --placement mixed-node --prefill-mem-frac 0.35 --decode-mem-frac 0.6

      pdscale manifests --out deploy/ --placement mixed-node --prefill 4 --decode 4 --gpu-sharing dra

      pdscale manifests --out deploy/ --pool chat --router-drain
    """
    try:
        spec = ManifestSpec(
            model=model,
            served_model_name=served_model_name,
            pool=pool,
            namespace=namespace,
            image=image,
            pdscale_image=pdscale_image,
            prefill=prefill,
            decode=decode,
            standby_decode=standby_decode,
            gpus_per_instance=gpus_per_instance,
            max_prefill=max_prefill,
            max_decode=max_decode,
            profile=profile,
            slo_ttft_ms=slo_ttft_ms,
            slo_itl_ms=slo_itl_ms,
            prometheus_url=prometheus_url,
            controller_replicas=controller_replicas,
            placement=placement,  # type: ignore[arg-type]  # checked by ManifestSpec
            prefill_mem_frac=prefill_mem_frac,
            decode_mem_frac=decode_mem_frac,
            decode_min_mem_frac=decode_min_mem_frac,
            gpu_sharing=gpu_sharing,  # type: ignore[arg-type]  # checked by ManifestSpec
            dra_device_class=dra_device_class,
            router_drain=router_drain,
        )
    except ManifestSpecError as exc:
        raise _fail(str(exc)) from exc
    rendering = render(spec)
    try:
        written = write_rendering(rendering, out)
    except OSError as exc:
        raise _fail(f"cannot write to {out}: {exc}") from exc
    console = Console()
    table = Table(title=f"pdscale manifests → {out}")
    table.add_column("file")
    table.add_column("objects")
    for path in written:
        name = path.relative_to(out).as_posix()
        objs = rendering.manifests.get(name)
        what = ", ".join(f"{o['kind']}/{o['metadata']['name']}" for o in objs) if objs else "(file)"
        table.add_row(name, what)
    console.print(table)
    for note in rendering.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
    if spec.pdscale_image == PLACEHOLDER_IMAGE:
        console.print(
            f"[yellow]note:[/] the controller and router image is the placeholder {PLACEHOLDER_IMAGE}: "
            "pass --pdscale-image with the image you build",
            highlight=False,
            soft_wrap=True,
        )
