"""Start, health-check and stop real vLLM OpenAI servers as local processes (mixed, prefill or decode).

Each server runs in its own session and process group (``start_new_session=True``): vLLM's API server
forks an engine-core process (and workers) that SIGKILL of the API server alone would orphan, several
GB each. ``LocalInstance.stop`` therefore signals the whole group, SIGTERM first (vLLM shuts down
cleanly on it), SIGKILL after a timeout, and returns only once no process of the group is left.

Prefill/decode disaggregation uses a KV connector passed as ``--kv-transfer-config``. ``connector="auto"``
(the default) is NixlConnector, the production path, when ``nixl`` is importable, and ExampleConnector (KV blocks
through files in a shared directory; needs nothing extra) otherwise. A NIXL server gets its own side-channel port
(``VLLM_NIXL_SIDE_CHANNEL_PORT``, loopback host). See ../shared/notes/VLLM_CPU.md for what was measured on these
machines (NIXL's progress thread spins a core per idle worker there: force ExampleConnector on a small CPU box).

Memory share (PD-mixed nodes, issue 8): ``InstanceConfig.memory_share`` is the fraction of the node's
accelerator memory the instance may use. On GPU builds it is vLLM's ``--gpu-memory-utilization``; on
vllm-cpu that flag means a fraction of *host* memory that must all be free at start (a shared box refuses
it), so the share is taken of ``node_kv_space_gib`` instead and given as the KV cache space:
``VLLM_CPU_KVCACHE_SPACE`` (whole GiB, the knob the notes use) when the share comes to whole GiB, else
``--kv-cache-memory-bytes`` with ``VLLM_CPU_KVCACHE_SPACE`` removed from the server's environment (vLLM
lets the legacy variable override the flag).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Role = Literal["mixed", "prefill", "decode"]
Platform = Literal["cpu", "gpu"]
PLATFORMS: tuple[Platform, ...] = ("cpu", "gpu")
ROLES: tuple[Role, ...] = ("mixed", "prefill", "decode")
Connector = Literal["auto", "ExampleConnector", "NixlConnector"]

SERVED_MODEL_NAME = "tiny"

# What makes vLLM-cpu run on a shared CPU box without reaching the network (see VLLM_CPU.md).
BASE_ENV: dict[str, str] = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache per server
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # other processes share the cores: do not pin
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
}


KV_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"
GIB = 1 << 30
# The KV space (GiB) a whole CPU "node" shares out when instances give a memory_share: two tiny-model
# servers at 0.4 / 0.5 get 1.6 / 2 GiB, close to the 1 GiB each that BASE_ENV gives a lone server.
DEFAULT_NODE_KV_SPACE_GIB = 4.0


# PD-mixed node partition (issue 8). The two shares may add up to at most MIXED_NODE_MAX_TOTAL: the rest
# of each GPU is the CUDA context, NCCL/NIXL buffers and fragmentation of two processes. By default the
# decode instance gets MIXED_NODE_DEFAULT_TOTAL minus the prefill share, never below its guaranteed
# minimum. All three are assumptions to tune per GPU kind, not measurements.
MIXED_NODE_MAX_TOTAL = 0.95
MIXED_NODE_DEFAULT_TOTAL = 0.9
DEFAULT_PREFILL_SHARE = 0.4
DEFAULT_DECODE_MIN_SHARE = 0.3


def mixed_node_share_problems(
    prefill_share: float,
    decode_share: float,
    decode_min_share: float = DEFAULT_DECODE_MIN_SHARE,
    *,
    names: tuple[str, str, str] = ("prefill_share", "decode_share", "decode_min_share"),
) -> list[str]:
    """One message per broken rule of a node's memory partition, each naming the field (``names`` lets a
    caller use its own spelling, e.g. the CLI's options)."""
    pre_name, dec_name, min_name = names
    out: list[str] = []
    for name, value in ((pre_name, prefill_share), (dec_name, decode_share), (min_name, decode_min_share)):
        if not (math.isfinite(value) and 0.0 < value < 1.0):
            out.append(f"{name}: must lie in (0, 1), got {value}")
    if out:
        return out
    if prefill_share + decode_share > MIXED_NODE_MAX_TOTAL + 1e-9:
        out.append(
            f"{pre_name} + {dec_name}: {prefill_share:g} + {decode_share:g} = {prefill_share + decode_share:g} "
            f"exceeds {MIXED_NODE_MAX_TOTAL} of the node's memory (two processes need the rest)"
        )
    if decode_share < decode_min_share - 1e-9:
        out.append(
            f"{dec_name}: {decode_share:g} is below the decode instance's guaranteed minimum "
            f"{min_name}={decode_min_share:g}"
        )
    return out


def default_decode_share(prefill_share: float) -> float:
    """The decode instance's share when none is given: the rest up to MIXED_NODE_DEFAULT_TOTAL."""
    return round(MIXED_NODE_DEFAULT_TOTAL - prefill_share, 4)


def detect_platform() -> Platform:
    """``"cpu"`` when the installed vLLM is the vllm-cpu distribution, else ``"gpu"``."""
    import importlib.metadata

    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return "gpu"
    return "cpu"


class InstanceStartError(RuntimeError):
    """A server exited or never became healthy while starting; the message carries its last log lines."""


@dataclass(frozen=True)
class KVTransfer:
    """The KV connector that joins a prefill and a decode instance.

    ``shared_storage_path`` is ExampleConnector's directory (the same for both sides; it fills with KV
    block files, one per full 128-token block of each prompt: put it under a temp dir).
    """

    connector: Connector = "auto"  # NixlConnector when `nixl` is importable, else ExampleConnector
    shared_storage_path: Path | None = None

    def resolved(self) -> Connector:
        """The connector servers are started with (``auto`` decided by whether ``nixl`` is importable)."""
        if self.connector != "auto":
            return self.connector
        return "NixlConnector" if importlib.util.find_spec("nixl") is not None else "ExampleConnector"

    def config_json(self, role: Role) -> str:
        """The ``--kv-transfer-config`` value for an instance of ``role`` (prefill or decode)."""
        if role == "mixed":
            raise ValueError("KVTransfer.config_json: a mixed instance takes no KV connector")
        if self.resolved() == "ExampleConnector":
            if self.shared_storage_path is None:
                raise ValueError("KVTransfer.shared_storage_path: ExampleConnector needs a shared directory")
            return json.dumps(
                {
                    "kv_connector": "ExampleConnector",
                    "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
                    "kv_connector_extra_config": {"shared_storage_path": str(self.shared_storage_path)},
                }
            )
        if importlib.util.find_spec("nixl") is None:
            raise RuntimeError(
                "KVTransfer.connector='NixlConnector' needs the `nixl` package, which is not installed "
                "(pip install nixl); use connector='ExampleConnector' on this machine"
            )
        return json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"})


@dataclass(frozen=True)
class InstanceConfig:
    """How one local vLLM server is launched. Defaults suit the tiny model on a shared 2-core box."""

    model_dir: Path
    role: Role = "mixed"
    host: str = "127.0.0.1"
    port: int | None = None  # None: a free loopback port is picked
    max_model_len: int = 1024
    max_num_seqs: int | None = None  # None: vLLM's default
    num_gpu_blocks_override: int | None = None  # KV blocks (128 tokens each on CPU); None: from KV space
    kv_transfer: KVTransfer | None = None  # required for prefill/decode roles
    # bfloat16 kills the CPU worker on the first forward pass on this machine kind (AMX host, vllm-cpu
    # 0.32.0, tiny Llama): measured 2026-11-29. float32 works and the tiny model is small anyway.
    dtype: str = "float32"
    enable_prefix_caching: bool = True
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)  # added to BASE_ENV and the parent environment
    # Fraction of the node's accelerator memory for this instance (a PD-mixed node: 0.4 prefill, 0.5
    # decode); None: vLLM's default on GPU, BASE_ENV's 1 GiB KV space on CPU. See the module docstring.
    memory_share: float | None = None
    platform: Platform | None = None  # None: detect_platform() when the command is built
    node_kv_space_gib: float = DEFAULT_NODE_KV_SPACE_GIB  # CPU only: what memory_share is a share of

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"InstanceConfig.role: {self.role!r} is not one of {ROLES}")
        if self.role != "mixed" and self.kv_transfer is None:
            raise ValueError(f"InstanceConfig.kv_transfer: a {self.role} instance needs a KV connector")
        for name in ("max_model_len", "max_num_seqs", "num_gpu_blocks_override"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"InstanceConfig.{name}: must be >= 1, got {value}")
        share = self.memory_share
        if share is not None and not (math.isfinite(share) and 0.0 < share <= 1.0):
            raise ValueError(f"InstanceConfig.memory_share: must lie in (0, 1], got {share}")
        if self.platform is not None and self.platform not in PLATFORMS:
            raise ValueError(f"InstanceConfig.platform: {self.platform!r} is not one of {PLATFORMS}")
        if not (math.isfinite(self.node_kv_space_gib) and self.node_kv_space_gib > 0):
            raise ValueError(
                f"InstanceConfig.node_kv_space_gib: must be > 0 GiB, got {self.node_kv_space_gib}"
            )

    def resolved_platform(self) -> Platform:
        return self.platform if self.platform is not None else detect_platform()


@dataclass(frozen=True)
class MemorySettings:
    """What ``memory_share`` becomes on the command line (``args``) and in the environment (``env``;
    ``unset_env`` names variables removed from the server's environment)."""

    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    unset_env: tuple[str, ...] = ()


def memory_settings(config: InstanceConfig) -> MemorySettings:
    """The flags and environment that give ``config`` its ``memory_share`` of the node (see the module doc).

    GPU: ``--gpu-memory-utilization SHARE``. CPU: SHARE x ``node_kv_space_gib`` of KV cache, as
    ``VLLM_CPU_KVCACHE_SPACE=N`` when that is a whole number of GiB, else ``--kv-cache-memory-bytes``.
    """
    share = config.memory_share
    if share is None:
        return MemorySettings()
    if config.resolved_platform() == "gpu":
        return MemorySettings(args=("--gpu-memory-utilization", f"{share:g}"))
    kv_gib = share * config.node_kv_space_gib
    whole = round(kv_gib)
    if whole >= 1 and abs(kv_gib - whole) < 1e-9:
        return MemorySettings(env={KV_SPACE_ENV: str(whole)})
    kv_bytes = int(kv_gib * GIB)
    if kv_bytes < 1 << 20:
        raise ValueError(
            f"InstanceConfig.memory_share: {share:g} of node_kv_space_gib={config.node_kv_space_gib:g} "
            f"is {kv_gib:.6f} GiB of KV cache, below 1 MiB"
        )
    return MemorySettings(args=("--kv-cache-memory-bytes", str(kv_bytes)), unset_env=(KV_SPACE_ENV,))


def instance_env(
    config: InstanceConfig, base: Mapping[str, str], *, port_picker: Callable[[], int] | None = None
) -> dict[str, str]:
    """The server's environment: ``base`` (the parent's), BASE_ENV, the memory share's, a NIXL side channel of
    its own (loopback, a free port from ``port_picker``) for a NixlConnector server, then ``config.env``."""
    memory = memory_settings(config)
    env = {**base, **BASE_ENV, **memory.env}
    for name in memory.unset_env:
        env.pop(name, None)
    kv = config.kv_transfer
    if kv is not None and config.role != "mixed" and kv.resolved() == "NixlConnector":
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = config.host
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str((port_picker or free_port)())
    return {**env, **config.env}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it; a tiny race with other binders remains)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def server_command(config: InstanceConfig, port: int) -> list[str]:
    """The argv that starts the OpenAI API server for ``config`` on ``port``."""
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(config.model_dir),
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--host",
        config.host,
        "--port",
        str(port),
        "--max-model-len",
        str(config.max_model_len),
        "--dtype",
        config.dtype,
        "--enforce-eager",  # no compile warm-up: healthy in ~40 s instead of ~100 s
    ]
    if config.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(config.max_num_seqs)]
    if config.num_gpu_blocks_override is not None:
        argv += ["--num-gpu-blocks-override", str(config.num_gpu_blocks_override)]
    if not config.enable_prefix_caching:
        argv.append("--no-enable-prefix-caching")
    if config.kv_transfer is not None and config.role != "mixed":
        argv += ["--kv-transfer-config", config.kv_transfer.config_json(config.role)]
    argv += memory_settings(config).args
    return argv + list(config.extra_args)


def tail_lines(path: Path, n: int = 30) -> str:
    """The last ``n`` lines of a text file ('' when it does not exist)."""
    try:
        with path.open(errors="replace") as f:
            return "".join(deque(f, maxlen=n))
    except FileNotFoundError:
        return ""


def group_pids(pgid: int) -> list[int]:
    """Pids of every live (non-zombie) process in process group ``pgid``, read from /proc (Linux)."""
    found: list[int] = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # exited while we looked
            continue
        # Fields after the parenthesised command name: state, ppid, pgrp, ...
        fields = text[text.rfind(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return sorted(found)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else (cannot happen for our own group)
        return True
    return True


@dataclass(frozen=True, eq=False)
class LocalInstance:
    """A running vLLM server process group. ``pid`` is also its process-group id."""

    url: str  # http://host:port, no trailing slash
    role: Role
    pid: int
    log_path: Path
    config: InstanceConfig
    process: subprocess.Popen[bytes] = field(repr=False)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def is_running(self) -> bool:
        """True while the API server process has not exited."""
        return self.process.poll() is None

    def group_alive(self) -> bool:
        """True while any process of the server's group (API server, engine core, workers) exists."""
        return _group_alive(self.pid)

    def wait_healthy(
        self,
        timeout_s: float = 180.0,
        *,
        poll_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> float:
        """Poll ``/health`` until it answers 200; return the seconds waited.

        Raises ``InstanceStartError`` with the last 30 log lines when the server exits first or the
        timeout passes (the server is left running on timeout: call ``stop``).
        """
        start = clock()
        while True:
            code = self.process.poll()
            if code is not None:
                raise InstanceStartError(
                    f"vLLM {self.role} server on {self.url} exited with code {code} while starting; "
                    f"last lines of {self.log_path}:\n{tail_lines(self.log_path)}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as resp:
                    if resp.status == 200:
                        return clock() - start
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if clock() - start > timeout_s:
                raise InstanceStartError(
                    f"vLLM {self.role} server on {self.url} not healthy after {timeout_s:.0f} s; "
                    f"last lines of {self.log_path}:\n{tail_lines(self.log_path)}"
                )
            sleep(poll_s)

    def stop(self, timeout_s: float = 30.0, *, clock: Callable[[], float] = time.monotonic) -> None:
        """SIGTERM the whole group, SIGKILL what is left after ``timeout_s``; return when the group is gone.

        Idempotent. Raises ``RuntimeError`` if processes of the group survive SIGKILL for 10 s more.
        """
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGTERM)
        deadline = clock() + timeout_s
        while clock() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=0.2)  # reap the leader, or its zombie keeps the group alive
            if not self.group_alive():
                return
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        deadline = clock() + 10.0
        while clock() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=0.2)
            if not self.group_alive():
                return
        raise RuntimeError(f"process group {self.pid} ({self.url}) still alive after SIGKILL")

    def __enter__(self) -> LocalInstance:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_instance(config: InstanceConfig, log_dir: str | os.PathLike[str]) -> LocalInstance:
    """Launch one vLLM server (not yet healthy: call ``wait_healthy``). Example::

    cfg = InstanceConfig(model_dir=build_tiny_model("out/tiny"), max_num_seqs=16)
    with start_instance(cfg, "out/logs") as server:
        server.wait_healthy()
        httpx.post(f"{server.url}/v1/completions", json={"model": "tiny", "prompt": "hi"})
    """
    if not (Path(config.model_dir) / "config.json").exists():
        raise FileNotFoundError(f"{config.model_dir}/config.json: not a model directory (build_tiny_model?)")
    port = config.port if config.port is not None else free_port(config.host)
    logs = Path(log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"vllm-{config.role}-{port}.log"
    env = instance_env(config, os.environ)
    argv = server_command(config, port)
    with log_path.open("wb") as log:
        log.write(("$ " + " ".join(argv) + "\n").encode())
        log.flush()
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    return LocalInstance(
        url=f"http://{config.host}:{port}",
        role=config.role,
        pid=process.pid,
        log_path=log_path,
        config=config,
        process=process,
    )


def pd_pair_configs(
    model_dir: Path,
    kv_transfer: KVTransfer,
    *,
    options: Mapping[str, int | None] | None = None,
    extra_args: Sequence[str] = (),
    memory_shares: tuple[float, float] | None = None,
    decode_min_share: float = DEFAULT_DECODE_MIN_SHARE,
) -> tuple[InstanceConfig, InstanceConfig]:
    """The (prefill, decode) configs :func:`start_pd_pair` launches (see there); errors before any start."""
    opts = dict(options or {})
    unknown = set(opts) - {"max_num_seqs", "num_gpu_blocks_override"}
    if unknown:
        raise ValueError(f"start_pd_pair options: unknown {sorted(unknown)}")
    shares: tuple[float | None, float | None] = (None, None)
    if memory_shares is not None:
        problems = mixed_node_share_problems(*memory_shares, decode_min_share)
        if problems:
            raise ValueError("start_pd_pair memory_shares: " + "; ".join(problems))
        shares = memory_shares
    pd_roles: tuple[Role, Role] = ("prefill", "decode")
    configs = [
        InstanceConfig(
            model_dir=model_dir,
            role=role,
            kv_transfer=kv_transfer,
            max_num_seqs=opts.get("max_num_seqs"),
            num_gpu_blocks_override=opts.get("num_gpu_blocks_override"),
            extra_args=tuple(extra_args),
            memory_share=share,
        )
        for role, share in zip(pd_roles, shares, strict=True)
    ]
    return configs[0], configs[1]


def start_pd_pair(
    model_dir: Path,
    log_dir: str | os.PathLike[str],
    kv_transfer: KVTransfer,
    *,
    options: Mapping[str, int | None] | None = None,
    extra_args: Sequence[str] = (),
    memory_shares: tuple[float, float] | None = None,
    decode_min_share: float = DEFAULT_DECODE_MIN_SHARE,
) -> tuple[LocalInstance, LocalInstance]:
    """Start a prefill and a decode server joined by ``kv_transfer`` (both starting in parallel).

    ``options`` may set ``max_num_seqs`` and ``num_gpu_blocks_override`` for both. ``memory_shares``
    (prefill, decode) makes the pair one PD-mixed node: each gets that share of the node's memory
    (checked by :func:`mixed_node_share_problems`). The caller waits for health and stops both (stop the
    first if the second fails to start).
    """
    configs = pd_pair_configs(
        model_dir,
        kv_transfer,
        options=options,
        extra_args=extra_args,
        memory_shares=memory_shares,
        decode_min_share=decode_min_share,
    )
    pair: list[LocalInstance] = []
    try:
        for cfg in configs:
            pair.append(start_instance(cfg, log_dir))
    except BaseException:
        for inst in pair:
            inst.stop()
        raise
    return pair[0], pair[1]
