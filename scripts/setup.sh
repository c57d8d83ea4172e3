#!/usr/bin/env bash
# Set up a virtual environment in .venv with layerslide and everything its tests need.
# Where no NVIDIA GPU is present, torch comes as the CPU build (torch==2.13.0, which pip finds
# locally on the team's machines) so that pip does not pull a multi-GB CUDA build; set
# LAYERSLIDE_TORCH to another requirement (e.g. "torch==2.11.0") to choose yourself.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
pip_install() { .venv/bin/python -m pip install --disable-pip-version-check -q "$@"; }
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    pip_install "${LAYERSLIDE_TORCH:-torch}"
  else
    pip_install "${LAYERSLIDE_TORCH:-torch==2.13.0}"
  fi
fi
pip_install -e ".[executor,dev]"
echo "layerslide installed in $(pwd)/.venv: run .venv/bin/layerslide --help"
