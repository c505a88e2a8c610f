"""``pdscale router``: run the P/D router (the lead registers ``router_cmd``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console


def router_cmd(
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="YAML/JSON router config (backends, policy, limits)."),
    ] = None,
    host: Annotated[str | None, typer.Option(help="Listen address (overrides the config).")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port (overrides the config).")] = None,
    policy: Annotated[
        str | None, typer.Option(help="Routing policy: least-loaded, context-aware or node-score.")
    ] = None,
    pool: Annotated[
        str | None,
        typer.Option(help="The pool's name: a pool label on the router's series (overrides the config)."),
    ] = None,
    backend: Annotated[
        list[str] | None,
        typer.Option(
            "--backend",
            "-b",
            help="Add a backend as ID=ROLE@URL (role mixed, prefill or decode); repeatable.",
        ),
    ] = None,
) -> None:
    """Run the OpenAI-compatible P/D router in front of vLLM servers.

    Clients send /v1/completions or /v1/chat/completions to the router; with prefill and decode backends
    it prefills with max_tokens=1 and hands the KV transfer params to a decode backend, else a mixed
    backend serves directly. Header x-pdscale-priority: vip|normal|batch orders queued requests.
    The controller adds/removes backends with POST/DELETE /admin/backends and pushes PUT /admin/node-scores.

    Example:

        pdscale router -b p0=prefill@http://127.0.0.1:8101 -b d0=decode@http://127.0.0.1:8102 --port 8000

        python -m serving.router --config router.yaml
    """
    from serving.router.app import run_router
    from serving.router.config import RouterConfigError, load_router_config, router_config_from_dict

    console = Console(stderr=True)
    try:
        doc = load_router_config(config).model_dump() if config is not None else {}
        overrides = {"host": host, "port": port, "policy": policy, "pool": pool}
        doc.update({k: v for k, v in overrides.items() if v is not None})
        doc["backends"] = list(doc.get("backends", ())) + [_parse_backend(b) for b in backend or ()]
        cfg = router_config_from_dict(doc, str(config) if config else "<command line>")
    except (RouterConfigError, typer.BadParameter) as err:
        console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from None
    kinds = ", ".join(f"{b.id}={b.role}@{b.url}" for b in cfg.backends) or "none yet (POST /admin/backends)"
    console.print(
        f"[bold]pdscale router[/bold] on http://{cfg.host}:{cfg.port} policy={cfg.policy}"
        f" pool={cfg.pool or '(none)'} backends: {kinds}"
    )
    run_router(cfg)


def _parse_backend(text: str) -> dict[str, str]:
    """``ID=ROLE@URL`` to a backend dict (validated later by the config model)."""
    ident, sep, rest = text.partition("=")
    role, at, url = rest.partition("@")
    if not sep or not at:
        raise typer.BadParameter(
            f"--backend {text!r}: expected ID=ROLE@URL, e.g. d0=decode@http://127.0.0.1:8102"
        )
    return {"id": ident, "role": role, "url": url}


app = typer.Typer(add_completion=False, rich_markup_mode="rich")
app.command()(router_cmd)
