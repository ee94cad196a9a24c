#!/usr/bin/env bash
# The accelerator benchmark, as one prepared command for a lent GPU or TPU machine
# (which already has jax for it, and equinox, optax and matplotlib, and no network):
# runs this checkout in place (PYTHONPATH, no install: pip's isolated build would need
# the network), checks that JAX sees a GPU or TPU, and runs the quick comparison on
# that backend, writing the committed benchmarks/results/<backend>/. Where the
# checkout is a copy, set AUTOSTATIC_COMMIT to the commit measured. A timeout stops
# it at 9 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# The construction section starts processes of its own: without this each one asks
# for 75% of a GPU's memory while the main process holds as much. (Beside a TPU,
# which one process holds at a time, they run on the host's CPU.)
export XLA_PYTHON_CLIENT_PREALLOCATE=false
"$PYTHON" - <<'PY'
import jax, equinox, autostatic
backend = jax.default_backend()
print("jax", jax.__version__, "equinox", equinox.__version__, "backend", backend,
      [d.device_kind for d in jax.devices()])
if backend not in ("gpu", "tpu"):
    raise SystemExit(f"no GPU or TPU backend (got {backend!r}): refusing to write results")
PY
timeout 540 "$PYTHON" -m benchmarks --quick --write-results
