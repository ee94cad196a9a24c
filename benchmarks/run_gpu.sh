#!/usr/bin/env bash
# The GPU benchmark, as one prepared command for a lent GPU machine (which already has
# jax with CUDA, equinox, optax and pytest-benchmark): installs this checkout without
# touching those, checks that JAX sees the GPU, and runs the quick comparison on the
# GPU backend, writing the committed benchmarks/results/gpu/. Meant to finish in well
# under 5 minutes; a timeout stops it at 9.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q --no-deps -e .
python - <<'PY'
import jax
backend = jax.default_backend()
print("jax", jax.__version__, "backend", backend, jax.devices())
if backend != "gpu":
    raise SystemExit(f"no GPU backend (got {backend!r}): refusing to write results/gpu")
PY
timeout 540 python -m benchmarks --quick --write-results
