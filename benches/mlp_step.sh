#!/usr/bin/env bash
# Forward+backward of one MLP training step, Forma beside PyTorch in one run
# (PyTorch's side is skipped with a note when it is not installed).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench -q -p forma-benches --bench mlp_step
if python3 -c "import torch" >/dev/null 2>&1; then
    python3 benches/mlp_step.py
else
    echo "torch  not installed: PyTorch's figure skipped (pip install torch to compare)"
fi
