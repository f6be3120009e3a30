#!/usr/bin/env bash
# Create .venv and install fedclust with every extra (nn: FedCRef and EMD-CFL; trackers; Hugging
# Face) and the test tools. Torch is installed first, the CPU build of the version CI uses, so
# that nothing pulls CUDA wheels; the `nn` extra then accepts it (torch>=2.2,<3).
# Idempotent: quick when already set up.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
# Where pip's default index serves CUDA builds (stock PyPI on Linux), set
# TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu to get the CPU build.
python -c "import torch" 2>/dev/null || python -m pip install -q torch==2.13.0 \
    ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
python -m pip install -q -e ".[test]"
