"""Deciding the static/dynamic partition of an AutoModule instance.

The partition is decided when construction ends (`freeze_partition`) from the
attribute values, which stay exactly as assigned, and is carried in the aux data from
then on (`_layout`): every later flatten reads it back (after checking that no
attribute was replaced and no container changed in place; if one was, it is decided
again from the values as they are), and every unflatten only puts values where it
says. Nothing is decided from an unflattened instance's values: unflattening with
`None`s, in_axes ints, shardings or sentinels keeps the structure (deciding again at
every flatten is what inox abandoned).

Each field's value is walked through its built-in containers once: every `eqx.nn`
layer met becomes its fast carrier in the pytree child (`_carriers`), and JAX's
flatten of the result gives the leaves: all arrays (or none), the field is a child;
none an array, its value goes into the aux; both, the child is the value with `None`
in each non-array leaf's place (`_layout`'s kinds).
"""

import functools
import operator
import threading
from collections.abc import Callable, Iterator
from types import NoneType
from typing import Any, Final

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .._compat import warn_if_transformed
from ._annotations import array_fields, NUMBER_TYPES, stands_for_array
from ._carriers import (
    carrier_class,
    is_carried_class,
    is_carrier_class,
    real_layer,
    with_layers,
)
from ._containers import is_watched, SCALAR_TYPES, walk, watched_containers
from ._fields import (
    fields_of,
    FieldSpec,
    has_partition,
    is_partitioned_class,
    set_layer,
)
from ._layout import (
    Aux,
    CARRIED,
    carrier_flatten_functions,
    CHILD,
    Flat,
    flatten_functions as layout_flatten_functions,
    has_stored_partition,
    HOLED,
    layout_for,
    make_aux,
    materialise,
    plain_split,
    PlainSplit,
    set_carrier_partition,
    set_partition,
    STATIC,
    static_sequence,
    static_tree,
)
from ._mixed import carried_at, Holes, punch, punch_items
from ._retrace import note_new_aux, NOTED_ENTRY_TYPES
from ._static_checks import find_hidden_array, is_uncomparable, warn_once
from ._static_values import needs_exact_float, snapshot_leaf

MISSING: Final = object()

_object_getattribute = object.__getattribute__
_object_new = object.__new__


def is_dynamic_leaf(x: Any) -> bool:
    """A leaf of a template or of a tree given for loading: arrays (jax, numpy,
    tracers) and `jax.ShapeDtypeStruct`s, as `eqx.filter_eval_shape` makes them."""
    return eqx.is_array(x) or isinstance(x, jax.ShapeDtypeStruct)


def _is_dynamic(x: Any, array_field: bool) -> bool:
    """Whether a leaf of a field's value is a pytree child: an array, or in a field
    annotated to hold arrays (`_annotations`) what stands for one there. An array's
    type is noted (`_plain_array_types`), so that later leaves of that type (the rest
    of a list of arrays, or the next model's) are decided by type alone."""
    if _is_array(x):
        _add_array_type(type(x))
        return True
    return array_field and stands_for_array(x)


def _is_array(x: Any) -> bool:
    """`eqx.is_array`, less numpy values of a dtype JAX cannot hold: a text, bytes
    or date scalar (`np.str_("relu")` read from a config) is a static value, as a
    `str` is; an array of such a dtype is refused at construction."""
    if not eqx.is_array(x):
        return False
    return isinstance(x, jax.Array) or _jax_holds(x.dtype)


@functools.cache
def _jax_holds(dtype: np.dtype) -> bool:
    if dtype.kind in "mM":  # numpy files timedelta64 under its integers
        return False
    return bool(jnp.issubdtype(dtype, jnp.number) or jnp.issubdtype(dtype, jnp.bool_))


def _static_problem(value: Any) -> str | None:
    """What is wrong with `value` as a static leaf, as the end of a sentence."""
    if isinstance(value, Iterator):
        return (
            f"is an iterator ({type(value).__qualname__}), kept as a static value: "
            "the first loop over it consumes it, and every later one sees it empty. "
            "Store a list or tuple of its items instead (e.g. `list(...)`)."
        )
    hidden = find_hidden_array(value)
    if hidden is not None:
        return (
            f"holds {hidden}, where AutoModule cannot see it, so it is part of a "
            "static value: it will be baked into compiled code as a constant, get no "
            "gradient, and a new one retraces. Store the array as an attribute (or in "
            "a list/dict/tuple/Module attribute), or use eqx.Partial / "
            "jax.tree_util.Partial instead of functools.partial or a closure."
        )
    if is_uncomparable(value):
        return (
            f"is a static value of type {type(value).__qualname__} that can be neither "
            "hashed nor compared with a boolean ==. jax.jit compares static values to "
            "reuse compiled code, and will fail on it. Give the type a boolean __eq__, "
            "or store its data as arrays."
        )
    return None


def _leaf_paths(value: Any) -> list[str]:
    return [jtu.keystr(path) for path, _ in jtu.tree_flatten_with_path(value)[0]]


# Exact types found to be array leaves that need no per-value check (jax arrays,
# tracers, numpy scalars; not numpy arrays, whose dtype may be `object`): whether a
# type is an array does not depend on the value, so the weights of every layer skip
# `eqx.is_array`'s isinstance chain and the container walk.
_plain_array_types: set[type] = set()


def _note_array_type(value: Any) -> None:
    """Adds the type of `value` to `_plain_array_types` if it is an array type."""
    if _is_array(value):
        _add_array_type(type(value))


def _add_array_type(kind: type) -> None:
    """Adds `kind`, the type of an array, to `_plain_array_types`, unless it is a
    numpy array, whose dtype may be `object`."""
    if kind is not np.ndarray:
        _plain_array_types.add(kind)


# A tuple taken for a tuple of scalars in a plain split (STATIC in its layout).
_SEQUENCE: Final = -1
# A value of a type in `_static_leaf_types` (a function) in a plain split: STATIC in its
# layout, and checked (`_static_leaf_entry`).
_CHECKED: Final = -2
# A list in a plain split: STATIC if it holds scalars, HOLED if layers and static leaves.
_LIST: Final = -3


def _type_kind(kind: type, forced_static: bool, array_field: bool) -> int | None:
    """STATIC, CHILD or CARRIED for the values of type `kind` that need neither a
    walk nor checks (but see `_plain_kind` for floats), `_SEQUENCE` for a tuple
    (static if it holds scalars only), else None."""
    if kind in SCALAR_TYPES:
        if array_field and kind in NUMBER_TYPES and not forced_static:
            return CHILD  # initial loop state: `num_steps: IntScalarLike = 0`
        return STATIC  # the sizes and flags of every layer
    if kind is tuple and (forced_static or not array_field):
        return _SEQUENCE  # a shape, a kernel size
    if kind is list and not (forced_static or array_field):
        return _LIST  # sizes, a block's layers
    if kind in _static_leaf_types:
        return _CHECKED  # an activation function: static, checked per value
    if forced_static:
        return None
    if kind in _plain_array_types or kind is NoneType:
        return CHILD  # None: an empty child, as in an eqx.Module (`bias=None`)
    if _carrier_class_of(kind) is not None:
        return CARRIED  # a layer held alone: its carrier decides its own leaves
    return None


def _plain_kind(value: Any, forced_static: bool, array_field: bool) -> int | None:
    """STATIC or CHILD for a value that needs neither a walk nor checks, else None."""
    kind = _type_kind(type(value), forced_static, array_field)
    if kind == STATIC and type(value) in (float, complex) and needs_exact_float(value):
        return None  # held as an `ExactFloat`
    return kind


# Per type met in a field's containers: its carrier class, or None if its instances are
# kept as they are (most are arrays, numbers and functions: one dict lookup each).
_carrier_of_type: dict[type, type | None] = {}


def _carrier_class_of(cls: type) -> type | None:
    try:
        return _carrier_of_type[cls]
    except KeyError:
        if is_carried_class(cls):
            carrier = carrier_class(cls, _register_carrier)
        else:  # a carrier an `is_leaf` callback handed out stands for its layer
            carrier = cls if is_carrier_class(cls) else None
        return _carrier_of_type.setdefault(cls, carrier)


def _to_carrier(item: Any) -> Any:
    try:
        carrier_cls = _carrier_of_type[type(item)]
    except KeyError:
        carrier_cls = _carrier_class_of(type(item))
    if carrier_cls is None:
        return item
    if type(item) is carrier_cls:  # handed out to an `is_leaf` callback
        item = real_layer(item)
        _handed_out[0] += 1
    carrier = _object_new(carrier_cls)
    set_layer(carrier, item)
    # Most layers: a generated split, no walk (`freeze_partition`, inlined: one call
    # per layer of every model built).
    flat = _plain_split(carrier, True)
    set_carrier_partition(
        carrier, compute_partition(carrier, final=True) if flat is None else flat
    )
    return carrier


def with_carriers(value: Any) -> Any:
    """`value` with each `eqx.nn` layer reachable through built-in containers as its
    carrier: what an AutoModule's child holds in its place."""
    return walk(value, ("replacement",), _to_carrier, None)


def _check_leaves(
    owner: type,
    where: str,
    flattened: Any,
    leaves: list[Any],
    flags: list[bool],
    warn: bool,
) -> None:
    """Refuses object arrays; warns of static leaves that hide arrays or cannot be
    compared, and (as Equinox does for the arguments of a generated `__init__`) of
    JAX-transformed callables nested in a field. `leaves` are those of `flattened`
    (carriers in place of layers, whose leaves differ from the layers'), which names
    their paths."""
    paths = None
    for i, (leaf, flag) in enumerate(zip(leaves, flags)):
        if type(leaf) in SCALAR_TYPES:
            continue
        if flag:
            continue
        if warn and leaf is not flattened:  # Equinox's __setattr__ saw the value
            warn_if_transformed(owner, leaf)
        if type(leaf) is np.ndarray:  # of objects, text, bytes, dates or records
            path = _leaf_paths(flattened)[i]
            raise TypeError(
                f"{where}{path} is a numpy array of dtype {leaf.dtype}, which JAX "
                "can neither trace nor store. Convert it to a numeric dtype, or "
                "keep its items in a list or tuple (static): e.g. `tuple(x.tolist())`."
            )
        if not warn:
            continue
        problem = _static_problem(leaf)
        if problem is not None:
            if paths is None:
                paths = _leaf_paths(flattened)
            warn_once((where + paths[i], problem), f"{where + paths[i]} {problem}")


def _split_field(
    owner: type,
    where: str,
    value: Any,
    forced_static: bool,
    array_field: bool,
    final: bool,
    met: list[Any],
) -> tuple[int, Any]:
    """The kind of one field and its child or aux entry (`_layout`'s kinds).
    `_decide` has taken the plain values. An explicit `static=True` is honoured for
    every leaf that is not an array."""
    array_field = array_field and not forced_static
    walked = walk(value, (where,), _to_carrier if final else None, met)
    has_carriers = walked is not value
    if not forced_static and _all_decided(walked):
        return (CARRIED if has_carriers else CHILD), walked
    if _is_dynamic(walked, array_field):
        leaves, treedef = [walked], None
        flags = [True]
    else:
        leaves, treedef = jtu.tree_flatten(walked)
        arrays = _plain_array_types
        flags = [type(x) in arrays or _is_dynamic(x, array_field) for x in leaves]
        if (has_partition(walked) or treedef.num_nodes != len(leaves) + 1) and any(
            stands_for_array(x) for x, f in zip(leaves, flags) if not f
        ):  # a module, or a nest that may hold one (a flat list or tuple holds none)
            flags = _decided_by_modules(walked, flags)
    n_dynamic = sum(flags)
    _check_leaves(owner, where, walked, leaves, flags, final)
    for leaf, flag in zip(leaves, flags):  # so that `_split_flat` takes them next
        if not flag and type(leaf) not in _static_leaf_types:
            _note_static_leaf_type(leaf)
    if forced_static and n_dynamic:
        raise TypeError(
            f"{where} is marked eqx.field(static=True) but holds "
            f"{n_dynamic} array(s). AutoModule never makes an array static: remove "
            "static=True (AutoModule makes the non-array parts static by itself), "
            "or store hashable Python data there instead."
        )
    if not forced_static and n_dynamic == len(leaves):
        return (CARRIED if has_carriers else CHILD), walked
    assert treedef is not None  # a lone array is a child
    if n_dynamic == 0:
        if leaves and jtu.treedef_is_leaf(treedef):
            _note_static_leaf_type(value)
            return STATIC, snapshot_leaf(value)
        return STATIC, static_tree(value, treedef, leaves, has_carriers)
    return HOLED, punch(walked, treedef, leaves, flags, has_carriers)


def _split_flat(
    owner: type, where: str, value: Any, final: bool, met: list[Any]
) -> tuple[int, Any] | None:
    """`_split_field` for a flat list or tuple whose items' types alone decide them
    (a block's `[Linear, relu, Linear, Dropout]`): arrays, `eqx.nn` layers, `None`,
    and static leaves of types met before (functions, strings, exact numbers).
    Holding an array directly or through a layer, it is a child, with holes if it
    also holds static leaves; None for any other value, which takes the walk."""
    kind = type(value)
    if not final or (kind is not list and kind is not tuple):
        return None
    types = set(map(type, value))
    if types.isdisjoint(_static_leaf_types) and types.isdisjoint(SCALAR_TYPES):
        return None  # no static item: the walk's own flat path is quicker
    items = list(value)
    at, carried = [], []
    dynamic = False
    for i, item in enumerate(items):
        item_kind = type(item)
        if item_kind in _plain_array_types:
            dynamic = True
        elif item_kind is NoneType:
            continue
        elif item_kind in _static_leaf_types or (
            item_kind in SCALAR_TYPES and _plain_kind(item, False, False) == STATIC
        ):
            at.append(i)
        elif _carrier_class_of(item_kind) is not None:
            items[i] = carrier = _to_carrier(item)
            carried.append(i)
            # A layer without arrays (a `Dropout`) holds no leaf.
            dynamic = dynamic or bool(jtu.tree_leaves(carrier))
        else:
            return None  # a module, a container, a value to look into
    if not at:
        return None  # no static item: the walk's own flat path is quicker
    if not dynamic:
        return None  # all static: a static tree, as the walk decides
    if kind is list:
        met.append(value)
    static = [items[i] for i in at]
    _check_static_items(owner, where, at, static)
    return HOLED, punch_items(kind, items, at, static, carried_at(carried))


def _check_static_items(
    owner: type, where: str, at: list[int], static: list[Any]
) -> None:
    """`_check_leaves` for the static items of a flat list or tuple, at `at`."""
    for i, leaf in zip(at, static):
        if type(leaf) in SCALAR_TYPES:
            continue
        warn_if_transformed(owner, leaf)
        _warn_of_static_problem(f"{where}[{i}]", leaf)


def _warn_of_static_problem(path: str, leaf: Any) -> None:
    """Warns, once per place, of what is wrong with `leaf` as a static leaf at
    `path` (`_static_problem`)."""
    problem = _static_problem(leaf)
    if problem is not None:
        warn_once((path, problem), f"{path} {problem}")


# Exact types whose instances are static leaves whatever their value: JAX leaves that
# are neither arrays, numbers nor containers (functions, activation objects). A field
# holding one needs its checks only, no walk and no flatten.
_static_leaf_types: set[type] = set()


def _note_static_leaf_type(value: Any) -> None:
    kind = type(value)
    if not (
        kind in SCALAR_TYPES
        or is_watched(kind)
        or isinstance(value, (np.ndarray, np.generic))
        or _is_array(value)
        or stands_for_array(value)
        or _carrier_class_of(kind) is not None
    ):
        _static_leaf_types.add(kind)


# Exact types whose instances flatten to dynamic leaves only: arrays of the types in
# `_plain_array_types` and carriers; and AutoModule classes, whose instances do so once
# constructed (a module still being decided may hold itself).
_decided_types: set[type] = set()
_module_types: set[type] = set()


def _all_decided(value: Any) -> bool:
    """Whether `value` is an array or decided node, or a flat list or tuple of them
    (a list of layers, most often): every leaf is dynamic, no flatten needed to tell."""
    kind = type(value)
    if kind in _decided_types:
        return True
    items = value if kind is list or kind is tuple else (value,)
    kinds = set(map(type, items))
    for kind in kinds - _decided_types - _module_types:
        if kind in _plain_array_types or is_carrier_class(kind):
            _decided_types.add(kind)
        elif is_partitioned_class(kind):
            _module_types.add(kind)
        else:
            return False
    if kinds.isdisjoint(_module_types):
        return True
    deciding = getattr(_deciding, "ids", None) or ()
    return all(
        has_stored_partition(x) and id(x) not in deciding
        for x in items
        if type(x) in _module_types
    )


def _decided_by_modules(value: Any, flags: list[bool]) -> list[bool]:
    """`flags` with every leaf of an AutoModule (or carrier) inside `value` dynamic:
    that module has decided its own children (a `num_steps = 0` in a state held by
    another module's field stays a leaf, whatever that field is annotated)."""
    out: list[bool] = []
    for part in jtu.tree_leaves(value, is_leaf=has_partition):
        if has_partition(part):
            out += [True] * len(jtu.tree_leaves(part))
        else:
            out.append(flags[len(out)])
    return out


class _ContainsItself(Exception):
    """Raised by a flatten of a module whose partition is being decided."""


_deciding = threading.local()  # .ids: the modules whose partition is being decided


def compute_partition(obj: Any, *, final: bool) -> Flat:
    """Decides the partition of `obj` from its current field values.

    `final`: construction has ended, so layers are carried and static values checked
    (with a warning for hidden arrays); otherwise the partition is only provisional,
    for a flatten from inside `__init__` or `__check_init__`.
    """
    plain = _plain_split(obj, final)
    if plain is not None:
        return plain  # nothing to walk, nothing to check
    deciding: set[int] = getattr(_deciding, "ids", None) or set()
    _deciding.ids = deciding
    if id(obj) in deciding:
        # A field holds the module itself (`self.xs = [self]`): flattening it would
        # recurse forever. The caller deciding that field names it.
        raise _ContainsItself
    deciding.add(id(obj))
    try:
        return _decide(obj, final)
    finally:
        deciding.discard(id(obj))


def _plain_split(obj: Any, final: bool) -> Flat | None:
    """The partition of an instance whose fields all hold plain values (numbers,
    strings, jax arrays, lone `eqx.nn` layers: most layers and blocks), from the
    split cached per types tuple; None if a field holds anything else or is unset,
    or if a layer would be carried in a provisional partition (`compute_partition`)."""
    spec = fields_of(type(obj))
    try:
        values = spec.read(_object_getattribute(obj, "__dict__"))
    except KeyError:
        return None
    types = tuple(map(type, values))
    try:
        split = spec.plain_splits[types]
    except KeyError:
        split = _new_plain_split(type(obj), spec, values, types)
    if type(split) is int:  # not plain while fewer leaf types were known
        if split == _known_types_count():
            return None
        split = _new_plain_split(type(obj), spec, values, types)
    if split is None or (split.carriers and not final):
        return None
    try:
        flat = split.flat(values)
    except _NotPlain:  # a tuple or list of other values: the general path, for good
        spec.plain_splits[types] = None
        return None
    for i, _ in split.inexact:
        if needs_exact_float(values[i]):
            return _held_exactly(flat, split.inexact)
    return flat


def _held_exactly(flat: Flat, inexact: tuple[tuple[int, int], ...]) -> Flat:
    """`flat` with each float or complex zero or NaN among its entries held as an
    `ExactFloat` (a `Dropout(0.0)`'s `p`), under the layout of those entry types."""
    children, aux, values, containers = flat
    entries = list(aux.entries)
    for _, j in inexact:
        entries[j] = snapshot_leaf(entries[j])
    return children, make_aux(aux.layout, tuple(entries)), values, containers


def _new_plain_split(
    cls: type, spec: FieldSpec, values: tuple[Any, ...], types: tuple[type, ...]
) -> PlainSplit | None:
    """The split of these field types, or None if one of them is not plain; cached
    either way, as it follows from the types alone (and, for a type not plain yet,
    from the static leaf and array types known: the number of them is cached, and a
    type met as either since makes the split be made again). A tuple or list is
    taken for what the first instance's holds."""
    for value in values:  # an array type not met before is plain from now on
        _note_array_type(value)
    kinds = list(map(_type_kind, types, spec.declared_static, array_fields(cls)))
    entry_of: dict[int, Callable[[Any], Any]] = {}
    child_of: dict[int, Callable[[Any], Any]] = {}
    holed_of: dict[int, Callable[[Any], Any]] = {}
    for i, kind in enumerate(kinds):
        where = f"{cls.__qualname__}.{spec.names[i]}"
        if kind == _CHECKED:
            kinds[i], entry_of[i] = STATIC, _static_leaf_entry(where)
        elif kind in (_SEQUENCE, _LIST) and _all_layers(values[i]):
            if spec.declared_static[i]:  # arrays marked static: the general path says
                kinds[i] = None
            else:  # an `MLP`'s layers, a list of layers
                kinds[i], child_of[i] = CARRIED, _carried_items
        elif kind in (_SEQUENCE, _LIST) and _scalar_sequence(values[i], False):
            kinds[i], entry_of[i] = STATIC, _scalars_entry  # a shape, sizes
        elif kind in (_SEQUENCE, _LIST) and _all_arrays(values[i]):
            if spec.declared_static[i]:  # arrays marked static: the general path says
                kinds[i] = None
            else:  # a list of weights, of per-step values
                kinds[i], child_of[i] = CHILD, _array_items
        elif kind == _LIST and (holed := _holed_list(cls, where))(values[i], True):
            kinds[i], holed_of[i] = HOLED, holed
        elif kind in (_SEQUENCE, _LIST):
            kinds[i] = None  # a list of other values: the general path
    if None in kinds:
        spec.plain_splits[types] = _known_types_count()
        return None
    layout = layout_for(cls, tuple(kinds))  # pyright: ignore[reportArgumentType]  # no None
    entry_types = []
    for i, kind in enumerate(kinds):
        if kind == HOLED:
            entry_types.append(Holes)
        elif kind == STATIC and i in entry_of:
            # A checked function's entry is `Compared` for a type whose == is Python.
            entry_types.append(type(entry_of[i](values[i])))
        elif kind == STATIC:
            entry_types.append(types[i])
    split = plain_split(
        layout.with_types(tuple(entry_types)),
        _to_carrier,
        entry_of=entry_of,
        child_of=child_of,
        holed_of=holed_of,
        watched=tuple(i for i, t in enumerate(types) if t is list),
    )
    # Threads making the first instances at once share one split.
    made = spec.plain_splits.get(types)
    if type(made) is PlainSplit:
        return made
    spec.plain_splits[types] = split
    return split


def _known_types_count() -> int:
    """How many static leaf and array types are known: a split found not plain is
    made again once this grows (both sets only grow)."""
    return len(_static_leaf_types) + len(_plain_array_types)


def _holed_list(owner: type, where: str) -> Callable[..., Any]:
    """The child and holes record of a field's flat list of layers (or arrays) and
    static leaves in a plain split (`_split_flat`); raises for another list."""

    def holed(value: list[Any], probe: bool = False) -> Any:
        split = _split_flat(owner, where, value, True, [])
        if split is None or split[0] != HOLED:
            if probe:
                return None
            raise _NotPlain
        return split[1]

    return holed


def _all_layers(value: list[Any] | tuple[Any, ...]) -> bool:
    """Whether `value` is a non-empty list or tuple of `eqx.nn` layers that are
    carried."""
    return bool(value) and all(_carrier_class_of(type(x)) is not None for x in value)


def _carried_items(value: list[Any] | tuple[Any, ...]) -> list[Any] | tuple[Any, ...]:
    """The child of a list or tuple of layers in a plain split: their carriers."""
    carriers = list(map(_to_carrier, value))
    if not carriers or any(map(operator.is_, carriers, value)):
        raise _NotPlain  # an item that is not a layer: the general path
    return carriers if type(value) is list else tuple(carriers)


def _all_arrays(value: list[Any] | tuple[Any, ...]) -> bool:
    """Whether `value` is a non-empty list or tuple of arrays of types decided by
    type alone (`_plain_array_types`)."""
    return bool(value) and _plain_array_types.issuperset(map(type, value))


def _array_items(value: list[Any] | tuple[Any, ...]) -> list[Any] | tuple[Any, ...]:
    """The child of a list or tuple of arrays in a plain split: itself."""
    if not _all_arrays(value):
        raise _NotPlain  # an item that is not such an array: the general path
    return value


def _static_leaf_entry(where: str) -> Callable[[Any], Any]:
    """The aux entry of a field's static leaf of a type in `_static_leaf_types` in a
    plain split, given the checks `_decide` gives it (each warning once per place)."""

    def entry(value: Any) -> Any:
        _warn_of_static_problem(where, value)
        return snapshot_leaf(value)

    return entry


class _NotPlain(Exception):
    """A tuple or list in a plain split holds something other than what the split
    takes it for (Python scalars, layers, or layers and static leaves)."""


def _scalars_entry(value: tuple[Any, ...]) -> Any:
    entry = _scalar_sequence(value, False)
    if entry is None:
        raise _NotPlain
    return entry


def _scalar_sequence(value: Any, array_field: bool) -> Any:
    """The aux entry of a list or tuple of Python scalars (a shape, sizes, names),
    which is static whole; None for any other value, and in a field annotated to
    hold arrays, where numbers are leaves."""
    kind = type(value)
    if kind is not tuple and kind is not list:
        return None
    if value and type(value[0]) not in SCALAR_TYPES:
        return None  # a list of 20,000 arrays is not looked through
    types = tuple(map(type, value))
    if not SCALAR_TYPES.issuperset(types):
        return None
    if array_field and not NUMBER_TYPES.isdisjoint(types):
        return None
    if float in types or complex in types:  # a zero or NaN is held as `ExactFloat`
        leaves = [snapshot_leaf(x) for x in value]
        return static_sequence(kind, tuple(map(type, leaves)), leaves)
    return static_sequence(kind, types, value)


def _decide(obj: Any, final: bool) -> Flat:
    cls = type(obj)
    spec = fields_of(cls)
    attrs = _object_getattribute(obj, "__dict__")
    qualname = cls.__qualname__
    kinds = []
    children = []
    entries = []
    values = []
    met: list[Any] = []
    for name, forced_static, array_field in zip(
        spec.names, spec.declared_static, array_fields(cls)
    ):
        try:
            value = attrs[name]
        except KeyError:
            # A default that a custom __init__ left alone, or, while __init__ is
            # still running, a field not yet set.
            value = _unset_value(cls, name, spec.defaults)
            if final and value is not MISSING:
                attrs[name] = value  # so that flatten finds every field in place
        values.append(value)
        plain = _plain_kind(value, forced_static, array_field)
        if plain in (CHILD, STATIC):  # a layer is carried by `_split_field`
            (children if plain == CHILD else entries).append(value)
            kinds.append(plain)
            continue
        if type(value) in _static_leaf_types:  # a function: checked, static
            _check_leaves(cls, f"{qualname}.{name}", value, [value], [False], final)
            entries.append(snapshot_leaf(value))
            kinds.append(STATIC)
            continue
        sequence = _scalar_sequence(value, array_field and not forced_static)
        if sequence is not None:  # sizes, a shape, names: no walk, no flatten
            entries.append(sequence)
            kinds.append(STATIC)
            if type(value) is list:
                met.append(value)
            continue
        try:
            split = None
            if not (forced_static or array_field):
                split = _split_flat(cls, f"{qualname}.{name}", value, final, met)
            if split is None:
                split = _split_field(
                    cls,
                    f"{qualname}.{name}",
                    value,
                    forced_static,
                    array_field,
                    final,
                    met,
                )
            kind, part = split
        except _ContainsItself:
            raise TypeError(
                f"{qualname}.{name} holds the {qualname} instance itself: a module "
                "is a tree of its fields and cannot contain itself. Store the data it "
                "needs instead, or pass the module as an argument where it is used."
            ) from None
        if kind == HOLED:
            child, entry = part
            children.append(child)
            entries.append(entry)
        else:
            (entries if kind == STATIC else children).append(part)
        kinds.append(kind)
    layout = layout_for(cls, tuple(kinds))
    aux = make_aux(layout, tuple(entries))
    if spec.carrier:  # a carrier's flatten checks nothing (see `_carriers`)
        return tuple(children), aux, None, None
    return tuple(children), aux, tuple(values), watched_containers(met)


def _unset_value(cls: type, name: str, defaults: dict[str, Any]) -> Any:
    """What reading a field that `__init__` left unset gives: a class attribute of
    that name (a subclass's `config = [...]` over its base's abstract property),
    else the dataclass default."""
    for klass in cls.__mro__:
        if name in vars(klass):
            value = vars(klass)[name]
            if not hasattr(type(value), "__get__"):
                return value
            break
    return defaults.get(name, MISSING)


# How many carriers handed out to `is_leaf` callbacks have been met in field values
# (`_to_carrier`): one that comes back in a new module stands for its layer.
_handed_out = [0]


def freeze_partition(obj: Any) -> None:
    """Decides and stores the partition of a fully constructed AutoModule. Fields that
    were given carriers (the layers an `is_leaf` callback saw) hold their layers."""
    handed_out = _handed_out[0]
    flat = compute_partition(obj, final=True)
    if _handed_out[0] != handed_out:
        attrs = _object_getattribute(obj, "__dict__")
        for name in fields_of(type(obj)).names:
            if name in attrs:
                attrs[name] = with_layers(attrs[name])
        flat = compute_partition(obj, final=True)
    set_partition(obj, flat)


def _refresh(obj: Any) -> tuple[tuple[Any, ...], Aux]:
    """The partition of an instance whose stored one no longer holds (a container
    of its changed in place), or that has none yet (still in `__init__`)."""
    if not has_stored_partition(obj):
        children, aux, _, _ = compute_partition(obj, final=False)
        return children, aux
    flat = compute_partition(obj, final=True)
    set_partition(obj, flat)
    return flat[0], flat[1]


def _register_carrier(cls: type) -> None:
    """Makes the new carrier class `cls` a pytree node, whose unflatten makes the
    carrier with its layer filled in at once."""
    flatten, flatten_with_keys, unflatten = carrier_flatten_functions(cls)
    jtu.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)


def flatten_functions(
    cls: type,
) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """The flatten functions of a new AutoModule class, whose unflatten notes the
    static values it is traced with (`_retrace`)."""
    return layout_flatten_functions(
        cls, _refresh, on_new_aux=note_new_aux, noted_types=NOTED_ENTRY_TYPES
    )


def new_decided(cls: type, attrs: Any) -> Any:
    """A new `cls` instance with the fields `attrs` and its partition decided,
    without calling `__init__`."""
    obj = _object_new(cls)
    _object_getattribute(obj, "__dict__").update(attrs)
    freeze_partition(obj)
    return obj


def reduce(obj: Any) -> tuple[Any, ...]:
    """`__reduce__` for copy and pickle: the class and the attribute values (the
    partition is decided again from them)."""
    return (new_decided, (type(obj), dict(materialise(obj))))
