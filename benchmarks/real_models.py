"""Real models: the models people write, with `eqx.nn` layers inside.

Four models, each in three implementations built from the same `eqx.nn` layers:

- `linear-256`: 256 `eqx.nn.Linear(8, 8)` in a list beside an activation function;
- `transformer`: 12 blocks, each a `MultiheadAttention(num_heads=2, query_size=16)`, two
  `LayerNorm(16)`, an `MLP(16, 16, 32, 1)` and a `Dropout(0.1)`, in a list;
- `mixed-stack`: 32 blocks, each a mixed list `[Linear, jax.nn.relu, Linear, Dropout]`,
  an int list `[8, 8]`, a string name and a float scale, in a list;
- `nested`: modules nested 4 deep: 4 holding 4 holding 4 `Linear(8, 8)` and an int.

Implementations: `autostatic` (AutoModule classes, plain annotations, `jax.jit`),
`eqx-static` (eqx.Module with `eqx.field(static=True)` on every field of ours that holds
no array, `jax.jit`: the fair twin; Equinox's own layers are as Equinox declares them,
so a model holding an `eqx.nn.MLP`, whose activation is a non-static function field,
cannot be passed to plain `jax.jit`, and neither can a function in a mixed list) and
`eqx-filter` (eqx.Module without markers, `eqx.filter_jit`: what Equinox users run).
Where plain `jax.jit` refuses the fair twin, Equinox's own route to it still works:
`eqx.partition` once, `jax.jit` over the arrays with the static half closed over; the
`dispatch_partitioned` row times that for both eqx models against our plain `jax.jit`.
The three are generated from one field list per class (`_classes`), so fields and
their order are the same. `linear-256` also has the `dict` floor
(`{"layers": [{"weight": ..., "bias": ...}]}`) for flatten, unflatten + read and `==`.

The `eqx.nn` layers are made once per model and shared by the three implementations:
one layer of each kind by its constructor from a fixed key, the others with its
structure and fresh arrays drawn by a seeded numpy generator (`_layers`). `build` times
every constructor of ours (the blocks and the model, lists and names included) around
those layers, not the layers' own constructors, whose random initialisation (~1-15 ms
a layer on CPU) would swamp the difference; for `autostatic` it includes deciding the
partition and replacing the layers by their fast twins. The second model that treedef
`==` compares with is built from copies of the layers' arrays, so no aux object (tuple,
string, int list) is shared.

Every cell of one model is interleaved in one `run_interleaved` run; ratios are paired
per round (`paired_ratio`).
"""

import dataclasses
import functools
import operator
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

import autostatic as asx

from .scenarios import _error, _stats_us, Settings
from .timing import paired_ratio, run_interleaved

IMPLS: tuple[str, ...] = ("autostatic", "eqx-static", "eqx-filter")
DICT = "dict"
OPS: dict[str, str] = {
    "build": "build (around made layers)",
    "flatten": "flatten",
    "unflatten_read": "unflatten + read all",
    "treedef_eq": "treedef ==",
    "dispatch": "dispatch (jax.jit; eqx-filter: eqx.filter_jit)",
    "dispatch_filter_jit": "dispatch, all eqx.filter_jit",
    "dispatch_partitioned": "dispatch, eqx: eqx.partition once + jax.jit",
    "tree_at_array": "eqx.tree_at array",
    "tree_at_layer": "eqx.tree_at sub-layer",
}
# How each implementation's `dispatch` cell is jitted.
JIT: dict[str, Callable[..., Any]] = {
    "autostatic": jax.jit,
    "eqx-static": jax.jit,
    "eqx-filter": eqx.filter_jit,
}


def _classes(name: str, fields: str, static: str = "") -> dict[str, type]:
    """One class per implementation, with the same fields in the same order."""

    def namespace() -> dict[str, Any]:
        return {
            "__module__": __name__,
            "__qualname__": name,
            "__annotations__": {f: Any for f in fields.split()},
        }

    markers = {f: eqx.field(static=True) for f in static.split()}
    return {
        "autostatic": type(name, (asx.AutoModule,), namespace()),
        "eqx-static": type(name, (eqx.Module,), {**namespace(), **markers}),
        "eqx-filter": type(name, (eqx.Module,), namespace()),
    }


LINEARS = _classes("Linears", "layers activation", "activation")
BLOCK = _classes("Block", "attn ln1 ln2 mlp dropout", "dropout")
# The fair twin must mark its `eqx.nn.Dropout` static (its `inference` flag would be a
# tracer under plain jax.jit), so Equinox compares that module with `Module.__eq__`
# (a `tree_equal`) wherever two blocks' aux meet: treedef `==` of two built models.
# For scale, the same block with the Dropout left a child (not callable under jax.jit).
BLOCK_DROPOUT_CHILD = _classes("Block", "attn ln1 ln2 mlp dropout")["eqx-static"]
DROPOUT_CHILD = "eqx-static, Dropout a child"
TRANSFORMER = _classes("Transformer", "blocks")
MIXED_BLOCK = _classes("MixedBlock", "layers sizes name scale", "sizes name scale")
MIXED_STACK = _classes("MixedStack", "blocks")
LEAF = _classes("Leaf", "layers n", "n")
MID = _classes("Mid", "children")
TOP = _classes("Top", "children")


def _layers(template: Any, n: int, rng: np.random.Generator) -> list[Any]:
    """`n` layers like `template`, with fresh arrays drawn by numpy (a layer's own
    constructor draws with jax.random, eagerly ~15 ms a layer on a loaded 2-core CPU;
    vmapped, seconds of compilation per layer kind)."""
    arrays, rest = eqx.partition(template, eqx.is_array)

    def fresh(x: jax.Array) -> jax.Array:
        return jnp.asarray(rng.uniform(-0.3, 0.3, x.shape).astype(x.dtype))

    return [eqx.combine(jtu.tree_map(fresh, arrays), rest) for _ in range(n)]


def _linear(key: int = 0) -> Any:
    return eqx.nn.Linear(8, 8, key=jax.random.key(key))


def _linear_parts(rng: np.random.Generator) -> list[Any]:
    return _layers(_linear(), 256, rng)


def _linear_build(impl: str, layers: list[Any]) -> Any:
    if impl == DICT:
        return {"layers": [{"weight": x.weight, "bias": x.bias} for x in layers]}
    return LINEARS[impl](layers=[*layers], activation=jax.nn.relu)


def _transformer_parts(rng: np.random.Generator) -> list[dict[str, Any]]:
    key = jax.random.key(0)
    attn = eqx.nn.MultiheadAttention(num_heads=2, query_size=16, key=key)
    mlp = eqx.nn.MLP(16, 16, 32, 1, key=key)
    norm = eqx.nn.LayerNorm(16)
    return [
        {"attn": a, "ln1": n1, "ln2": n2, "mlp": m, "dropout": eqx.nn.Dropout(0.1)}
        for a, n1, n2, m in zip(
            _layers(attn, 12, rng),
            _layers(norm, 12, rng),
            _layers(norm, 12, rng),
            _layers(mlp, 12, rng),
        )
    ]


def _transformer_build(impl: str, blocks: list[dict[str, Any]]) -> Any:
    if impl == DROPOUT_CHILD:
        block, model = BLOCK_DROPOUT_CHILD, TRANSFORMER["eqx-static"]
    else:
        block, model = BLOCK[impl], TRANSFORMER[impl]
    return model(blocks=[block(**b) for b in blocks])


def _mixed_parts(rng: np.random.Generator) -> list[tuple[Any, Any, Any]]:
    first, second = _layers(_linear(), 32, rng), _layers(_linear(), 32, rng)
    return [(a, b, eqx.nn.Dropout(0.1)) for a, b in zip(first, second)]


def _mixed_build(impl: str, blocks: list[tuple[Any, Any, Any]]) -> Any:
    block = MIXED_BLOCK[impl]
    return MIXED_STACK[impl](
        blocks=[
            block(
                layers=[a, jax.nn.relu, b, d], sizes=[8, 8], name=f"block{i}", scale=0.5
            )
            for i, (a, b, d) in enumerate(blocks)
        ]
    )


def _nested_parts(rng: np.random.Generator) -> list[list[list[Any]]]:
    flat = iter(_layers(_linear(), 64, rng))
    return [[[next(flat) for _ in range(4)] for _ in range(4)] for _ in range(4)]


def _nested_build(impl: str, parts: list[list[list[Any]]]) -> Any:
    leaf, mid = LEAF[impl], MID[impl]
    return TOP[impl](
        children=[
            mid(children=[leaf(layers=[*layers], n=8) for layers in mids])
            for mids in parts
        ]
    )


@dataclasses.dataclass(frozen=True)
class Spec:
    parts: Callable[[np.random.Generator], Any]  # the eqx.nn layers, made once
    build: Callable[[str, Any], Any]  # (impl, parts) -> model
    first: Callable[[Any], Any]  # the first array leaf (what dispatch returns + 1)
    layer: Callable[[Any], Any]  # the sub-layer eqx.tree_at replaces (has `.weight`)
    new_layer: Callable[[], Any]  # a plain layer of the same kind
    # Other eqx-static configurations, timed for treedef `==` only (for scale).
    treedef_variants: tuple[str, ...] = ()


SPECS: dict[str, Spec] = {
    "linear-256": Spec(
        _linear_parts,
        _linear_build,
        lambda m: m.layers[0].weight,
        lambda m: m.layers[3],
        functools.partial(_linear, 1),
    ),
    "transformer": Spec(
        _transformer_parts,
        _transformer_build,
        lambda m: m.blocks[0].attn.query_proj.weight,
        lambda m: m.blocks[3].ln1,
        functools.partial(eqx.nn.LayerNorm, 16),
        (DROPOUT_CHILD,),
    ),
    "mixed-stack": Spec(
        _mixed_parts,
        _mixed_build,
        lambda m: m.blocks[0].layers[0].weight,
        lambda m: m.blocks[3].layers[2],
        functools.partial(_linear, 1),
    ),
    "nested": Spec(
        _nested_parts,
        _nested_build,
        lambda m: m.children[0].children[0].layers[0].weight,
        lambda m: m.children[1].children[2].layers[3],
        functools.partial(_linear, 1),
    ),
}

_FIELDS: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    try:
        return _FIELDS[cls]
    except KeyError:
        names = _FIELDS[cls] = (
            tuple(f.name for f in dataclasses.fields(cls))
            if dataclasses.is_dataclass(cls)
            else ()
        )
        return names


def read_all(tree: Any) -> None:
    """Reads every dataclass field of every module node (getattr), walking into lists,
    tuples, dicts and modules: what using a freshly unflattened model costs."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (list, tuple)):
            stack.extend(node)
        elif isinstance(node, dict):
            stack.extend(node.values())
        else:
            names = _field_names(type(node))
            if names:
                stack.extend([getattr(node, name) for name in names])


def _copy_arrays(tree: Any) -> Any:
    return jtu.tree_map(
        lambda x: jnp.array(x, copy=True) if eqx.is_array(x) else x, tree
    )


def _dispatch(jit: Callable[..., Any], first: Callable[[Any], Any], model: Any) -> Any:
    f = jit(lambda m: first(m) + 1)
    return lambda: f(model).block_until_ready()


def _dispatch_partitioned(first: Callable[[Any], Any], model: Any) -> Any:
    """Equinox's route to plain `jax.jit` for a model with non-array leaves (an
    `eqx.nn.MLP`'s activation, a function in a list): partition once outside, close
    over the static half, pass only the arrays: what an Equinox user writes to call
    plain `jax.jit` on a model whose twin it refuses."""
    params, static = eqx.partition(model, eqx.is_array)
    f = jax.jit(lambda p: first(eqx.combine(p, static)) + 1)
    return lambda: f(params).block_until_ready()


def measure(
    name: str, settings: Settings, seed: int = 0, budget_s: float | None = None
) -> dict[str, Any]:
    """Every op of one model in every implementation, interleaved in one run."""
    spec = SPECS[name]
    parts = spec.parts(np.random.default_rng(seed))
    copied = _copy_arrays(parts)
    new_layer = spec.new_layer()
    impls = IMPLS + ((DICT,) if name == "linear-256" else ()) + spec.treedef_variants
    cells: dict[tuple[str, str], Callable[[], Any]] = {}
    info: dict[str, Any] = {}
    for impl in impls:
        model = spec.build(impl, parts)
        leaves, treedef = jtu.tree_flatten(model)
        other = jtu.tree_structure(spec.build(impl, copied))
        info[impl] = {
            "leaves": len(leaves),
            "treedef_nodes": treedef.num_nodes,
            "treedefs_equal": bool(treedef == other),
        }
        cells["treedef_eq", impl] = functools.partial(operator.eq, treedef, other)
        if impl in spec.treedef_variants:
            continue
        cells["flatten", impl] = functools.partial(jtu.tree_flatten, model)
        cells["unflatten_read", impl] = lambda d=treedef, x=leaves: read_all(
            jtu.tree_unflatten(d, x)
        )
        if impl == DICT:
            continue
        cells["build", impl] = functools.partial(spec.build, impl, parts)
        cells["dispatch", impl] = _dispatch(JIT[impl], spec.first, model)
        if impl != "eqx-filter":  # its `dispatch` already is eqx.filter_jit
            cells["dispatch_filter_jit", impl] = _dispatch(
                eqx.filter_jit, spec.first, model
            )
        if impl != "autostatic":  # ours has nothing to partition: its plain jax.jit
            cells["dispatch_partitioned", impl] = _dispatch_partitioned(
                spec.first, model
            )
        weight = jnp.ones_like(spec.layer(model).weight)
        cells["tree_at_array", impl] = lambda m=model, w=weight: eqx.tree_at(
            lambda t: spec.layer(t).weight, m, w
        )
        cells["tree_at_layer", impl] = lambda m=model: eqx.tree_at(
            spec.layer, m, new_layer
        )
        replaced = eqx.tree_at(spec.layer, model, new_layer)
        info[impl]["tree_at_layer_same_treedef"] = bool(
            jtu.tree_structure(replaced) == treedef
        )

    fails: dict[tuple[str, str], str] = {}
    for key, fn in list(cells.items()):
        try:
            fn()
        except Exception as err:
            fails[key] = _error(err)
            del cells[key]
    samples = run_interleaved(
        {f"{op}|{impl}": fn for (op, impl), fn in cells.items()},
        settings.rounds,
        settings.target_batch_s,
        seed=seed,
        max_seconds=budget_s,
    )
    # Rows whose cell of one implementation is the `dispatch` cell, shared so that
    # their ratios pair the same rounds.
    for op, impl in (
        ("dispatch_filter_jit", "eqx-filter"),
        ("dispatch_partitioned", "autostatic"),
    ):
        if f"dispatch|{impl}" in samples:
            samples[f"{op}|{impl}"] = samples[f"dispatch|{impl}"]
        elif ("dispatch", impl) in fails:
            fails[op, impl] = fails["dispatch", impl]

    ops_us: dict[str, dict[str, Any]] = {}
    ratios: dict[str, dict[str, Any]] = {}
    for op in OPS:
        ops_us[op], ratios[op] = {}, {}
        for impl in impls:
            key = f"{op}|{impl}"
            if key in samples:
                ops_us[op][impl] = _stats_us(samples[key])
            elif (op, impl) in fails:
                ops_us[op][impl] = {"fails": fails[op, impl]}
        ours = samples.get(f"{op}|autostatic")
        for ref in impls[1:]:
            if ours is not None and f"{op}|{ref}" in samples:
                ratios[op][ref] = paired_ratio(ours, samples[f"{op}|{ref}"])
    return {
        "rounds": min((len(v) for v in samples.values()), default=0),
        "info": info,
        "ops_us": ops_us,
        "ratios": ratios,
    }


def run(settings: Settings) -> dict[str, Any]:
    """The `real_models` section of `results.json`."""
    models = {}
    for i, name in enumerate(SPECS):
        models[name] = measure(
            name, settings, seed=i, budget_s=settings.target_group_budget_s
        )
    return {
        "impls": list(IMPLS),
        "ops": dict(OPS),
        "build_note": (
            "`build` times our constructors (blocks and model) around eqx.nn layers made "
            "beforehand, not the layers' own constructors; for autostatic it includes the "
            "partition and the twins"
        ),
        "models": models,
        "variant_notes": {
            DROPOUT_CHILD: (
                "the fair twin must mark its `eqx.nn.Dropout` static for plain "
                "`jax.jit`, and Equinox compares a static module with `Module.__eq__` "
                "(a `tree_equal`) unless both are one object; left a child, the "
                "Dropout's `p` and `inference` are leaves, and a call under plain "
                "`jax.jit` fails on the traced `inference`"
            )
        },
    }
