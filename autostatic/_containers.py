"""Read-only lists, dicts and sets for the attributes of a constructed AutoModule.

A container built up in `__init__` (`self.layers = []`, then `.append`) is frozen when
construction ends. Static values travel in the pytree's aux data and are shared with
every treedef JAX caches, and dynamic containers are the pytree's children, so a later
in-place mutation would silently change compiled-function caches or desynchronise the
partition. The frozen types are subclasses of `list`/`dict`/`set`: they compare equal
to, and behave like, the built-in containers for reading, and their key paths are those
of the built-ins (`SequenceKey`, `DictKey` in sorted key order).
"""

from collections import defaultdict, OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Final

import jax.tree_util as jtu

# Where a container sits: ("Net.layers", 3, "w") formats as Net.layers[3]['w'].
ContainerPath = tuple[Hashable, ...]


def format_path(path: ContainerPath) -> str:
    if not path:
        return "this container"
    head, *keys = path
    return str(head) + "".join(
        f".{key.name}" if isinstance(key, jtu.GetAttrKey) else f"[{key!r}]"  # pyright: ignore[reportAttributeAccessIssue]  # narrowed by isinstance
        for key in keys
    )


_BUILTINS = (list, dict, set, OrderedDict, defaultdict)


def _builtin_of(cls: type) -> type:
    """The built-in container a frozen one (or a subclass of one) stands for."""
    return next(k for k in cls.__mro__ if k in _BUILTINS)


def _refuse(method: str) -> Callable[..., Any]:
    def refuse(self: Any, *args: object, **kwargs: object) -> Any:
        builtin = _builtin_of(type(self))
        kind = builtin.__name__
        if not getattr(self, "_sealed", False):  # OrderedDict.__init__ inserts by []=
            return getattr(builtin, method)(self, *args, **kwargs)
        raise TypeError(
            f"{format_path(self._path)} cannot be modified ({kind}.{method}): the "
            "attributes of an AutoModule are immutable after __init__, because its "
            "static/dynamic partition was decided then. Build a new "
            f"{kind} and make a modified copy of the module with "
            "autostatic.tree_at(lambda m: m.<attribute>, module, new_value)."
        )

    refuse.__name__ = method
    return refuse


def _add_refusals(cls: type, methods: Iterable[str]) -> None:
    for method in methods:
        setattr(cls, method, _refuse(method))


class FrozenList(list):
    """A `list` that refuses in-place modification."""

    __slots__ = ("_path", "_sealed")

    def __init__(self, items: Iterable[Any] = (), path: ContainerPath = ()):
        list.__init__(self, items)
        self._path = path
        self._sealed = True

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenList, (list(self), self._path))


class FrozenDict(dict):
    """A `dict` that refuses in-place modification."""

    __slots__ = ("_path", "_sorted_keys", "_sealed")

    def __init__(self, items: Any = (), path: ContainerPath = ()):
        dict.__init__(self, items)
        self._path = path
        self._sorted_keys = tuple(sorted(dict.keys(self)))
        self._sealed = True

    def __reduce__(self):
        return (FrozenDict, (dict(self), self._path))


class FrozenSet(set):
    """A `set` that refuses in-place modification."""

    __slots__ = ("_path", "_sealed")

    def __init__(self, items: Iterable[Any] = (), path: ContainerPath = ()):
        set.__init__(self, items)
        self._path = path
        self._sealed = True

    def __reduce__(self):
        return (FrozenSet, (set(self), self._path))


class FrozenOrderedDict(OrderedDict):
    """An `OrderedDict` that refuses in-place modification (keys in insertion order,
    as JAX flattens an `OrderedDict`)."""

    def __init__(self, items: Any = (), path: ContainerPath = ()):
        OrderedDict.__init__(self, items)
        self._path = path
        self._sealed = True

    def __reduce__(self):
        return (FrozenOrderedDict, (list(self.items()), self._path))


class FrozenDefaultDict(defaultdict):
    """A `defaultdict` that refuses in-place modification; a missing key gives the
    default without storing it."""

    __slots__ = ("_path", "_sorted_keys", "_sealed")

    def __init__(self, factory: Any, items: Any = (), path: ContainerPath = ()):
        defaultdict.__init__(self, factory, items)
        self._path = path
        self._sorted_keys = tuple(sorted(dict.keys(self)))
        self._sealed = True

    def __missing__(self, key: Any) -> Any:
        if self.default_factory is None:
            raise KeyError(key)
        return self.default_factory()

    def __reduce__(self):
        return (FrozenDefaultDict, (self.default_factory, dict(self), self._path))


def _plain_results(cls: type, base: type) -> None:
    """Copies and `|` of a frozen container are plain, mutable built-ins (what `+` of
    a list and `|` of a dict give already): the base implementations would build the
    frozen subclass and then fill it in, which it refuses or (`defaultdict`) ignores."""

    def as_base(self: Any) -> Any:
        return (
            base(self)
            if base is not defaultdict
            else defaultdict(self.default_factory, self)
        )

    def copy(self: Any) -> Any:
        return as_base(self)

    def union(self: Any, other: Any) -> Any:
        if not isinstance(other, dict):
            return NotImplemented
        out = as_base(self)
        out.update(other)
        return out

    def reflected_union(self: Any, other: Any) -> Any:
        if not isinstance(other, dict):
            return NotImplemented
        out = as_base(self) if base is defaultdict else base(other)
        if base is defaultdict:
            out.clear()
            out.update(other)
        out.update(self)
        return out

    for name, method in (
        ("copy", copy),
        ("__copy__", copy),
        ("__or__", union),
        ("__ror__", reflected_union),
        (
            "fromkeys",
            classmethod(lambda _, keys, value=None: base.fromkeys(keys, value)),
        ),
    ):
        setattr(cls, name, method)


_LIST_MUTATORS = (
    "append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
    "__setitem__", "__delitem__", "__iadd__", "__imul__",
)  # fmt: skip
_DICT_MUTATORS = (
    "__setitem__", "__delitem__", "pop", "popitem", "clear", "update", "setdefault",
    "__ior__",
)  # fmt: skip
_SET_MUTATORS = (
    "add", "discard", "remove", "pop", "clear", "update", "intersection_update",
    "difference_update", "symmetric_difference_update", "__ior__", "__iand__",
    "__isub__", "__ixor__",
)  # fmt: skip
_add_refusals(FrozenList, _LIST_MUTATORS)
_add_refusals(FrozenDict, _DICT_MUTATORS)
_add_refusals(FrozenOrderedDict, (*_DICT_MUTATORS, "move_to_end"))
_add_refusals(FrozenDefaultDict, _DICT_MUTATORS)
_add_refusals(FrozenSet, _SET_MUTATORS)
_plain_results(FrozenDict, dict)
_plain_results(FrozenOrderedDict, OrderedDict)
_plain_results(FrozenDefaultDict, defaultdict)


def as_builtin(value: Any) -> Any:
    """A shallow copy of a frozen container as the built-in it stands for."""
    if type(value) is FrozenDefaultDict:
        return defaultdict(value.default_factory, value)
    return _builtin_of(type(value))(value)


def _print_as_builtin(cls: type) -> None:
    """`repr`, IPython and treescope show a frozen container as the built-in: the
    model's attribute reads (and compares) like one, and the frozen type is an
    implementation detail. (Equinox's `tree_pformat` already does.) `list` and `dict`
    print without their type name already; `set`, `OrderedDict` and `defaultdict`
    would name the subclass."""

    def __repr__(self: Any) -> str:
        return repr(as_builtin(self))

    def _repr_pretty_(self: Any, printer: Any, cycle: bool) -> None:
        printer.pretty(as_builtin(self))  # IPython; a frozen container has no cycle

    def __treescope_repr__(self: Any, path: str | None, subtree_renderer: Any) -> Any:
        return subtree_renderer(as_builtin(self), path=path)

    methods = {"_repr_pretty_": _repr_pretty_, "__treescope_repr__": __treescope_repr__}
    if cls.__repr__ not in (list.__repr__, dict.__repr__):
        methods["__repr__"] = __repr__
    for name, method in methods.items():
        setattr(cls, name, method)


for frozen_type in (
    FrozenList,
    FrozenDict,
    FrozenSet,
    FrozenOrderedDict,
    FrozenDefaultDict,
):
    _print_as_builtin(frozen_type)


def _list_flatten_with_keys(x: FrozenList):
    return tuple((jtu.SequenceKey(i), v) for i, v in enumerate(x)), x._path


def _list_unflatten(path: ContainerPath, children: Iterable[Any]) -> FrozenList:
    return FrozenList(children, path)


def _dict_flatten(x: FrozenDict):
    keys = x._sorted_keys
    return tuple(dict.__getitem__(x, k) for k in keys), (keys, x._path)


def _dict_flatten_with_keys(x: FrozenDict):
    keys = x._sorted_keys
    children = tuple((jtu.DictKey(k), dict.__getitem__(x, k)) for k in keys)
    return children, (keys, x._path)


def _dict_unflatten(aux: tuple[tuple[Any, ...], ContainerPath], children) -> FrozenDict:
    keys, path = aux
    return FrozenDict(zip(keys, children), path)


jtu.register_pytree_with_keys(
    FrozenList,
    _list_flatten_with_keys,
    _list_unflatten,
    flatten_func=lambda x: (x, x._path),
)
jtu.register_pytree_with_keys(
    FrozenDict, _dict_flatten_with_keys, _dict_unflatten, flatten_func=_dict_flatten
)
jtu.register_pytree_with_keys(
    FrozenOrderedDict,
    lambda x: (tuple((jtu.DictKey(k), v) for k, v in x.items()), (tuple(x), x._path)),
    lambda aux, children: FrozenOrderedDict(zip(aux[0], children), aux[1]),
    flatten_func=lambda x: (tuple(x.values()), (tuple(x), x._path)),
)
jtu.register_pytree_with_keys(
    FrozenDefaultDict,
    lambda x: (
        tuple((jtu.DictKey(k), dict.__getitem__(x, k)) for k in x._sorted_keys),
        (x.default_factory, x._sorted_keys, x._path),
    ),
    lambda aux, children: FrozenDefaultDict(aux[0], zip(aux[1], children), aux[2]),
    flatten_func=lambda x: (
        tuple(dict.__getitem__(x, k) for k in x._sorted_keys),
        (x.default_factory, x._sorted_keys, x._path),
    ),
)


class ContainerCycleError(TypeError):
    """A list, dict or tuple that contains itself: a pytree cannot hold a cycle."""


_DICT_KINDS = (
    dict,
    FrozenDict,
    OrderedDict,
    FrozenOrderedDict,
    defaultdict,
    FrozenDefaultDict,
)


# Python scalars: leaves that are static, compare in C, hide no array and are never a
# container (nor converted by `freeze`'s `convert` hook).
SCALAR_TYPES: Final = frozenset({int, float, bool, str, complex, bytes})
_NOT_CONTAINERS = SCALAR_TYPES | {type(None)}


def _items(value: Any) -> list[tuple[Hashable, Any]] | None:
    """(key, item) pairs of a container `freeze` descends into, else None."""
    # By the type: `isinstance` on an `eqx.Module` reads `__class__` through
    # Equinox's Python `__getattribute__`, for every layer of every model built.
    kind = type(value)
    if kind is list or issubclass(kind, (FrozenList, tuple)):
        return list(enumerate(value))
    if kind in _DICT_KINDS or issubclass(kind, FrozenDict):
        return list(value.items())
    return None


def _rebuilt(value: Any, items: list[Any], path: ContainerPath) -> Any:
    """The frozen twin of container `value`, holding `items` (its frozen items)."""
    kind = type(value)
    if kind is list or issubclass(kind, FrozenList):
        return FrozenList(items, path)
    if isinstance(value, tuple):
        if all(new is old for new, old in zip(items, value)):
            return value
        return kind(*items) if hasattr(value, "_fields") else kind(items)
    pairs = zip(value.keys(), items)
    if kind is OrderedDict or kind is FrozenOrderedDict:
        return FrozenOrderedDict(list(pairs), path)
    if kind is defaultdict or kind is FrozenDefaultDict:
        return FrozenDefaultDict(value.default_factory, dict(pairs), path)
    return FrozenDict(dict(pairs), path)


def check_acyclic(value: Any, path: ContainerPath) -> None:
    """Raises `ContainerCycleError` naming where, if a list, dict or tuple reachable
    through built-in containers from `value` contains itself. Builds nothing."""
    items = _items(value)
    if items is None:
        return
    stack = [(id(value), path, iter(items))]
    on_path = {id(value)}
    while stack:
        node_id, node_path, rest = stack[-1]
        entry = next(rest, None)
        if entry is None:
            stack.pop()
            on_path.discard(node_id)
            continue
        key, item = entry
        if type(item) in _NOT_CONTAINERS:
            continue
        sub_items = _items(item)
        if sub_items is None:
            continue
        item_path = (*node_path, key)
        if id(item) in on_path:
            raise _cycle_error(item_path)
        on_path.add(id(item))
        stack.append((id(item), item_path, iter(sub_items)))


def _cycle_error(path: ContainerPath) -> ContainerCycleError:
    return ContainerCycleError(
        f"{format_path(path)} is a container that contains itself (a cycle). A "
        "pytree cannot hold a cycle: store the data without the self-reference."
    )


def freeze(
    value: Any,
    path: ContainerPath,
    convert: Callable[[Any, ContainerPath], Any] | None = None,
) -> Any:
    """Returns `value` with every list, dict (also `OrderedDict`, `defaultdict`) and set
    reachable through built-in containers replaced by its frozen twin. Other objects
    are returned as they are, or as `convert(obj, path)` gives them.

    Iterative, so a nest is limited by JAX's own flatten (Equinox builds and jits 900
    nested lists), not by Python's recursion limit; a container met again on its own
    path is a cycle and raises `ContainerCycleError` naming where.
    """
    kind = type(value)
    if kind is set:
        return FrozenSet(value, path)
    if kind is list and all(type(item) in _NOT_CONTAINERS for item in value):
        return FrozenList(value, path)  # sizes, names: nothing to walk
    items = _items(value)
    if items is None:
        return value if convert is None else convert(value, path)
    # One entry per container being frozen: (container, path, its items, frozen ones).
    stack = [(value, path, items, [])]
    on_path = {id(value)}
    while True:
        node, node_path, node_items, frozen = stack[-1]
        if len(frozen) < len(node_items):
            key, item = node_items[len(frozen)]
            if type(item) in _NOT_CONTAINERS:  # the sizes and names of a model
                frozen.append(item)
                continue
            item_path = (*node_path, key)
            if type(item) is set:
                frozen.append(FrozenSet(item, item_path))
                continue
            sub_items = _items(item)
            if sub_items is None:
                frozen.append(item if convert is None else convert(item, item_path))
                continue
            if id(item) in on_path:
                raise _cycle_error(item_path)
            on_path.add(id(item))
            stack.append((item, item_path, sub_items, []))
            continue
        stack.pop()
        on_path.discard(id(node))
        result = _rebuilt(node, frozen, node_path)
        if not stack:
            return result
        stack[-1][3].append(result)
