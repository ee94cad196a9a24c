"""Micro-benchmarks behind single design decisions, each paired in one process.

`python -m benchmarks.micro` prints, as paired ratios (median and IQR over rounds),
these and the routing studies of `benchmarks.micro_routing`:

- aux forms: a node's aux made and compared as a plain tuple and as a tuple subclass
  (what every flatten makes and every jit cache lookup compares);
- the flatten and unflatten generated per class against the general ones, over
  every node of the 256-layer MLP of the user's own layers and of the real models;
- the flatten of the transformer and of `nested` with and without two checks of the
  generated flatten: a child of another type than the first instance's (a `None`
  bias after an array), and a list of modules;
- the flatten and `jax.jit` dispatch of models whose instances of one class hold
  other field types than the first's (a dict of dicts after a list of dicts, layers
  of two activation types), with a flatten generated for each and for the first only;
- the flatten of the 256-layer MLP of the user's own layers and of the transformer,
  with and without a filter spec of the model (a tree of bools, a template) alive, as
  a training loop that freezes some parameters keeps one;
- the flatten and `jax.jit` dispatch of the user's own layers per layer: 256 layers,
  4,096 layers, and 16 models of 256 layers taken in turn (as much memory as 4,096
  layers, in models of 256), to tell the cost of the memory touched from the cost
  of the model's size, and a dispatch's parts: the leaves alone given to a
  `jax.jit`, and the flatten followed by that;
- the same flatten and dispatch at 256 and 4,096 layers with the layer's flatten
  swapped for one that reads the two fields and checks nothing (the floor of any
  flatten of an AutoModule layer written in Python), against the fair twin;
- tree operations on 256 `eqx.nn.Linear(8, 8)` layers in a list beside an activation:
  AutoModule (which swaps the layers for its own fast layer classes) vs `eqx.Module`
  with the activation marked static vs the same arrays in dicts (the floor);
- 256 carriers of `eqx.nn.Linear` layers as the custom node kept and as dataclass
  nodes (plain slots named as the fields; read-only fields over private slots):
  made, flattened, and under a `jax.jit` call;
- unflatten + read every field of the four real models, AutoModule vs the fair twin,
  with warm caches (20 calls a batch, back to back) and cold (2 calls a batch, after
  24 MB of other allocations): the comparison runner's batches are as short as the
  cold ones and follow other cells;
"""

import functools
import gc
import time
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax

import autostatic as asx

from . import models as M, real_models as R
from .registry import MODELS
from .scaling import layer_arrays
from .timing import (
    calibrate,
    frozen_heap,
    paired_ratio,
    run_interleaved,
    scaled_summary,
    summary,
    timed_batch,
)


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


def aux_forms(rounds: int = 30) -> None:
    """A node's aux made and compared as a plain tuple and as a tuple subclass: what
    every flatten makes and every jit cache lookup compares."""

    class Subclass(tuple):
        __slots__ = ()

    plan = object()

    def values() -> tuple[Any, ...]:
        return (jax.nn.gelu, 2, 0.1, "name")

    va, vb = values(), values()
    plain = (plan, *va), (plan, *vb)
    sub = Subclass(plain[0]), Subclass(plain[1])
    samples = run_interleaved(
        {
            "make: plain tuple": lambda: (plan, *va),
            "make: tuple subclass": lambda: Subclass((plan, *va)),
            "compare: plain tuple": lambda: plain[0] == plain[1],
            "compare: tuple subclass": lambda: sub[0] == sub[1],
        },
        rounds,
    )
    _report("an aux of 4 entries", samples, "make: plain tuple")


def _nodes(value: Any, found: list[Any]) -> list[Any]:
    """Every AutoModule and held `eqx.nn` layer `value` reaches, depth first."""
    from autostatic.core._leaves import category, LAYER, NODE

    kind = category(value)
    if kind in (NODE, LAYER):
        found.append(value)
        value = list(vars(value).values())
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            _nodes(item, found)
    return found


def _node_calls(model: Any) -> dict[str, Callable[[], Any]]:
    """The Python work of one flatten and one unflatten of every node of `model`,
    through the generated functions and through the general ones."""
    from autostatic.core import _node
    from autostatic.core._carriers import get_flat
    from autostatic.core._fields import fields_of
    from autostatic.core._leaves import category, LAYER

    flattens: dict[str, list[Any]] = {"generated": [], "general": []}
    unflattens: dict[str, list[Any]] = {"generated": [], "general": []}
    for node in _nodes(model, []):
        cls, spec = type(node), fields_of(type(node))
        if category(node) == LAYER:
            generated, general = _node._carried[cls], spec.general_carrier
            children, aux = get_flat(generated(node))
        else:
            generated, general = spec.flatten, spec.general_flatten
            children, aux = generated(node)
        flattens["generated"].append((generated, node))
        flattens["general"].append((general, node))
        args = (cls, aux, children)
        unflattens["generated"].append((_node._registered_unflatten[cls], args))
        unflattens["general"].append((_node.unflatten, args))
    calls = {}
    for way in ("generated", "general"):
        f, u = flattens[way], unflattens[way]
        calls[f"flatten, {way}"] = lambda f=f: [g(x) for g, x in f]
        calls[f"unflatten, {way}"] = lambda u=u: [g(*a) for g, a in u]
    return calls


def generated_code(rounds: int = 15) -> None:
    """The generated flatten and unflatten (`_generated`) against the general ones:
    every node of each model flattened and unflattened through each, paired in one
    run: the 256-layer MLP of the user's own layers and the four real models."""
    from . import scaling

    arrays = scaling.layer_arrays(256)
    models = {"own-256": scaling.builder("own", "autostatic", arrays)()}
    for model in (m for m in MODELS if m.kind == M.EQX_NN):
        models[model.name] = model.build("autostatic", model.parts(0))
    for name, model in models.items():
        jax.tree_util.tree_unflatten(*reversed(jax.tree_util.tree_flatten(model)))
        samples = run_interleaved(_node_calls(model), rounds)
        for op in ("flatten", "unflatten"):
            _report(
                f"{name}: every node's {op} (Python), general / generated",
                {k: v for k, v in samples.items() if k.startswith(op)},
                f"{op}, generated",
            )


def _eqx_nn_model(name: str) -> Any:
    """The real model `name` of held `eqx.nn` layers, built on AutoModule."""
    model = next(m for m in MODELS if m.name == name and m.kind == M.EQX_NN)
    return model.build("autostatic", model.parts(0))


def _scopes(model: Any) -> list[dict[str, Any]]:
    """The globals of the generated flattens of `model`'s classes."""
    from autostatic.core import _node

    found = {}
    for node in _nodes(model, []):
        cls = type(node)
        function = _node._carried.get(cls) or _node._registered.get(cls)
        if function is not None and "as_is" in function.__globals__:
            found[id(function)] = function.__globals__
    return list(found.values())


def generated_checks(rounds: int = 15) -> None:
    """Two checks of the generated flatten, each against the general flatten for the
    instances it takes: a child of any type the field takes as it is (the
    transformer's `eqx.nn.Linear`s with and without a bias) and a list of modules
    (`nested`'s and the transformer's stacks of blocks). `jax.tree_util.tree_flatten`
    of the model, with both and with one left out, paired in one run."""
    from autostatic.core._leaves import as_is_types

    for name in ("transformer", "nested"):
        built = _eqx_nn_model(name)
        jax.tree_util.tree_flatten(built)
        scopes = _scopes(built)

        def cell(left_out: str | None, built: Any = built, scopes: Any = scopes) -> Any:
            def run() -> Any:
                for scope in scopes:
                    scope["child_types"] = scope["as_is"] = as_is_types
                    if left_out is not None:
                        scope[left_out] = frozenset()
                return jax.tree_util.tree_flatten(built)

            return run

        samples = run_interleaved(
            {
                "both": cell(None),
                "without child types": cell("child_types"),
                "without node lists": cell("as_is"),
            },
            rounds,
        )
        cell(None)()
        _report(f"{name}: tree_flatten, without / with", samples, "both")


def _two_activation_mlp(n: int) -> Any:
    """`n` layers of the user's own whose activations alternate between
    `jax.nn.relu` (a `custom_jvp`) and a plain function, in a list."""

    class Dense(asx.AutoModule):
        weight: jax.Array
        bias: jax.Array
        activation: Callable

    class Stack(asx.AutoModule):
        layers: list

    arrays = layer_arrays(n)
    acts = (jax.nn.relu, _halve)
    return Stack([Dense(w, b, acts[i % 2]) for i, (w, b) in enumerate(arrays)])


def _halve(x: Any) -> Any:
    return x / 2


def generated_variants(rounds: int = 15) -> None:
    """A class's generated flattens for the field types met after the first
    instance's, against the general flatten for those: the containers section's
    class holding a dict of 16 dicts (met after a list of dicts), and 256 layers
    whose activations alternate between two types. `tree_flatten` and `jax.jit`
    dispatch, with every generated flatten and with only the first, in one run."""
    from autostatic.core._fields import fields_of

    from .containers import classes, dict_of_dicts, readme_mlp, shared_arrays

    arrays = shared_arrays(16)
    first = classes()["autostatic"](readme_mlp(arrays), jax.nn.relu)
    jax.tree_util.tree_flatten(first)
    for name, model in (
        (
            "dict of 16 dicts",
            classes()["autostatic"](dict_of_dicts(arrays), jax.nn.relu),
        ),
        ("256 layers, two activations", _two_activation_mlp(256)),
    ):
        jax.tree_util.tree_flatten(model)
        specs = [fields_of(type(node)) for node in _nodes(model, [])]
        chains = {id(s): (s, s.generated[0]["general"]) for s in specs if s.generated}
        jitted = jax.jit(lambda m: 0)
        jitted(model)

        def cell(op: Callable[[], Any], chained: bool, chains: Any = chains) -> Any:
            def run() -> Any:
                for spec, second in chains.values():
                    spec.generated[0]["general"] = (
                        second if chained else spec.general_flatten
                    )
                return op()

            return run

        flatten = functools.partial(jax.tree_util.tree_flatten, model)
        dispatch = functools.partial(jitted, model)
        samples = run_interleaved(
            {
                "flatten: first only": cell(flatten, False),
                "flatten: every one": cell(flatten, True),
                "dispatch: first only": cell(dispatch, False),
                "dispatch: every one": cell(dispatch, True),
            },
            rounds,
        )
        cell(flatten, True)()
        for op in ("flatten", "dispatch"):
            _report(
                f"{name}, {op}: every generated flatten / the first only",
                {k: v for k, v in samples.items() if k.startswith(op)},
                f"{op}: first only",
            )


def template_alive(rounds: int = 15) -> None:
    """`jax.tree_util.tree_flatten` of a model while a filter spec of it (a tree of
    bools: every node in it a template) is alive, against none alive, paired per round
    (the spec made and dropped between batches, the order alternating): only the
    templates themselves take the general flatten."""
    from .scaling import builder, layer_arrays

    for name, built in (
        ("own-256", builder("own", "autostatic", layer_arrays(256))()),
        ("transformer", _eqx_nn_model("transformer")),
    ):
        flatten = functools.partial(jax.tree_util.tree_flatten, built)
        loops = calibrate(flatten, 2e-3)
        samples: dict[str, list[float]] = {"none alive": [], "a spec alive": []}
        with frozen_heap():
            for r in range(rounds):
                for alive in (r % 2 == 0, r % 2 == 1):
                    spec = (
                        jax.tree_util.tree_map(lambda _: False, built)
                        if alive
                        else None
                    )
                    key = "a spec alive" if alive else "none alive"
                    samples[key].append(timed_batch(flatten, loops))
                    del spec
        _report(f"{name}: tree_flatten, with / without", samples, "none alive")


def working_set(rounds: int = 15) -> None:
    """Per layer, µs: `tree_flatten` and a `jax.jit` call's dispatch of the MLP of the
    user's own layers at 256 layers, at 4,096, and over 16 models of 256 taken in turn
    (the memory of 4,096 layers, each flatten of 256), AutoModule and the fair twin,
    every cell interleaved. If 16 x 256 costs per layer what 4,096 does, a deeper
    model costs more per layer for the memory it touches, not for its depth."""
    from .scaling import builder, layer_arrays

    arrays = layer_arrays(4096)
    probe = jax.jit(lambda m: m.layers[0].weight + 1)
    cells: dict[str, Callable[[], Any]] = {}
    for impl in ("autostatic", "eqx-static"):
        one = builder("own", impl, arrays[:256])()
        deep = builder("own", impl, arrays)()
        parts = [
            builder("own", impl, arrays[i : i + 256])() for i in range(0, 4096, 256)
        ]
        for m in (one, deep, *parts):
            probe(m).block_until_ready()
        for op, call in (("flatten", jax.tree_util.tree_flatten), ("dispatch", probe)):
            cells[f"{impl} {op} 256"] = functools.partial(call, one)
            cells[f"{impl} {op} 4096"] = functools.partial(call, deep)
            cells[f"{impl} {op} 16 x 256"] = functools.partial(
                lambda call, ms: [call(m) for m in ms], call, parts
            )
        _add_dispatch_parts(cells, impl, {"256": one, "4096": deep})
    samples = run_interleaved(cells, rounds)
    layers = {"256": 256, "4096": 4096, "16 x 256": 4096}
    print("working set: per layer, µs, median (IQR); autostatic / eqx-static")
    for op in ("flatten", "dispatch", "leaves", "flatten, leaves"):
        for size, n in layers.items():
            if f"autostatic {op} {size}" not in samples:
                continue
            per_layer = {
                impl: scaled_summary(samples[f"{impl} {op} {size}"], 1e6 / n)
                for impl in ("autostatic", "eqx-static")
            }
            ratio = paired_ratio(
                samples[f"autostatic {op} {size}"], samples[f"eqx-static {op} {size}"]
            )
            print(
                f"  {op}, {size}: "
                + ", ".join(
                    f"{impl} {x['median']:.3f} ({x['q1']:.3f}-{x['q3']:.3f})"
                    for impl, x in per_layer.items()
                )
                + f"; {ratio['median']:.3f}x (IQR {ratio['q1']:.3f}-{ratio['q3']:.3f})"
            )


def _add_dispatch_parts(
    cells: dict[str, Callable[[], Any]], impl: str, models: dict[str, Any]
) -> None:
    """`working_set`'s parts of a dispatch: the model's leaves alone given to a
    `jax.jit` (JAX's work per leaf), and the model flattened, then its leaves given
    (the two in turn, as a dispatch does them, touching both memories)."""
    probe = jax.jit(lambda leaves: leaves[0] + 1)
    for size, model in models.items():
        leaves = jax.tree_util.tree_leaves(model)
        probe(leaves).block_until_ready()
        cells[f"{impl} leaves {size}"] = functools.partial(probe, leaves)
        cells[f"{impl} flatten, leaves {size}"] = functools.partial(
            lambda m: probe(jax.tree_util.tree_leaves(m)), model
        )


def dispatch_floor(rounds: int = 15) -> None:
    """`tree_flatten` and `jax.jit` dispatch of the MLP of 256 and of 4,096 of the
    user's own layers, per layer: the layer's generated flatten, the same function
    given code that reads the two fields and checks nothing (what no flatten of this
    class in Python can beat), and the fair twin, every cell interleaved."""
    from .scaling import layer_arrays

    scope: dict[str, Any] = {}
    exec("def floor(self):\n    return (self.weight, self.bias), aux\n", scope)
    for n in (256, 4096):
        samples = run_interleaved(_floor_cells(layer_arrays(n), scope["floor"]), rounds)
        for op in ("flatten", "dispatch"):
            cells = {k: v for k, v in samples.items() if k.startswith(op)}
            per_layer = {
                k: scaled_summary(v, 1e6 / n)["median"] for k, v in cells.items()
            }
            print(
                f"{op}, {n} own layers, µs per layer: "
                + ", ".join(f"{k} {v:.3f}" for k, v in per_layer.items())
            )
            _report(f"{op}, {n} own layers", cells, f"{op}: fair twin")


def _floor_cells(arrays: Any, floor: Any) -> dict[str, Callable[[], Any]]:
    """`dispatch_floor`'s cells: each sets the layer class's flatten code it needs."""
    from autostatic.core._fields import fields_of

    from .scaling import builder

    ours, twin = (
        builder("own", impl, arrays)() for impl in ("autostatic", "eqx-static")
    )
    flatten = fields_of(type(ours.layers[0])).flatten
    jax.tree_util.tree_flatten(ours)  # the generated code is in place
    codes = {"generated": flatten.__code__, "no check": floor.__code__}
    probe = jax.jit(lambda m: m.layers[0].weight + 1)

    def cell(call: Callable[[Any], Any], model: Any, code: str) -> Callable[[], Any]:
        def run() -> Any:
            flatten.__code__ = codes[code]
            try:
                return call(model)
            finally:
                flatten.__code__ = codes["generated"]

        return run

    cells: dict[str, Callable[[], Any]] = {}
    for op, call in (("flatten", jax.tree_util.tree_flatten), ("dispatch", probe)):
        cells[f"{op}: generated"] = cell(call, ours, "generated")
        cells[f"{op}: no check"] = cell(call, ours, "no check")
        cells[f"{op}: fair twin"] = cell(call, twin, "generated")
        call(ours), call(twin)
    return cells


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


def _carrier_makers(
    values: list[tuple[Any, Any, Any]], aux: Any
) -> dict[str, Callable[[], list[Any]]]:
    """What makes the 256 carriers of `carrier_forms` in each form, from each layer's
    `(weight, bias, layer)` in `values` and the shared `aux`."""
    import operator

    class Custom:
        __slots__ = ("children", "aux", "layer", "__weakref__")

    class Plain:
        __slots__ = ("weight", "bias", "aux", "layer", "__weakref__")

        def __new__(cls, **_: Any) -> Any:
            return object.__new__(cls)

    class ReadOnly(property):
        def __set__(self, obj: Any, value: Any) -> None:
            raise AttributeError("frozen")

    class Frozen:
        __slots__ = ("_weight", "_bias", "_aux", "layer", "__weakref__")
        weight = ReadOnly(operator.attrgetter("_weight"))
        bias = ReadOnly(operator.attrgetter("_bias"))
        aux = ReadOnly(operator.attrgetter("_aux"))

        def __new__(cls, **_: Any) -> Any:
            return object.__new__(cls)

    flat = operator.attrgetter("children", "aux")
    jax.tree_util.register_pytree_node(Custom, flat, lambda a, c: None)
    for cls in (Plain, Frozen):
        jax.tree_util.register_dataclass(cls, ["weight", "bias"], ["aux"])

    def custom() -> list[Any]:
        out = []
        for w, b, layer in values:
            c = object.__new__(Custom)
            c.children, c.aux, c.layer = (w, b), aux, layer
            out.append(c)
        return out

    def plain() -> list[Any]:
        out = []
        for w, b, layer in values:
            c = object.__new__(Plain)
            c.weight, c.bias, c.aux, c.layer = w, b, aux, layer
            out.append(c)
        return out

    def frozen() -> list[Any]:
        out = []
        for w, b, layer in values:
            c = object.__new__(Frozen)
            c._weight, c._bias, c._aux, c.layer = w, b, aux, layer
            out.append(c)
        return out

    return {"custom": custom, "plain": plain, "frozen": frozen}


def carrier_forms(rounds: int = 30) -> None:
    """256 carriers of `eqx.nn.Linear` layers in the form kept (a custom node: slots
    for the children tuple, the aux and the layer, its flatten one C call) against
    dataclass nodes (`jax.tree_util.register_dataclass`: JAX reads each child field
    by name in C++), with plain slots named as the fields, and with read-only fields
    over private slots (frozen, as a layer is): made, flattened (made and walked, as
    a flatten of their model makes them), unflattened (JAX calls a dataclass node's
    class with keywords) and under a `jax.jit` call."""
    layers = [eqx.nn.Linear(8, 8, key=jax.random.key(i)) for i in range(256)]
    # Read beforehand, as a flatten reads a layer's `__dict__` in C.
    values = [(layer.weight, layer.bias, layer) for layer in layers]
    aux = (object(), 8, 8, True)

    cells = {}
    jitted = jax.jit(lambda tree: 0)
    for name, make in _carrier_makers(values, aux).items():
        holder = type(f"{name}Holder", (), {})
        jax.tree_util.register_pytree_node(
            holder, lambda _, make=make: ((make(),), None), lambda a, c, h=holder: h()
        )
        tree = holder()
        jitted(tree)
        cells[f"make: {name}"] = make
        cells[f"flatten: {name}"] = lambda t=tree: jax.tree_util.tree_flatten(t)
        cells[f"dispatch: {name}"] = lambda t=tree: jitted(t)
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        cells[f"unflatten: {name}"] = lambda d=treedef, x=leaves: d.unflatten(x)
    samples = run_interleaved(cells, rounds)
    for op in ("make", "flatten", "unflatten", "dispatch"):
        _report(
            f"256 carriers, {op}: dataclass nodes / custom node",
            {k: v for k, v in samples.items() if k.startswith(op)},
            f"{op}: custom",
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


if __name__ == "__main__":
    from .micro_routing import routed_filter, routed_tree_at

    aux_forms()
    generated_code()
    generated_checks()
    generated_variants()
    template_alive()
    working_set()
    dispatch_floor()
    routed_tree_at()
    routed_filter()
    linear_256()
    carrier_forms()
    warm_and_cold()
