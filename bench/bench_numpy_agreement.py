"""How closely the torch-free step (forecaster/inference.py) follows the torch model, and what float64 buys.

Run: ``.venv/bin/python bench/bench_numpy_agreement.py [--configs 40] [--steps 40]``. (1) For random small
configurations (window 1-8, 1-2 layers, 1/2/4 heads, baseline skip on every other one; random init weights,
4 nodes, random encoded inputs), the largest absolute difference on normalised outputs (quantiles and burst
logit) from the torch model run in float64, for torch float32, numpy float32 and numpy float64. (2) The
shipped checkpoint stepped on 8 nodes of random raw channels (10 % masked) for 300 steps by the torch and the
numpy forecaster: the largest relative difference of the totals and burst probabilities, per numpy dtype.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forecaster.inference import NumpyLearnedForecaster, NumpyNet
from forecaster.netconfig import NetConfig
from forecaster.network import LstmAttentionNet
from forecaster.streaming import LearnedForecaster
from forecaster.types import CHANNELS

CKPT = Path(__file__).resolve().parents[1] / "forecaster" / "checkpoints" / "default.safetensors"
FIELDS = ("arrivals_p50", "arrivals_p90", "prompt_tokens_p90", "gen_tokens_p90", "burst_prob")


def random_configs(n_configs: int, steps: int) -> dict[str, float]:
    worst = {"torch float32": 0.0, "numpy float32": 0.0, "numpy float64": 0.0}
    for seed in range(n_configs):
        rng = np.random.default_rng(seed)
        heads = int(rng.choice([1, 2, 4]))
        skip = {
            "baseline_halflives": (2.0, 7.5),
            "baseline_inputs": (0, 1, 2),
            "baseline_masks": (10, 11, -1),
        }
        cfg = NetConfig(
            22, hidden=4 * heads, layers=int(rng.integers(1, 3)), heads=heads, window=int(rng.integers(1, 9)),
            **(skip if seed % 2 else {}),  # type: ignore[arg-type]
        )  # fmt: skip
        torch.manual_seed(seed)
        net = LstmAttentionNet.from_config(cfg).eval()
        z = rng.standard_normal((4, steps, 22)).astype(np.float32)
        z[..., 10:20] = z[..., 10:20] > 0
        with torch.no_grad():
            f32 = net(torch.from_numpy(z))
            ref = net.double()(torch.from_numpy(z).double())
        net.float()
        weights = {k: v.numpy() for k, v in net.state_dict().items()}
        for dtype, name in ((np.float32, "numpy float32"), (np.float64, "numpy float64")):
            npn = NumpyNet(weights, cfg, dtype=dtype)
            state = npn.new_state(4)
            for i in range(steps):
                q, logit = npn.step(state, z[:, i], i)
                d = max(
                    np.abs(q - ref.quantiles[:, i].numpy()).max(),
                    np.abs(logit - ref.burst_logit[:, i].numpy()).max(),
                )
                worst[name] = max(worst[name], float(d))
        d = max(
            np.abs(f32.quantiles.numpy() - ref.quantiles.numpy()).max(),
            np.abs(f32.burst_logit.numpy() - ref.burst_logit.numpy()).max(),
        )
        worst["torch float32"] = max(worst["torch float32"], float(d))
    return worst


def shipped(steps: int = 300, n: int = 8) -> dict[str, float]:
    torch.set_num_threads(1)
    ref = LearnedForecaster.load(CKPT, num_threads=1)
    out = {}
    for dtype in (np.float32, np.float64):
        ours = NumpyLearnedForecaster.load(CKPT, dtype=dtype)
        rng = np.random.default_rng(0)
        ids = [str(i) for i in range(n)]
        ref.reset(ids)
        ours.reset(ids)
        worst = 0.0
        for k in range(steps):
            x = rng.gamma(2.0, 50.0, size=(n, len(CHANNELS)))
            mask = rng.random(x.shape) > 0.1
            x[~mask] = np.nan
            a, b = ref.step(x, mask, 1.7e9 + k), ours.step(x, mask, 1.7e9 + k)
            for name in FIELDS:
                u, v = getattr(a, name), getattr(b, name)
                worst = max(worst, float(np.nanmax(np.abs(u - v) / np.maximum(np.abs(u), 1e-9))))
        out[f"numpy {np.dtype(dtype).name}"] = worst
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", type=int, default=40)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    torch.set_num_threads(1)
    worst = random_configs(args.configs, args.steps)
    print(f"{args.configs} random configurations × {args.steps} steps, max |difference| from torch float64:")
    for name, d in worst.items():
        print(f"  {name}: {d:.3g}")
    if CKPT.exists():
        print(
            "shipped checkpoint, 8 nodes × 300 steps, max relative difference of totals / burst_prob from torch:"
        )
        for name, d in shipped().items():
            print(f"  {name}: {d:.3g}")


if __name__ == "__main__":
    main()
