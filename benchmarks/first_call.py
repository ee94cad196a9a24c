"""The first call of a fresh `jax.jit` on a model of many held `eqx.nn.Linear` layers,
each in a fresh process, AutoModule and the fair twin alternated:
`python -m benchmarks.first_call [--layers 4096] [--pairs 15]`.

A fresh process is the only place the first call is what a user meets: in one
process, the second model's classes, carrier makers and JAX caches are warm. The
time is the process's CPU time for the call (trace, compile, run), which a busy
machine inflates less than the wall time.
"""

import argparse
import gc
import statistics
import subprocess
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

KINDS = ("autostatic", "eqx-static")


def _model(kind: str, layers: int) -> eqx.Module:
    rng = np.random.default_rng(0)
    template = eqx.nn.Linear(8, 8, key=jax.random.key(0))

    def layer() -> eqx.nn.Linear:
        weight = jnp.asarray(rng.standard_normal((8, 8)), jnp.float32)
        bias = jnp.asarray(rng.standard_normal(8), jnp.float32)
        return eqx.tree_at(lambda x: (x.weight, x.bias), template, (weight, bias))

    made = [layer() for _ in range(layers)]
    return (_ours if kind == "autostatic" else _twin)()(made, jax.nn.relu)


def _ours() -> type:
    import autostatic as asx

    class MLP(asx.AutoModule):
        layers: list
        activation: object

    return MLP


def _twin() -> type:
    class MLP(eqx.Module):
        layers: list
        activation: object = eqx.field(static=True)

    return MLP


def one(kind: str, layers: int) -> float:
    """The CPU seconds of the first call, in this process."""
    model = _model(kind, layers)
    jax.jit(lambda x: x + 1)(1.0)  # JAX's own first-use work, outside the timing
    gc.collect()
    call = jax.jit(lambda m: m.layers[0].weight + 1)
    start = time.process_time()
    jax.block_until_ready(call(model))
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description="The first call of a fresh jax.jit, in fresh processes."
    )
    parser.add_argument("--layers", type=int, default=4096)
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--one", choices=KINDS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(one(args.one, args.layers))
        return
    seconds: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for _ in range(args.pairs):
        for kind in KINDS:
            command = [sys.executable, "-m", "benchmarks.first_call", "--one", kind]
            command += ["--layers", str(args.layers)]
            out = subprocess.run(command, capture_output=True, text=True, check=True)
            seconds[kind].append(float(out.stdout.split()[-1]))
    ours, twin = seconds["autostatic"], seconds["eqx-static"]
    ratios = sorted(a / b for a, b in zip(ours, twin))
    print(
        f"{args.layers} held eqx.nn.Linear, first call CPU s over {args.pairs} pairs: "
        f"autostatic {statistics.median(ours):.3f}, eqx-static "
        f"{statistics.median(twin):.3f}; ratio of medians "
        f"{statistics.median(ours) / statistics.median(twin):.2f}x, paired "
        f"{ratios[0]:.2f}-{ratios[-1]:.2f}x (median {statistics.median(ratios):.2f}x)"
    )


if __name__ == "__main__":
    main()
