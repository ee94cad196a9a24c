"""The containers section: the models people write with their parameters in plain
containers, no module per layer. Each kind is one class `A` of two fields, `params`
(the container) and `activation` (`jax.nn.relu`), at 16, 256 and 4,096 entries:

- `readme-mlp`: a list of `{"w": (8, 8), "b": (8,)}` dicts, the README's first model;
- `dict-of-dicts`: `{"layer_0": {"w": ..., "b": ...}, ...}`;
- `list-of-arrays`: a list of (8, 8) arrays;
- `mixed-tuples`: a list of `(array, jax.nn.relu, i)` tuples, arrays mixed with static
  values.

Implementations, every cell of one kind and size interleaved in one run:

- `autostatic`: `A` on AutoModule, called through plain `jax.jit`;
- `eqx-static`: the fair twin, `A` on `eqx.Module` with `activation` marked
  `eqx.field(static=True)`, under plain `jax.jit`. Plain `jax.jit` refuses it holding
  mixed tuples (a function leaf), so for `mixed-tuples` it holds their dynamic half,
  `(array, None, None)` tuples: what `eqx.partition(twin, eqx.is_array)[0]` holds;
- `eqx-filter`: `A` on `eqx.Module` without a marker, under `eqx.filter_jit`: what
  Equinox users run (its dispatch only).

Per kind and size: flatten, unflatten (`treedef.unflatten(leaves)`, no field read) and
the dispatch of a jitted function returning a constant (warmed first), each paired per
round; and the Python memory of one model, AutoModule's against the fair twin's class
holding the same containers (`scaling.memory_per_model`: the arrays made beforehand
and shared, the containers made anew per model).
"""

import functools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from . import models as M
from .scaling import layer_arrays, memory_per_model
from .schema import ContainersKind, ContainersSize, SAME_CONTAINERS
from .settings import Settings
from .timing import paired_ratio, run_interleaved, scaled_summary

Arrays = list[tuple[jax.Array, jax.Array]]

FAIR, FILTER = "eqx-static", "eqx-filter"
MEMORY_IMPLS = ("autostatic", FAIR)
OPS = ("flatten", "unflatten", "dispatch")  # timed on AutoModule and the fair baseline


def readme_mlp(arrays: Arrays) -> list[dict[str, jax.Array]]:
    """The README's `MLP.layers`: a list of `{"w", "b"}` dicts."""
    return [{"w": w, "b": b} for w, b in arrays]


def dict_of_dicts(arrays: Arrays) -> dict[str, dict[str, jax.Array]]:
    """`{"layer_0": {"w", "b"}, ...}`."""
    return {f"layer_{i}": {"w": w, "b": b} for i, (w, b) in enumerate(arrays)}


def list_of_arrays(arrays: Arrays) -> list[jax.Array]:
    """A list of the weights."""
    return [w for w, _ in arrays]


def mixed_tuples(arrays: Arrays) -> list[tuple[jax.Array, Callable, int]]:
    """A list of `(weight, jax.nn.relu, i)` tuples."""
    return [(w, jax.nn.relu, i) for i, (w, _) in enumerate(arrays)]


def dynamic_half(arrays: Arrays) -> list[tuple[jax.Array, None, None]]:
    """What `eqx.partition(twin, eqx.is_array)[0]` holds of `mixed_tuples`."""
    return [(w, None, None) for w, _ in arrays]


# Each kind's `params`, made anew from shared arrays on every call.
KINDS: dict[str, Callable[[Arrays], Any]] = {
    "readme-mlp": readme_mlp,
    "dict-of-dicts": dict_of_dicts,
    "list-of-arrays": list_of_arrays,
    "mixed-tuples": mixed_tuples,
}
# What the fair twin holds where plain `jax.jit` refuses it the kind's own `params`.
FAIR_PARAMS: dict[str, Callable[[Arrays], Any]] = {"mixed-tuples": dynamic_half}
FAIR_HOLDS: dict[str, str] = {
    "mixed-tuples": "its dynamic half, `(array, None, None)` tuples (plain `jax.jit` "
    "refuses the function in each tuple)",
}


@functools.cache
def classes() -> dict[str, type]:
    """`A` on AutoModule, the fair twin and the unmarked twin: the same two fields."""
    asx = M.asx
    if asx is None:
        raise RuntimeError(f"autostatic is unavailable ({M.AUTOSTATIC_ERROR})")

    class A(asx.AutoModule):
        params: object
        activation: object

    class FairTwin(eqx.Module):
        params: object
        activation: object = eqx.field(static=True)

    class Unmarked(eqx.Module):
        params: object
        activation: object

    return {"autostatic": A, FAIR: FairTwin, FILTER: Unmarked}


def builder(
    impl: str, params: Callable[[Arrays], Any], arrays: Arrays
) -> Callable[[], Any]:
    """What builds one model of `impl` holding `params(arrays)` (its containers made
    anew each call, never its arrays)."""
    cls = classes()[impl]
    return lambda: cls(params(arrays), jax.nn.relu)


def constant(model: Any) -> jax.Array:
    """The dispatch cells' function: a constant, whatever the model holds."""
    return jnp.zeros(())


def _cells(models: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    """Every cell of one kind and size: `"<impl>|<op>"` -> what is timed."""
    cells: dict[str, Callable[[], Any]] = {}
    for impl, model in models.items():
        jitted = (eqx.filter_jit if impl == FILTER else jax.jit)(constant)
        jitted(model).block_until_ready()  # traced and compiled before timing
        cells[f"{impl}|dispatch"] = lambda f=jitted, m=model: f(m).block_until_ready()
        if impl == FILTER:
            continue
        leaves, treedef = jax.tree_util.tree_flatten(model)
        cells[f"{impl}|flatten"] = functools.partial(jax.tree_util.tree_flatten, model)
        cells[f"{impl}|unflatten"] = functools.partial(treedef.unflatten, leaves)
    return cells


def _size(kind: str, arrays: Arrays, settings: Settings, seed: int) -> ContainersSize:
    """One kind at one size: its cells interleaved, then its memory."""
    params = KINDS[kind]
    models = {
        "autostatic": builder("autostatic", params, arrays)(),
        FAIR: builder(FAIR, FAIR_PARAMS.get(kind, params), arrays)(),
        FILTER: builder(FILTER, params, arrays)(),
    }
    samples = run_interleaved(
        _cells(models),
        settings.rounds,
        settings.target_batch_s,
        seed=seed,
        min_rounds=5,
        max_seconds=settings.group_budget_s,
    )
    ratios = {
        op: paired_ratio(samples[f"autostatic|{op}"], samples[f"{FAIR}|{op}"])
        for op in OPS
    }
    ratios["dispatch_filter_jit"] = paired_ratio(
        samples["autostatic|dispatch"], samples[f"{FILTER}|dispatch"]
    )
    count = max(2, 8192 // len(arrays))
    memory = {
        impl: memory_per_model(builder(impl, params, arrays), count)
        for impl in MEMORY_IMPLS
    }
    return {
        "us": {key: scaled_summary(values, 1e6) for key, values in samples.items()},
        "ratios": ratios,
        "memory_bytes": memory,
        "memory_ratio": memory["autostatic"] / memory[FAIR],
    }


@functools.cache
def shared_arrays(n: int) -> Arrays:
    """The `n` (weight, bias) pairs every kind and implementation of size `n` holds."""
    return layer_arrays(n)


def containers(kind: str, settings: Settings) -> ContainersKind:
    """One kind at every size of `settings.containers_sizes`."""
    seed = list(KINDS).index(kind)
    return {
        "fair": FAIR_HOLDS.get(kind, SAME_CONTAINERS),
        "sizes": {
            str(n): _size(kind, shared_arrays(n), settings, seed)
            for n in settings.containers_sizes
        },
    }
