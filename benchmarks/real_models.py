"""Real models: the models people write, with `eqx.nn` layers inside.

Four models, each in three implementations built from the same `eqx.nn` layers:

- `linear-256`: 256 `eqx.nn.Linear(8, 8)` in a list beside an activation function;
- `transformer`: 12 blocks, each a `MultiheadAttention(num_heads=2, query_size=16)`, two
  `LayerNorm(16)`, an `MLP(16, 16, 32, 1)` and a `Dropout(0.1)`, in a list;
- `mixed-stack`: 32 blocks, each a mixed list `[Linear, jax.nn.relu, Linear, Dropout]`,
  an int list `[8, 8]`, a string name and a float scale, in a list;
- `nested`: modules nested 4 deep: 4 holding 4 holding 4 `Linear(8, 8)` and an int.

Implementations: `autostatic` (AutoModule classes, bare annotations, `jax.jit`),
`eqx-static` (eqx.Module with `eqx.field(static=True)` on every field of ours that holds
no array, `jax.jit`: the fair twin; Equinox's own layers are as Equinox declares them,
so a model holding an `eqx.nn.MLP`, whose activation is a non-static function field,
cannot be passed to plain `jax.jit`, and neither can a function in a mixed list) and
`eqx-filter` (eqx.Module without markers, `eqx.filter_jit`: what Equinox users run).
Where plain `jax.jit` refuses the fair twin, Equinox's own route to it still works:
`eqx.partition` once, `jax.jit` over the arrays with the static half closed over; the
`dispatch_partitioned` row times that for both eqx models against our plain `jax.jit`.
The three are generated from one field list per class (`define_classes`), so fields
and their order are the same. `linear-256` also has the `dict` floor
(`{"layers": [{"weight": ..., "bias": ...}]}`) for flatten, unflatten + read and `==`.
Each model's entry in the registry (`registry.MODELS`) names the functions below that
make its layers and build it; `measure` times one entry, `run` all of them.

The `eqx.nn` layers are made once per model and shared by the three implementations:
one layer of each kind by its constructor from a fixed key, the others with its
structure and fresh arrays drawn by a seeded numpy generator (`copy_layers`). `build`
times every constructor of ours (the blocks and the model, lists and names included)
around those layers, not the layers' own constructors, whose random initialisation
(~1-15 ms a layer on CPU) would swamp the difference; for `autostatic` it includes
deciding the partition and swapping the layers for autostatic's own fast layer
classes. The second model that treedef `==` compares with is built from copies of the
layers' arrays, so no aux object (tuple, string, int list) is shared.

Every cell of one model is interleaved in one `run_interleaved` run; ratios are paired
per round (`paired_ratio`).
"""

import dataclasses
import functools
import operator
from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from . import models as M
from .schema import Failed, Ratio, RealInfo, RealModel, RealModels, Stat
from .settings import Settings
from .timing import drop_failing, paired_ratio, run_interleaved, scaled_summary

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
US = 1e6


def define_classes(name: str, fields: str, static: str = "") -> dict[str, type]:
    """One class per implementation, with the same fields in the same order; the
    `eqx-static` one marks the `static` fields."""

    def namespace() -> dict[str, Any]:
        return {
            "__module__": __name__,
            "__qualname__": name,
            "__annotations__": {f: Any for f in fields.split()},
        }

    markers = {f: eqx.field(static=True) for f in static.split()}
    return {
        "autostatic": type(name, (M.AutoBase,), namespace()),
        "eqx-static": type(name, (eqx.Module,), {**namespace(), **markers}),
        "eqx-filter": type(name, (eqx.Module,), namespace()),
    }


LINEARS = define_classes("Linears", "layers activation", "activation")
BLOCK = define_classes("Block", "attn ln1 ln2 mlp dropout", "dropout")
# The fair twin must mark its `eqx.nn.Dropout` static (its `inference` flag would be a
# tracer under plain jax.jit), so Equinox compares that module with `Module.__eq__`
# (a `tree_equal`) wherever two blocks' aux meet: treedef `==` of two built models.
# For scale, the same block with the Dropout left a child (not callable under jax.jit).
BLOCK_DROPOUT_CHILD = define_classes("Block", "attn ln1 ln2 mlp dropout")["eqx-static"]
DROPOUT_CHILD = "eqx-static, Dropout a child"
TRANSFORMER = define_classes("Transformer", "blocks")
MIXED_BLOCK = define_classes(
    "MixedBlock", "layers sizes name scale", "sizes name scale"
)
MIXED_STACK = define_classes("MixedStack", "blocks")
LEAF = define_classes("Leaf", "layers n", "n")
MID = define_classes("Mid", "children")
TOP = define_classes("Top", "children")
# What the fair twin's other configurations (`Model.treedef_variants`) are.
VARIANT_NOTES: dict[str, str] = {
    DROPOUT_CHILD: (
        "the fair twin must mark its `eqx.nn.Dropout` static for plain "
        "`jax.jit`, and Equinox compares a static module with `Module.__eq__` "
        "(a `tree_equal`) unless both are one object; left a child, the "
        "Dropout's `p` and `inference` are leaves, and a call under plain "
        "`jax.jit` fails on the traced `inference`"
    )
}


# --------------------------------------------------------------------------------------
# The layers each model is built from, and its builders (named in the registry).
# --------------------------------------------------------------------------------------


def copy_layers(template: Any, n: int, rng: np.random.Generator) -> list[Any]:
    """`n` layers like `template`, with fresh arrays drawn by numpy (a layer's own
    constructor draws with jax.random, eagerly ~15 ms a layer on a loaded 2-core CPU;
    vmapped, seconds of compilation per layer kind)."""
    arrays, rest = eqx.partition(template, eqx.is_array)

    def fresh(x: jax.Array) -> jax.Array:
        return jnp.asarray(rng.uniform(-0.3, 0.3, x.shape).astype(x.dtype))

    return [eqx.combine(jtu.tree_map(fresh, arrays), rest) for _ in range(n)]


def make_linear(key: int = 0) -> eqx.nn.Linear:
    """An `eqx.nn.Linear(8, 8)` by its own constructor."""
    return eqx.nn.Linear(8, 8, key=jax.random.key(key))


def new_linear() -> eqx.nn.Linear:
    """The layer `eqx.tree_at` swaps in: a Linear other than the model's."""
    return make_linear(1)


def new_layer_norm() -> eqx.nn.LayerNorm:
    """The layer `eqx.tree_at` swaps in for the transformer's."""
    return eqx.nn.LayerNorm(16)


def linear_layers(seed: int) -> list[Any]:
    """`linear-256`'s layers."""
    return copy_layers(make_linear(), 256, np.random.default_rng(seed))


def build_linears(impl: str, layers: list[Any]) -> Any:
    """`linear-256` in one implementation (or the `dict` floor)."""
    if impl == DICT:
        return {"layers": [{"weight": x.weight, "bias": x.bias} for x in layers]}
    return LINEARS[impl](layers=[*layers], activation=jax.nn.relu)


def transformer_layers(seed: int) -> list[dict[str, Any]]:
    """The transformer's layers, one dict of them per block."""
    rng = np.random.default_rng(seed)
    key = jax.random.key(0)
    attn = eqx.nn.MultiheadAttention(num_heads=2, query_size=16, key=key)
    mlp = eqx.nn.MLP(16, 16, 32, 1, key=key)
    norm = eqx.nn.LayerNorm(16)
    return [
        {"attn": a, "ln1": n1, "ln2": n2, "mlp": m, "dropout": eqx.nn.Dropout(0.1)}
        for a, n1, n2, m in zip(
            copy_layers(attn, 12, rng),
            copy_layers(norm, 12, rng),
            copy_layers(norm, 12, rng),
            copy_layers(mlp, 12, rng),
        )
    ]


def build_transformer(impl: str, blocks: list[dict[str, Any]]) -> Any:
    """The transformer in one implementation (or `DROPOUT_CHILD`)."""
    if impl == DROPOUT_CHILD:
        block, model = BLOCK_DROPOUT_CHILD, TRANSFORMER["eqx-static"]
    else:
        block, model = BLOCK[impl], TRANSFORMER[impl]
    return model(blocks=[block(**b) for b in blocks])


def mixed_stack_layers(seed: int) -> list[tuple[Any, Any, Any]]:
    """`mixed-stack`'s layers, a (Linear, Linear, Dropout) per block."""
    rng = np.random.default_rng(seed)
    first, second = (
        copy_layers(make_linear(), 32, rng),
        copy_layers(make_linear(), 32, rng),
    )
    return [(a, b, eqx.nn.Dropout(0.1)) for a, b in zip(first, second)]


def build_mixed_stack(impl: str, blocks: list[tuple[Any, Any, Any]]) -> Any:
    """`mixed-stack` in one implementation."""
    block = MIXED_BLOCK[impl]
    return MIXED_STACK[impl](
        blocks=[
            block(
                layers=[a, jax.nn.relu, b, d], sizes=[8, 8], name=f"block{i}", scale=0.5
            )
            for i, (a, b, d) in enumerate(blocks)
        ]
    )


def nested_layers(seed: int) -> list[list[list[Any]]]:
    """`nested`'s 64 Linears, grouped 4 x 4 x 4."""
    flat = iter(copy_layers(make_linear(), 64, np.random.default_rng(seed)))
    return [[[next(flat) for _ in range(4)] for _ in range(4)] for _ in range(4)]


def build_nested(impl: str, parts: list[list[list[Any]]]) -> Any:
    """`nested` in one implementation."""
    leaf, mid = LEAF[impl], MID[impl]
    return TOP[impl](
        children=[
            mid(children=[leaf(layers=[*layers], n=8) for layers in mids])
            for mids in parts
        ]
    )


# --------------------------------------------------------------------------------------
# Measuring.
# --------------------------------------------------------------------------------------

_FIELDS: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    """A class's dataclass field names (none for other classes), cached."""
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
    """`tree` with every array copied: equal values, no shared buffer."""
    return jtu.tree_map(
        lambda x: jnp.array(x, copy=True) if eqx.is_array(x) else x, tree
    )


def _make_dispatch_cell(
    jit: Callable[..., Any], probe: Callable[[Any], Any], model: Any
) -> Any:
    """A call of the model's probe, jitted by `jit`, blocked on."""
    f = jit(probe)
    return lambda: f(model).block_until_ready()


def _make_partitioned_dispatch_cell(probe: Callable[[Any], Any], model: Any) -> Any:
    """Equinox's route to plain `jax.jit` for a model with non-array leaves (an
    `eqx.nn.MLP`'s activation, a function in a list): partition once outside, close
    over the static half, pass only the arrays: what an Equinox user writes to call
    plain `jax.jit` on a model whose fair twin it refuses."""
    params, static = eqx.partition(model, eqx.is_array)
    f = jax.jit(lambda p: probe(eqx.combine(p, static)))
    return lambda: f(params).block_until_ready()


Cells = dict[
    tuple[str, str], Callable[[], Any]
]  # (op, implementation) -> what is timed


def _add_cells(
    cells: Cells, model: M.Model, impl: str, built: Any, parts: Any, new_layer: Any
) -> None:
    """The build, dispatch and `eqx.tree_at` cells of one implementation."""
    cells["build", impl] = functools.partial(model.build, impl, parts)
    cells["dispatch", impl] = _make_dispatch_cell(JIT[impl], model.probe, built)
    if impl != "eqx-filter":  # its `dispatch` already is eqx.filter_jit
        cells["dispatch_filter_jit", impl] = _make_dispatch_cell(
            eqx.filter_jit, model.probe, built
        )
    if impl != "autostatic":  # ours has nothing to partition: its plain jax.jit
        cells["dispatch_partitioned", impl] = _make_partitioned_dispatch_cell(
            model.probe, built
        )
    layer = model.layer
    assert layer is not None  # `Model` refuses an eqx.nn model without one
    weight = jnp.ones_like(layer(built).weight)
    cells["tree_at_array", impl] = lambda m=built, w=weight: eqx.tree_at(
        lambda t: layer(t).weight, m, w
    )
    cells["tree_at_layer", impl] = lambda m=built: eqx.tree_at(layer, m, new_layer)


def _make_cells(
    model: M.Model, impls: tuple[str, ...], seed: int
) -> tuple[Cells, dict[str, RealInfo]]:
    """Every cell of one model, and the shape of each implementation's pytree."""
    parts = model.parts(seed)
    copied = _copy_arrays(parts)
    assert model.new_layer is not None and model.layer is not None
    new_layer = model.new_layer()
    cells: Cells = {}
    info: dict[str, RealInfo] = {}
    for impl in impls:
        built = model.build(impl, parts)
        leaves, treedef = jtu.tree_flatten(built)
        other = jtu.tree_structure(model.build(impl, copied))
        info[impl] = {
            "leaves": len(leaves),
            "treedef_nodes": treedef.num_nodes,
            "treedefs_equal": bool(treedef == other),
        }
        cells["treedef_eq", impl] = functools.partial(operator.eq, treedef, other)
        if impl in model.treedef_variants:
            continue
        cells["flatten", impl] = functools.partial(jtu.tree_flatten, built)
        cells["unflatten_read", impl] = lambda d=treedef, x=leaves: read_all(
            jtu.tree_unflatten(d, x)
        )
        if impl == DICT:
            continue
        _add_cells(cells, model, impl, built, parts, new_layer)
        replaced = eqx.tree_at(model.layer, built, new_layer)
        info[impl]["tree_at_layer_same_treedef"] = bool(
            jtu.tree_structure(replaced) == treedef
        )
    return cells, info


def _share_dispatch_cells(
    samples: dict[str, list[float]], fails: dict[tuple[str, str], str]
) -> None:
    """Rows whose cell of one implementation is its `dispatch` cell get that cell's
    samples (or failure), so that their ratios pair the same rounds."""
    for op, impl in (
        ("dispatch_filter_jit", "eqx-filter"),
        ("dispatch_partitioned", "autostatic"),
    ):
        if f"dispatch|{impl}" in samples:
            samples[f"{op}|{impl}"] = samples[f"dispatch|{impl}"]
        elif ("dispatch", impl) in fails:
            fails[op, impl] = fails["dispatch", impl]


def _summarise(
    samples: dict[str, list[float]],
    fails: dict[tuple[str, str], str],
    impls: tuple[str, ...],
) -> tuple[dict[str, dict[str, Stat | Failed]], dict[str, dict[str, Ratio]]]:
    """µs per operation and implementation, and autostatic's paired ratios to every
    other implementation."""
    ops_us: dict[str, dict[str, Stat | Failed]] = {}
    ratios: dict[str, dict[str, Ratio]] = {}
    for op in OPS:
        ops_us[op], ratios[op] = {}, {}
        for impl in impls:
            key = f"{op}|{impl}"
            if key in samples:
                ops_us[op][impl] = scaled_summary(samples[key], US)
            elif (op, impl) in fails:
                ops_us[op][impl] = {"fails": fails[op, impl]}
        ours = samples.get(f"{op}|autostatic")
        for ref in impls[1:]:
            if ours is not None and f"{op}|{ref}" in samples:
                ratios[op][ref] = paired_ratio(ours, samples[f"{op}|{ref}"])
    return ops_us, ratios


def measure(
    model: M.Model, settings: Settings, seed: int = 0, budget_s: float | None = None
) -> RealModel:
    """Every op of one model in every implementation, interleaved in one run."""
    impls = IMPLS + ((DICT,) if model.dict_floor else ()) + model.treedef_variants
    cells, info = _make_cells(model, impls, seed)
    fails = drop_failing(cells)
    samples = run_interleaved(
        {f"{op}|{impl}": fn for (op, impl), fn in cells.items()},
        settings.rounds,
        settings.target_batch_s,
        seed=seed,
        max_seconds=budget_s,
    )
    _share_dispatch_cells(samples, fails)
    ops_us, ratios = _summarise(samples, fails, impls)
    return {
        "rounds": min((len(v) for v in samples.values()), default=0),
        "info": info,
        "ops_us": ops_us,
        "ratios": ratios,
    }


def run(settings: Settings, models: Mapping[str, M.Model]) -> RealModels:
    """The `real_models` section of `results.json`: every model of `models` (the
    registry's eqx.nn models), each with its position as its seed."""
    if M.asx is None:
        raise RuntimeError(f"autostatic is unavailable ({M.AUTOSTATIC_ERROR})")
    measured = {}
    for i, (name, model) in enumerate(models.items()):
        measured[name] = measure(
            model, settings, seed=i, budget_s=settings.target_group_budget_s
        )
    return {
        "impls": list(IMPLS),
        "ops": dict(OPS),
        # "the twins": autostatic's fast layer classes, in the words results.json has
        # always carried.
        "build_note": (
            "`build` times our constructors (blocks and model) around eqx.nn layers made "
            "beforehand, not the layers' own constructors; for autostatic it includes the "
            "partition and the twins"
        ),
        "models": measured,
        "variant_notes": dict(VARIANT_NOTES),
    }
