"""The synthetic benchmark models, in every implementation, built from the same arrays;
and `Model`, how the registry (`registry.MODELS`) describes any benchmark model.

Three synthetic models:

- `mlp`: N layers, each `weight f32[8,8]`, `bias f32[8]`, `activation=jax.nn.relu`,
  `width=8` (int), `sizes=[8, 8]` (list of ints); the MLP has a `scale: float`.
- `transformer`: pre-norm blocks (layer norm, multi-head attention, feed-forward with
  `jax.nn.gelu`, a float dropout rate), a final layer norm.
- `mixed`: one attribute holding a mixed container,
  `parts = [Linear, jax.nn.relu, 3, {"w": array, "tag": "x"}]`.

Implementations (`IMPLS`):

- `autostatic`: `AutoModule` subclasses written as a user would, bare annotations and
  no field markers (the classes below).
- `eqx-static`: `eqx.Module` counterparts with every non-array field
  `eqx.field(static=True)` (lists of ints as tuples): the fair twin's classes. A mixed
  container cannot be a static field (it holds arrays), so its non-array items are
  wrapped in a `Box` module with one static field, which is what an Equinox user has to
  do for plain `jax.jit`.
- `eqx-filter`: `eqx.Module` counterparts with no markers (what users usually write);
  it needs `eqx.filter_jit`, plain `jax.jit` rejects the function/int leaves.
- `dataclass`: frozen dataclasses registered with `jax.tree_util.register_dataclass`,
  non-array fields as meta fields (a floor: flatten runs in C++).
- `dict`: the arrays in built-in dicts/lists (the physical floor); the non-array data is
  held outside the pytree and closed over by the jitted function, as hand-written JAX
  does.

`python-node` (pytree-operation tables only) holds the MLP's arrays in the cheapest
possible Python-registered node: the floor of any module class whose flatten/unflatten
run in Python, as eqx.Module's and AutoModule's do.

The counterparts are generated from the AutoModule classes' annotations
(`_counterpart`), so every implementation has the same fields in the same order; only
the static markers differ. Every forward function (`forward`) is written once, with
attribute access; the `dict` floor sees an attribute view of `params` merged with its
closed-over config (`merge`), built only at trace time so it costs nothing per call.
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.tree_util as jtu
import numpy as np

try:
    import autostatic as asx

    AUTOSTATIC_ERROR: str | None = None
except Exception as err:
    asx = None
    AUTOSTATIC_ERROR = f"{type(err).__name__}: {err}"

IMPLS: tuple[str, ...] = ("autostatic", "eqx-static", "eqx-filter", "dataclass", "dict")
JAX_JIT = "jax.jit"
FILTER_JIT = "eqx.filter_jit"
# Every (implementation, jit) pair that is measured. `eqx-filter` + `jax.jit` is kept so
# that its failure is recorded; `autostatic` + `eqx.filter_jit` shows what a user who
# keeps their Equinox call sites gets.
VARIANTS: tuple[tuple[str, str], ...] = (
    ("autostatic", JAX_JIT),
    ("autostatic", FILTER_JIT),
    ("eqx-static", JAX_JIT),
    ("eqx-static", FILTER_JIT),
    ("eqx-filter", FILTER_JIT),
    ("eqx-filter", JAX_JIT),
    ("dataclass", JAX_JIT),
    ("dict", JAX_JIT),
)


# What each jit name wraps a function with.
JITS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    JAX_JIT: jax.jit,
    FILTER_JIT: eqx.filter_jit,
}


def variant_name(impl: str, jit: str) -> str:
    """A variant's name in results.json: `"<implementation> / <jit>"`."""
    return f"{impl} / {jit}"


# --------------------------------------------------------------------------------------
# AutoModule classes, written as a user would.
# --------------------------------------------------------------------------------------

# AutoModule, or eqx.Module where autostatic failed to import: the classes still exist,
# so that the failure is reported (building an `autostatic` model refuses) instead of
# breaking every benchmark at import.
AutoBase: type = asx.AutoModule if asx is not None else eqx.Module

# The non-array fields of each class: static markers for eqx-static, meta fields for the
# dataclass floor. AutoModule never reads this; it decides from the values.
STATIC_FIELDS: dict[str, tuple[str, ...]] = {}
_AUTO_CLASSES: dict[str, type] = {}


def _user_class(*static: str) -> Callable[[type], type]:
    """Registers an AutoModule class of the synthetic models with the names of its
    non-array fields, from which `_counterpart` makes the other implementations."""

    def register(cls: type) -> type:
        STATIC_FIELDS[cls.__name__] = static
        _AUTO_CLASSES[cls.__name__] = cls
        return cls

    return register


@_user_class("activation", "width", "sizes")
class Layer(AutoBase):
    weight: jax.Array
    bias: jax.Array
    activation: Callable
    width: int
    sizes: list


@_user_class("scale")
class MLP(AutoBase):
    layers: list
    scale: float


@_user_class("eps")
class LayerNorm(AutoBase):
    gamma: jax.Array
    beta: jax.Array
    eps: float


@_user_class("num_heads")
class Attention(AutoBase):
    wq: jax.Array
    wk: jax.Array
    wv: jax.Array
    wo: jax.Array
    num_heads: int


@_user_class("activation")
class FeedForward(AutoBase):
    w1: jax.Array
    b1: jax.Array
    w2: jax.Array
    b2: jax.Array
    activation: Callable


@_user_class("dropout")
class Block(AutoBase):
    ln1: LayerNorm
    attn: Attention
    ln2: LayerNorm
    ff: FeedForward
    dropout: float


@_user_class()
class Transformer(AutoBase):
    blocks: list
    ln_f: LayerNorm


@_user_class()
class Linear(AutoBase):
    weight: jax.Array
    bias: jax.Array


@_user_class()
class Mixed(AutoBase):
    parts: list


@_user_class("value")
class Box(AutoBase):
    """Only the `eqx-static` and `dataclass` counterparts are used: a static wrapper."""

    value: Any


def _counterpart(auto_cls: type, style: str) -> type:
    """The `style` implementation of an AutoModule class: same fields, same order."""
    name = auto_cls.__name__
    annotations = dict(auto_cls.__annotations__)
    static = STATIC_FIELDS[name]
    namespace: dict[str, Any] = {
        "__module__": __name__,
        "__qualname__": f"{style.replace('-', '_')}.{name}",
        "__annotations__": annotations,
    }
    if style == "eqx-static":
        namespace.update({n: eqx.field(static=True) for n in static})
        return type(name, (eqx.Module,), namespace)
    if style == "eqx-filter":
        return type(name, (eqx.Module,), namespace)
    if style == "dataclass":
        cls = dataclasses.make_dataclass(
            name,
            list(annotations.items()),
            frozen=True,
            namespace={"__module__": __name__},
        )
        cls.__qualname__ = namespace["__qualname__"]
        data = [n for n in annotations if n not in static]
        return jtu.register_dataclass(cls, data_fields=data, meta_fields=list(static))
    raise ValueError(style)


_COUNTERPARTS: dict[str, dict[str, type]] = {
    style: {name: _counterpart(cls, style) for name, cls in _AUTO_CLASSES.items()}
    for style in ("eqx-static", "eqx-filter", "dataclass")
}


# --------------------------------------------------------------------------------------
# Kits: how one implementation builds a node, a list of ints and a static item.
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Kit:
    """How one implementation builds a node, a list of ints and a static item."""

    impl: str

    def node(self, kind: str, **fields: Any) -> Any:
        if self.impl == "dict":
            return dict(fields)
        if self.impl == "autostatic":
            if asx is None:
                raise RuntimeError(f"autostatic is unavailable ({AUTOSTATIC_ERROR})")
            return _AUTO_CLASSES[kind](**fields)
        return _COUNTERPARTS[self.impl][kind](**fields)

    def ints(self, values: Sequence[int]) -> Any:
        # Static fields must be hashable for eqx (a list would be accepted by jax.jit,
        # whose treedef hash ignores aux data, but not by eqx.filter_jit's static arg).
        return (
            tuple(values) if self.impl in ("eqx-static", "dataclass") else list(values)
        )

    def box(self, value: Any) -> Any:
        # Only where a non-array sits inside a container that also holds arrays.
        return (
            self.node("Box", value=value)
            if self.impl in ("eqx-static", "dataclass")
            else value
        )


def unbox(x: Any) -> Any:
    """The value of a `Box` counterpart, or `x` itself (trace-time only)."""
    return x.value if type(x).__name__ == "Box" and hasattr(x, "value") else x


class Built:
    """One model in one implementation: the pytree passed to jit, and for the `dict`
    floor the non-array config held outside it.

    The dict floor is built as one tree of arrays and config (`unsplit`), as cheap as
    the two literals a user writes, and split into `tree` and `cfg` on first use:
    timing `build` times those dicts, not the generic `split` (~100x the literals)."""

    def __init__(
        self, impl: str, tree: Any = None, cfg: Any = None, *, unsplit: Any = None
    ) -> None:
        self.impl = impl
        self._tree, self._cfg, self._unsplit = tree, cfg, unsplit

    def _split(self) -> None:
        if self._unsplit is not None:
            self._tree, self._cfg = split(self._unsplit)
            self._unsplit = None

    @property
    def tree(self) -> Any:
        self._split()
        return self._tree

    @property
    def cfg(self) -> Any:
        self._split()
        return self._cfg


def _finish(impl: str, tree: Any) -> Built:
    """A built model; the `dict` floor's tree is split into arrays and config on
    first use."""
    return Built(impl, unsplit=tree) if impl == "dict" else Built(impl, tree)


# --------------------------------------------------------------------------------------
# The dict floor: split arrays from config, and merge them back (at trace time).
# --------------------------------------------------------------------------------------


def _has_array(x: Any) -> bool:
    """Whether any leaf of `x` is an array."""
    return any(eqx.is_array(leaf) for leaf in jtu.tree_leaves(x))


def split(tree: Any) -> tuple[Any, Any]:
    """(params, cfg): arrays in dicts/lists, everything else in a mirror structure.

    A value without arrays goes wholly to `cfg`; a list keeps its positions in `params`
    with `None` (an empty pytree node) where an item has no arrays.
    """
    if eqx.is_array(tree):
        return tree, None
    if isinstance(tree, dict):
        params, cfg = {}, {}
        for k, v in tree.items():
            if not _has_array(v):
                cfg[k] = v
            else:
                params[k], c = split(v)
                if c is not None:
                    cfg[k] = c
        return params, cfg
    if isinstance(tree, (list, tuple)):
        parts = [split(v) if _has_array(v) else (None, v) for v in tree]
        return [p for p, _ in parts], [c for _, c in parts]
    return None, tree


class AttrDict(dict):
    """A dict whose items are also attributes, so one forward function serves all."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def merge(params: Any, cfg: Any) -> Any:
    """Inverse of `split`, with dicts as `AttrDict`s."""
    if isinstance(params, dict) or isinstance(cfg, dict):
        params = params or {}
        cfg = cfg or {}
        return AttrDict(
            {k: merge(params.get(k), cfg.get(k)) for k in {**cfg, **params}}
        )
    if isinstance(params, list) or isinstance(cfg, list):
        n = len(params if params is not None else cfg)
        params = params if params is not None else [None] * n
        cfg = cfg if cfg is not None else [None] * n
        return [merge(p, c) for p, c in zip(params, cfg)]
    return params if params is not None else cfg


def view(built: Built) -> Any:
    """The model as the forward functions see it (eagerly; used for reference outputs)."""
    return merge(built.tree, built.cfg) if built.impl == "dict" else built.tree


# --------------------------------------------------------------------------------------
# Arrays (built once per model) and builders (wrap the same arrays per implementation).
# --------------------------------------------------------------------------------------

MLP_WIDTH = 8
TF_DIM, TF_SEQ, TF_HEADS, TF_HIDDEN, TF_BLOCKS = 32, 16, 4, 64, 2
BATCH = 16
# The input batches of the forward passes (training, time to first call).
MLP_INPUT_SHAPE: tuple[int, ...] = (BATCH, MLP_WIDTH)
TF_INPUT_SHAPE: tuple[int, ...] = (BATCH // 2, TF_SEQ, TF_DIM)


def _arrays(rng: np.random.Generator, *shapes: tuple[int, ...]) -> list[jax.Array]:
    """Seeded float32 arrays of these shapes, scaled by their fan-in, on the device."""
    host = [rng.standard_normal(s).astype(np.float32) / np.sqrt(s[0]) for s in shapes]
    return list(jax.device_put(host))


def mlp_arrays(n: int, seed: int = 0) -> list[tuple[jax.Array, jax.Array]]:
    """The `(weight, bias)` arrays of an `n`-layer MLP."""
    rng = np.random.default_rng(seed)
    flat = _arrays(rng, *[(MLP_WIDTH, MLP_WIDTH), (MLP_WIDTH,)] * n)
    return [(flat[2 * i], flat[2 * i + 1] * 0.1) for i in range(n)]


def build_mlp(
    impl: str,
    arrays: Sequence[tuple[jax.Array, jax.Array]],
    activation: Callable = jax.nn.relu,
    scale: float = 1.0,
) -> Built:
    """The MLP in one implementation, around the given arrays."""
    kit = Kit(impl)
    layers = [
        kit.node(
            "Layer",
            weight=w,
            bias=b,
            activation=activation,
            width=int(w.shape[0]),
            sizes=kit.ints([w.shape[0], w.shape[1]]),
        )
        for w, b in arrays
    ]
    return _finish(impl, kit.node("MLP", layers=layers, scale=scale))


def transformer_arrays(seed: int = 0) -> list[dict[str, jax.Array]]:
    """The arrays of the transformer's blocks, one dict per block (and one for the
    final layer norm)."""
    rng = np.random.default_rng(seed)
    d, h = TF_DIM, TF_HIDDEN
    names_shapes = [
        ("g1", (d,)),
        ("be1", (d,)),
        ("wq", (d, d)),
        ("wk", (d, d)),
        ("wv", (d, d)),
        ("wo", (d, d)),
        ("g2", (d,)),
        ("be2", (d,)),
        ("w1", (d, h)),
        ("b1", (h,)),
        ("w2", (h, d)),
        ("b2", (d,)),
    ]
    blocks = []
    for _ in range(TF_BLOCKS + 1):  # the last one only provides the final layer norm
        block = dict(
            zip(
                [n for n, _ in names_shapes],
                _arrays(rng, *[s for _, s in names_shapes]),
            )
        )
        # Layer norms start at gamma = 1, beta = 0 (done here: arrays are built once).
        for g, b in (("g1", "be1"), ("g2", "be2")):
            block[g], block[b] = block[g] * 0.0 + 1.0, block[b] * 0.0
        blocks.append(block)
    return blocks


def build_transformer(
    impl: str, arrays: Sequence[dict[str, jax.Array]], dropout: float = 0.1
) -> Built:
    """The transformer in one implementation, around the given arrays."""
    kit = Kit(impl)

    def norm(g: jax.Array, b: jax.Array) -> Any:
        return kit.node("LayerNorm", gamma=g, beta=b, eps=1e-5)

    blocks = [
        kit.node(
            "Block",
            ln1=norm(a["g1"], a["be1"]),
            attn=kit.node(
                "Attention",
                wq=a["wq"],
                wk=a["wk"],
                wv=a["wv"],
                wo=a["wo"],
                num_heads=TF_HEADS,
            ),
            ln2=norm(a["g2"], a["be2"]),
            ff=kit.node(
                "FeedForward",
                w1=a["w1"],
                b1=a["b1"],
                w2=a["w2"],
                b2=a["b2"],
                activation=jax.nn.gelu,
            ),
            dropout=dropout,
        )
        for a in arrays[:-1]
    ]
    last = arrays[-1]
    return _finish(
        impl, kit.node("Transformer", blocks=blocks, ln_f=norm(last["g1"], last["be1"]))
    )


def mixed_arrays(seed: int = 0) -> dict[str, jax.Array]:
    """The arrays of the `mixed` model."""
    rng = np.random.default_rng(seed)
    w, b, v = _arrays(rng, (MLP_WIDTH, MLP_WIDTH), (MLP_WIDTH,), (MLP_WIDTH,))
    return {"weight": w, "bias": b, "w": v}


def build_mixed(impl: str, arrays: dict[str, jax.Array]) -> Built:
    """The `mixed` model in one implementation, around the given arrays."""
    kit = Kit(impl)
    linear = kit.node("Linear", weight=arrays["weight"], bias=arrays["bias"])
    parts = [
        linear,
        kit.box(jax.nn.relu),
        kit.box(3),
        {"w": arrays["w"], "tag": kit.box("x")},
    ]
    return _finish(impl, kit.node("Mixed", parts=parts))


# --------------------------------------------------------------------------------------
# A reference point for the pytree-operation tables only (not a model implementation):
# the cheapest possible node whose flatten/unflatten run in Python, as every eqx.Module
# and AutoModule node does. Its unflatten is `object.__new__` plus one slot write.
# --------------------------------------------------------------------------------------

PYNODE = "python-node"


class PyNode:
    """The cheapest Python-registered pytree node: children in one slot, no aux."""

    __slots__ = ("children",)


def _pynode_flatten(node: PyNode) -> tuple[tuple[Any, ...], None]:
    return node.children, None


def _pynode_unflatten(aux: None, children: tuple[Any, ...]) -> PyNode:
    node = object.__new__(PyNode)
    node.children = children
    return node


jtu.register_pytree_node(PyNode, _pynode_flatten, _pynode_unflatten)


def build_pynode_mlp(arrays: Sequence[tuple[jax.Array, jax.Array]]) -> Built:
    """The MLP's arrays as `PyNode(layers=[PyNode(w, b), ...])`: the floor of any
    Python-registered module class (same node count as the module implementations)."""
    return Built(
        PYNODE,
        _pynode_unflatten(
            None, ([_pynode_unflatten(None, (w, b)) for w, b in arrays],)
        ),
    )


# --------------------------------------------------------------------------------------
# How the registry describes a model, of either kind.
# --------------------------------------------------------------------------------------

# Hand-built pytrees in the five implementations of this module (`IMPLS`), measured by
# `scenarios` (tree ops and dispatch) and `training` (where `trained`).
SYNTHETIC = "synthetic"
# Models built from `eqx.nn` layers in the three implementations of `real_models`,
# measured by `real_models.measure`.
EQX_NN = "eqx.nn"


@dataclasses.dataclass(frozen=True)
class Model:
    """One benchmark model: what it is built from, how each implementation builds it,
    and what the sections that measure it need. The registry (`registry.MODELS`) holds
    one per model; the fields after `probe` apply to one kind only."""

    name: str  # its key in results.json (a sized model: `<name>-<depth>`)
    kind: str  # SYNTHETIC or EQX_NN
    # Made once and shared by every implementation (arrays, or eqx.nn layers), from
    # the depth for a sized model, else from a seed.
    parts: Callable[[int], Any]
    build: Callable[[str, Any], Any]  # (implementation, parts) -> the model
    probe: Callable[[Any], jax.Array]  # dispatch's cheap function: one array + 1
    # SYNTHETIC: the forward pass and its input (training), and whether the model is
    # one per depth of `--sizes` and trained.
    apply: Callable[..., jax.Array] | None = None
    input_shape: tuple[int, ...] = ()
    uses_key: bool = False
    sized: bool = False
    trained: bool = False
    # SYNTHETIC, optional: the same parts in the cheapest Python-registered node (a
    # floor of the tree-op tables).
    python_node: Callable[[Any], Built] | None = None
    # EQX_NN: the sub-layer `eqx.tree_at` replaces (it has a `.weight`), a new layer of
    # its kind, whether the `dict` floor is timed too, and other eqx-static
    # configurations timed for treedef `==` only (for scale).
    layer: Callable[[Any], Any] | None = None
    new_layer: Callable[[], Any] | None = None
    dict_floor: bool = False
    treedef_variants: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Refuses an entry that lacks what the sections measuring its kind need."""
        needs = {SYNTHETIC: ("apply", "input_shape"), EQX_NN: ("layer", "new_layer")}
        if self.kind not in needs:
            raise ValueError(f"{self.name}: kind must be one of {list(needs)}")
        missing = [field for field in needs[self.kind] if not getattr(self, field)]
        if missing:
            raise ValueError(f"{self.name}: a {self.kind} model needs {missing}")


# --------------------------------------------------------------------------------------
# Jitting: one function, wrapped per (implementation, jit).
# --------------------------------------------------------------------------------------


def make_jitted(
    impl: str, jit: str, fn: Callable[..., Any], cfg: Any = None
) -> Callable[..., Any]:
    """`fn(model, *args)` jitted for one variant; call it as `f(built.tree, *args)`.

    For the `dict` floor the config is closed over, as hand-written JAX does: the
    compiled function never sees a later change in it (it goes stale instead of
    retracing), which is why the floor is no reference where static values change.
    """

    def merged(params: Any, *args: Any) -> Any:
        return fn(merge(params, cfg), *args)

    def direct(tree: Any, *args: Any) -> Any:
        return fn(tree, *args)

    body: Callable[..., Any] = merged if impl == "dict" else direct
    return JITS[jit](body)
