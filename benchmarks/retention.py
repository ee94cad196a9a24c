"""What the library keeps of dropped models, and whether its cost grows with the
layouts it has seen: `python -m benchmarks.retention`.

- Retention: 2,000 models each holding a static list of 10,000 ints, each called
  through `jax.jit` and dropped; the resident memory gained, AutoModule against the
  fair twin (the list a static tuple), each in a fresh process.
- Layouts: models whose dict field has new keys each time (per-layer names); the
  cost of building and flattening one, over the first blocks of 300 and after
  30,000 distinct layouts, against the same `eqx.Module` run block by block in turn.
"""

import gc
import statistics
import subprocess
import sys
import time
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

import autostatic as asx

MODELS = 2000
LAYOUTS = 30_000
SAMPLE = 300


def _resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e6


def _model_class(kind: str) -> Any:
    if kind == "autostatic":

        class Held(asx.AutoModule):
            w: jax.Array
            table: list

        return Held

    class Twin(eqx.Module):
        w: jax.Array
        table: tuple = eqx.field(static=True)

    return Twin


def retained(kind: str) -> tuple[float, float]:
    """Resident MB gained over `MODELS` dropped models of `kind`, and resident MB
    after (run in a fresh process, so that nothing else has grown the heap)."""
    cls = _model_class(kind)
    table = list if kind == "autostatic" else tuple
    w = jnp.ones(2)
    jax.jit(lambda m: m.w + 1)(cls(w, table(range(3))))
    gc.collect()
    before = _resident_mb()
    for _ in range(MODELS):
        model = cls(w, table(range(10_000)))
        jax.jit(lambda m: m.w + 1)(model)
        del model
    gc.collect()
    after = _resident_mb()
    return after - before, after


class _Named(asx.AutoModule):
    w: jax.Array
    names: dict


class _NamedTwin(eqx.Module):
    w: jax.Array
    names: dict


def _per_model(cls: type, start: int, stop: int) -> float:
    """Seconds per model to build and flatten models `start` to `stop`, each with
    its own dict keys."""
    w = jnp.ones(2)
    t = time.perf_counter()
    for i in range(start, stop):
        jax.tree_util.tree_flatten(cls(w, {f"layer{i}_{j}": j for j in range(5)}))
    return (time.perf_counter() - t) / (stop - start)


def layout_cost() -> dict[str, tuple[float, float]]:
    """Per class, the median seconds per model over the first 5 blocks of `SAMPLE`
    models and over 5 blocks after `LAYOUTS` distinct layouts; both classes run
    block by block in turn, so that the machine's load moves both alike."""
    classes = {"autostatic": _Named, "eqx.Module": _NamedTwin}
    times: dict[str, list[float]] = {name: [] for name in classes}
    blocks = LAYOUTS // SAMPLE + 5
    for b in range(blocks):
        for name, cls in classes.items():
            times[name].append(_per_model(cls, b * SAMPLE, (b + 1) * SAMPLE))
    return {
        name: (statistics.median(t[:5]), statistics.median(t[-5:]))
        for name, t in times.items()
    }


def main() -> None:
    print(f"Retention: resident MB gained over {MODELS} dropped models (10k-int list)")
    for kind in ("autostatic", "eqx-static"):
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                f"import benchmarks.retention as r; print(*r.retained({kind!r}))",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        gained, total = map(float, out.stdout.split()[-2:])
        print(f"  {kind}: +{gained:.1f} MB (resident after: {total:.0f} MB)")
    print(
        f"Layouts: per model, first {SAMPLE} and after {LAYOUTS:,} distinct dict keys"
    )
    for name, (first, last) in layout_cost().items():
        print(
            f"  {name}: {first * 1e6:.0f} µs, then {last * 1e6:.0f} µs "
            f"({last / first:.2f}x)"
        )


if __name__ == "__main__":
    main()
