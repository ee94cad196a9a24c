"""Micro-benchmarks behind single design decisions, each paired in one process.

`python -m benchmarks.micro` prints, as paired ratios (median and IQR over rounds):

- aux comparison: the flat `tuple` subclass `Aux` vs a plain tuple vs a `NamedTuple`
  with the static values nested (what JAX's treedef `==` runs on a jit cache lookup);
- the routed `eqx.tree_at` vs Equinox's own, on 256 `eqx.nn.Linear` layers held by an
  `eqx.Module` and by an `AutoModule`, replacing an array and a sub-module;
- tree operations on 256 `eqx.nn.Linear(8, 8)` layers in a list beside an activation:
  AutoModule (which swaps the layers for its own fast layer classes) vs `eqx.Module`
  with the activation marked static vs the same arrays in dicts (the floor);
- unflatten + read every field of the four real models, AutoModule vs the fair twin,
  with warm caches (20 calls a batch, back to back) and cold (2 calls a batch, after
  24 MB of other allocations): the comparison runner's batches are as short as the
  cold ones and follow other cells;
- the form of a held layer's node: unflatten + read of 256 `eqx.nn.Linear(8, 8)` as
  Equinox's own nodes, as this library's carriers (a slotted class of their own, no
  subclass of the layer class), and as two prototypes of that form (its
  layer's dict filled by stores, as ours is, or by `object.__setattr__`, as
  Equinox fills a module), warm and cold: what the carrier costs, and what another
  form of it would save.
"""

import gc
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

import autostatic as asx
from autostatic._compat import original_tree_at
from autostatic.core._carriers import with_layers as asx_with_layers
from autostatic.core._layout import Aux

from . import models as M, real_models as R
from .registry import MODELS
from .timing import drop_failing, frozen_heap, paired_ratio, run_interleaved, summary


class _NestedAux(NamedTuple):
    """An aux with the static values nested in a tuple of their own."""

    layout: Any
    static_types: tuple[type, ...]
    static_values: tuple[Any, ...]


def _report(title: str, samples: dict[str, list[float]], reference: str) -> None:
    """Prints every cell's paired ratio to the `reference` cell."""
    print(title)
    for name, values in samples.items():
        if name != reference:
            ratio = paired_ratio(values, samples[reference])
            print(
                f"  {name} / {reference}: {ratio['median']:.3f}x "
                f"(IQR {ratio['q1']:.3f}-{ratio['q3']:.3f}, {ratio['n']} rounds)"
            )


def aux_comparison(rounds: int = 30) -> None:
    """`==` of two equal aux values in three layouts: what a jit cache lookup
    compares."""
    layout = object()

    def values() -> tuple[Any, ...]:
        return (jax.nn.gelu, 2, 0.1, "name")  # new objects where Python makes them

    def types(v: tuple[Any, ...]) -> tuple[type, ...]:
        return tuple(map(type, v))

    va, vb = values(), values()
    tuples = (layout, types(va), *va), (layout, types(vb), *vb)
    flat = Aux(tuples[0]), Aux(tuples[1])
    nested = _NestedAux(layout, types(va), va), _NestedAux(layout, types(vb), vb)
    samples = run_interleaved(
        {
            "plain tuple": lambda: tuples[0] == tuples[1],
            "Aux (tuple subclass)": lambda: flat[0] == flat[1],
            "NamedTuple, values nested": lambda: nested[0] == nested[1],
        },
        rounds,
    )
    _report("aux == of two equal, separately built values", samples, "plain tuple")


class _EqxHolder(eqx.Module):
    layers: list


class _AutoHolder(asx.AutoModule):
    layers: list


def routed_tree_at(rounds: int = 15) -> None:
    """The routed `eqx.tree_at` against Equinox's own, on both holders."""
    keys = jax.random.split(jax.random.key(0), 256)
    layers = [eqx.nn.Linear(8, 8, key=k) for k in keys]
    weight, linear = jnp.ones((8, 8)), eqx.nn.Linear(8, 8, key=keys[0])
    for holder in (_EqxHolder(layers), _AutoHolder(layers)):
        cells = {}
        for replaced, where, new in (
            ("array", lambda m: m.layers[3].weight, weight),
            ("sub-module", lambda m: m.layers[3], linear),
        ):
            cells[f"Equinox's, {replaced}"] = lambda w=where, n=new, h=holder: (
                original_tree_at(w, h, n)
            )
            cells[f"routed, {replaced}"] = lambda w=where, n=new, h=holder: eqx.tree_at(
                w, h, n
            )
        failed = drop_failing(cells)
        samples = run_interleaved(cells, rounds, batch_s=0.02)
        print(
            f"eqx.tree_at on 256 eqx.nn.Linear in an {type(holder).__mro__[1].__name__}"
        )
        for replaced in ("array", "sub-module"):
            reason = failed.get(f"Equinox's, {replaced}")
            if reason is not None:
                # A held layer's node is its carrier, not the layer its attribute
                # holds, which Equinox's own `tree_at` looks for: the route exists
                # for this.
                print(f"  {replaced}: Equinox's own fails ({reason})")
                continue
            ratio = paired_ratio(
                samples[f"routed, {replaced}"], samples[f"Equinox's, {replaced}"]
            )
            print(
                f"  {replaced}: routed / Equinox's {ratio['median']:.3f}x "
                f"(IQR {ratio['q1']:.3f}-{ratio['q3']:.3f})"
            )


class _EqxLinears(eqx.Module):
    layers: list
    activation: Any = eqx.field(static=True)


class _AutoLinears(asx.AutoModule):
    layers: list
    activation: Any


def _read_layers(model: Any) -> None:
    """Reads every layer's arrays through its attributes."""
    for layer in model.layers:
        layer.weight, layer.bias  # noqa: B018  # the reads are what is timed


def _read_dicts(tree: Any) -> None:
    """Reads every layer's arrays from its dict."""
    for layer in tree["layers"]:
        layer["weight"], layer["bias"]  # the reads are what is timed


def linear_256(rounds: int = 20) -> None:
    """Tree operations on 256 `eqx.nn.Linear`: AutoModule vs eqx.Module vs dicts."""
    keys = jax.random.split(jax.random.key(0), 256)
    layers = [eqx.nn.Linear(8, 8, key=k) for k in keys]
    trees = {
        "eqx.Module": (_EqxLinears(layers, jax.nn.relu), _read_layers),
        "AutoModule": (_AutoLinears(layers, jax.nn.relu), _read_layers),
        "dict": (
            {"layers": [{"weight": x.weight, "bias": x.bias} for x in layers]},
            _read_dicts,
        ),
    }
    cells = {}
    for name, (tree, read) in trees.items():
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
        cells[("flatten", name)] = lambda t=tree: jax.tree_util.tree_flatten(t)
        cells[("unflatten", name)] = lambda d=treedef, x=leaves: (
            jax.tree_util.tree_unflatten(d, x)
        )
        cells[("read every attribute", name)] = lambda r=read, t=rebuilt: r(t)
        cells[("unflatten + read", name)] = lambda r=read, d=treedef, x=leaves: r(
            jax.tree_util.tree_unflatten(d, x)
        )
    samples = run_interleaved(
        {f"{op} | {name}": fn for (op, name), fn in cells.items()}, rounds
    )
    print(
        "256 eqx.nn.Linear(8, 8): AutoModule / eqx.Module (static activation) | / dict"
    )
    for op in ("flatten", "unflatten", "read every attribute", "unflatten + read"):
        ours = samples[f"{op} | AutoModule"]
        vs_eqx = paired_ratio(ours, samples[f"{op} | eqx.Module"])
        vs_dict = paired_ratio(ours, samples[f"{op} | dict"])
        print(
            f"  {op}: {vs_eqx['median']:.2f}x (IQR {vs_eqx['q1']:.2f}-{vs_eqx['q3']:.2f})"
            f" | {vs_dict['median']:.2f}x"
        )


def _evict_caches() -> None:
    """Allocates and frees 24 MB in small objects: what the CPU caches held is gone."""
    junk = [bytearray(64) for _ in range(200_000)]
    del junk


def _cold_batch(fn: Callable[[], Any], calls: int, cold: bool) -> float:
    """CPU seconds of `calls` calls of `fn`, after evicting the caches if `cold`."""
    if cold:
        _evict_caches()
    gc.disable()
    start = time.process_time()
    for _ in range(calls):
        fn()
    seconds = time.process_time() - start
    gc.enable()
    return seconds


def warm_and_cold(rounds: int = 101) -> None:
    """Unflatten + read every field of the real models, AutoModule / fair twin, with
    warm and with cold caches; each round times the pair in alternating order."""
    print("unflatten + read every field, AutoModule / eqx-static: warm | cold")
    for model in (m for m in MODELS if m.kind == M.EQX_NN):
        parts = model.parts(0)
        cells = []
        for impl in ("autostatic", "eqx-static"):
            leaves, treedef = jax.tree_util.tree_flatten(model.build(impl, parts))
            cells.append(
                lambda d=treedef, x=leaves: R.read_all(
                    jax.tree_util.tree_unflatten(d, x)
                )
            )
        line = []
        for calls, cold in ((20, False), (2, True)):
            ratios = []
            with frozen_heap():
                for r in range(rounds):
                    pair = cells if r % 2 else cells[::-1]
                    times = [_cold_batch(fn, calls, cold) for fn in pair]
                    ours, twin = times if r % 2 else times[::-1]
                    ratios.append(ours / twin)
            stat = summary(ratios)
            line.append(f"{stat['median']:.3f}x ({stat['q1']:.3f}-{stat['q3']:.3f})")
        print(f"  {model.name}: {line[0]} | {line[1]}")


class _SlottedCarrier:
    """A prototype carrier that is no subclass of its layer class: two slots (its
    pytree form, its layer) and no `__dict__`, so unflatten makes it and its layer,
    filled through the layer's dict, and nothing else."""

    __slots__ = ("flat", "layer")


_get_flat = _SlottedCarrier.flat.__get__  # pyright: ignore[reportAttributeAccessIssue]
_set_flat = _SlottedCarrier.flat.__set__  # pyright: ignore[reportAttributeAccessIssue]
_set_layer = _SlottedCarrier.layer.__set__  # pyright: ignore[reportAttributeAccessIssue]
_get_layer = _SlottedCarrier.layer.__get__  # pyright: ignore[reportAttributeAccessIssue]


def _slotted_unflatten(aux: Any, children: tuple[Any, ...]) -> _SlottedCarrier:
    carrier = object.__new__(_SlottedCarrier)
    _set_flat(carrier, (children, aux))
    layer = object.__new__(eqx.nn.Linear)
    attrs = object.__getattribute__(layer, "__dict__")
    attrs["weight"], attrs["bias"] = children
    attrs["in_features"], attrs["out_features"], attrs["use_bias"] = aux
    _set_layer(carrier, layer)
    return carrier


jax.tree_util.register_pytree_node(_SlottedCarrier, _get_flat, _slotted_unflatten)


class _SetattrCarrier(_SlottedCarrier):
    """The slotted prototype, its layer filled as Equinox's unflatten fills a
    module: `object.__setattr__` per field, no dict made."""

    __slots__ = ()


def _setattr_unflatten(aux: Any, children: tuple[Any, ...]) -> _SetattrCarrier:
    carrier = object.__new__(_SetattrCarrier)
    _set_flat(carrier, (children, aux))
    layer = object.__new__(eqx.nn.Linear)
    # Written out, as Equinox's generated unflatten is.
    object.__setattr__(layer, "weight", children[0])
    object.__setattr__(layer, "bias", children[1])
    object.__setattr__(layer, "in_features", aux[0])
    object.__setattr__(layer, "out_features", aux[1])
    object.__setattr__(layer, "use_bias", aux[2])
    _set_layer(carrier, layer)
    return carrier


jax.tree_util.register_pytree_node(_SetattrCarrier, _get_flat, _setattr_unflatten)


def _slotted(layer: Any, cls: type = _SlottedCarrier) -> Any:
    carrier = object.__new__(cls)
    static = (layer.in_features, layer.out_features, layer.use_bias)
    _set_flat(carrier, ((layer.weight, layer.bias), static))
    _set_layer(carrier, layer)
    return carrier


def _read_linears(layers: list[Any]) -> None:
    for layer in layers:
        for name in ("weight", "bias", "in_features", "out_features", "use_bias"):
            getattr(layer, name)


def carrier_forms(rounds: int = 101) -> None:
    """Unflatten + read every field of 256 `eqx.nn.Linear(8, 8)` in a list, held as
    Equinox's nodes, as carriers, and as the slotted prototype; warm and cold."""
    keys = jax.random.split(jax.random.key(0), 256)
    layers = [eqx.nn.Linear(8, 8, key=k) for k in keys]
    held = jax.tree_util.tree_structure(_AutoLinears(layers, jax.nn.relu))
    forms = {
        "eqx.nn.Linear": (jax.tree_util.tree_structure(layers), list),
        "carrier": (held.children()[0], asx_with_layers),
        "slotted": (
            jax.tree_util.tree_structure([_slotted(x) for x in layers]),
            lambda xs: list(map(_get_layer, xs)),
        ),
        "slotted, filled by setattr": (
            jax.tree_util.tree_structure(
                [_slotted(x, _SetattrCarrier) for x in layers]
            ),
            lambda xs: list(map(_get_layer, xs)),
        ),
    }
    leaves = jax.tree_util.tree_leaves(layers)
    cells = [
        lambda d=treedef, to=to_layers: _read_linears(
            to(jax.tree_util.tree_unflatten(d, leaves))
        )
        for treedef, to_layers in forms.values()
    ]
    print(
        "256 held eqx.nn.Linear, unflatten + read every field / Equinox's: warm | cold"
    )
    ratios: dict[str, list[list[float]]] = {name: [[], []] for name in forms}
    with frozen_heap():
        for r in range(rounds):
            for column, (calls, cold) in enumerate(((20, False), (2, True))):
                order = list(range(len(cells)))[:: 1 if r % 2 else -1]
                times = {i: _cold_batch(cells[i], calls, cold) for i in order}
                for i, name in enumerate(forms):
                    ratios[name][column].append(times[i] / times[0])
    for name in list(forms)[1:]:
        stats = [summary(column) for column in ratios[name]]
        print(
            f"  {name}: "
            + " | ".join(
                f"{s['median']:.3f}x ({s['q1']:.3f}-{s['q3']:.3f})" for s in stats
            )
        )


if __name__ == "__main__":
    aux_comparison()
    routed_tree_at()
    linear_256()
    warm_and_cold()
    carrier_forms()
