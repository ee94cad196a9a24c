#!/usr/bin/env bash
# The GPU benchmark, as one prepared command for a lent GPU machine (which already has
# jax with CUDA, equinox, optax and matplotlib, and no network): runs this checkout in
# place (PYTHONPATH, no install: pip's isolated build would need the network), checks
# that JAX sees the GPU, and runs the quick comparison on the GPU backend, writing the
# committed benchmarks/results/gpu/. Where the checkout has no .git, set
# AUTOSTATIC_COMMIT to the commit measured. A timeout stops it at 8 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# The construction section starts processes of its own: without this each one asks
# for 75% of the GPU's memory while the main process holds as much.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
"$PYTHON" - <<'PY'
import jax, equinox, autostatic
backend = jax.default_backend()
print("jax", jax.__version__, "equinox", equinox.__version__, "backend", backend,
      [d.device_kind for d in jax.devices()])
if backend != "gpu":
    raise SystemExit(f"no GPU backend (got {backend!r}): refusing to write results/gpu")
PY
timeout 480 "$PYTHON" -m benchmarks --quick --write-results
