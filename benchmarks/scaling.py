"""The scaling section: from 16 to 4,096 layers, for both kinds of layer a model is
made of, AutoModule against the fair twin (the same classes on `eqx.Module`, every
non-array field marked `eqx.field(static=True)`, under the same plain `jax.jit`):

- `own`: the user's own `Linear` (a weight and a bias) as an AutoModule, in an MLP
  that holds them in a list beside its activation, as Equinox's docs write one;
- `eqx.nn`: `eqx.nn.Linear` layers held in the same MLP.

Per depth: flatten, unflatten + read every field, a `jax.jit` call's dispatch, and the
same call's dispatch against `eqx.filter_jit` on the unmarked twin (the same classes
without markers: what Equinox users run), all paired per round; and the Python memory
of one model (`tracemalloc`, the arrays made beforehand and shared by AutoModule and
the fair twin, so only what each keeps per model is counted).
"""

import functools
import gc
import tracemalloc
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .schema import Scaling, ScalingDepth
from .settings import Settings
from .timing import paired_ratio, run_interleaved, scaled_summary

try:
    import autostatic as asx
except Exception:  # the report says why every cell failed
    asx = None

KINDS = ("own", "eqx.nn")
IMPLS = ("autostatic", "eqx-static")
OPS = ("flatten", "unflatten_read", "dispatch")
FILTER = "eqx-filter"  # the unmarked twin, timed for its `eqx.filter_jit` dispatch only
WIDTH = 8


@functools.cache
def _classes(kind: str) -> dict[tuple[str, str], type]:
    """The MLP classes, and the user's own Linear, of every implementation, made
    anew for each `kind`: a user's MLP class holds one kind of layer, and
    AutoModule's generated flatten is made for the items its first instance holds
    (an MLP class of both kinds flattens the second by its general code)."""
    assert asx is not None

    class OwnLinear(asx.AutoModule):
        weight: jax.Array
        bias: jax.Array

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.weight @ x + self.bias

    class MLP(asx.AutoModule):
        layers: list
        activation: Callable

    class EqxOwnLinear(eqx.Module):
        weight: jax.Array
        bias: jax.Array

    class EqxMLP(eqx.Module):
        layers: list
        activation: Callable = eqx.field(static=True)

    class UnmarkedMLP(eqx.Module):
        layers: list
        activation: Callable

    return {
        ("autostatic", "layer"): OwnLinear,
        ("autostatic", "mlp"): MLP,
        ("eqx-static", "layer"): EqxOwnLinear,
        ("eqx-static", "mlp"): EqxMLP,
        (FILTER, "layer"): EqxOwnLinear,
        (FILTER, "mlp"): UnmarkedMLP,
    }


def layer_arrays(n: int) -> list[tuple[jax.Array, jax.Array]]:
    keys = jax.random.split(jax.random.key(0), n)
    return [(jax.random.normal(k, (WIDTH, WIDTH)), jnp.zeros(WIDTH)) for k in keys]


def _linear(weight: jax.Array, bias: jax.Array) -> eqx.nn.Linear:
    """An `eqx.nn.Linear` holding these arrays, made as its constructor makes one."""
    layer = eqx.nn.Linear(WIDTH, WIDTH, key=jax.random.key(0))
    return eqx.tree_at(lambda m: (m.weight, m.bias), layer, (weight, bias))


def builder(
    kind: str, impl: str, arrays: list[tuple[jax.Array, jax.Array]]
) -> Callable[[], Any]:
    """What builds one model of `kind` and `impl` around `arrays` (made anew each
    call: its layer objects too, never its arrays)."""
    classes = _classes(kind)
    mlp = classes[(impl, "mlp")]
    if kind == "own":
        layer = classes[(impl, "layer")]
        return lambda: mlp([layer(w, b) for w, b in arrays], jax.nn.relu)
    linears = [_linear(w, b) for w, b in arrays]
    return lambda: mlp(
        [jax.tree_util.tree_map(lambda x: x, layer) for layer in linears],
        jax.nn.relu,
    )


def _read_all(model: Any) -> tuple[Any, ...]:
    read = [(layer.weight, layer.bias) for layer in model.layers]
    return read, model.activation


def _cells(models: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    cells: dict[str, Callable[[], Any]] = {}
    for impl, model in models.items():
        if impl == FILTER:
            filtered = eqx.filter_jit(lambda m: m.layers[0].weight + 1)
            filtered(model).block_until_ready()
            cells[f"{impl}|dispatch"] = lambda f=filtered, m=model: f(m)
            continue
        leaves, treedef = jax.tree_util.tree_flatten(model)
        probe = jax.jit(lambda m: m.layers[0].weight + 1)
        probe(model).block_until_ready()
        cells[f"{impl}|flatten"] = lambda m=model: jax.tree_util.tree_flatten(m)
        cells[f"{impl}|unflatten_read"] = lambda d=treedef, x=leaves: _read_all(
            jax.tree_util.tree_unflatten(d, x)
        )
        cells[f"{impl}|dispatch"] = lambda f=probe, m=model: f(m)
    return cells


def memory_per_model(build: Callable[[], Any], count: int) -> float:
    """Python bytes one model keeps, flattened once, over `count` models."""
    jax.tree_util.tree_flatten(build())  # every cache a first model fills
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        models = [build() for _ in range(count)]
        for model in models:
            jax.tree_util.tree_flatten(model)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    return sum(s.size_diff for s in after.compare_to(before, "filename")) / count


def _depth(kind: str, n: int, settings: Settings) -> ScalingDepth:
    arrays = layer_arrays(n)
    builds = {impl: builder(kind, impl, arrays) for impl in IMPLS}
    models = {impl: build() for impl, build in builds.items()}
    models[FILTER] = builder(kind, FILTER, arrays)()
    samples = run_interleaved(
        _cells(models),
        settings.rounds,
        settings.target_batch_s,
        min_rounds=5,
        max_seconds=settings.group_budget_s,
    )
    count = max(2, 8192 // n)
    memory = {impl: memory_per_model(build, count) for impl, build in builds.items()}
    us = {key: scaled_summary(values, 1e6) for key, values in samples.items()}
    ratios = {
        op: paired_ratio(samples[f"autostatic|{op}"], samples[f"eqx-static|{op}"])
        for op in OPS
    }
    ratios["dispatch_filter_jit"] = paired_ratio(
        samples["autostatic|dispatch"], samples[f"{FILTER}|dispatch"]
    )
    return {
        "us": us,
        "ratios": ratios,
        "memory_bytes": memory,
        "memory_ratio": memory["autostatic"] / memory["eqx-static"],
    }


def scaling(settings: Settings) -> Scaling:
    """Every depth of `settings.scaling_sizes`, for both kinds of layer."""
    return {
        "sizes": list(settings.scaling_sizes),
        "kinds": {
            kind: {str(n): _depth(kind, n, settings) for n in settings.scaling_sizes}
            for kind in KINDS
        },
    }
