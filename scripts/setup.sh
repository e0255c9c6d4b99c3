#!/usr/bin/env bash
# Create .venv and install dsv4_decode with its dev extras (pytest, ruff).
# With an NVIDIA GPU: PyTorch from PyPI (its CUDA build). Without one: PyTorch's CPU build
# (torch 2.13.0 from a local wheel folder when pip's find-links holds it, as on our CI machines;
# else from PyTorch's CPU index) and triton 3.6, whose interpreter runs the kernels in the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  links="${PIP_FIND_LINKS:-$(.venv/bin/python -m pip config get global.find-links 2>/dev/null || true)}"
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    "${pip[@]}" "torch>=2.11"
  elif ls "${links:-/nonexistent}"/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then
    "${pip[@]}" "torch==2.13.0"
  else
    "${pip[@]}" "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu \
      --extra-index-url https://pypi.org/simple
  fi
fi
"${pip[@]}" "triton==3.6.0" -e ".[dev]"
.venv/bin/python -c "import dsv4_decode, torch, triton, pytest"  # fail here if setup broke
