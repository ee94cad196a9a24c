"""The Equinox internals that AutoModule relies on, checked once at import.

`eqx.Module` registers every subclass as a pytree inside its metaclass, with flatten
functions produced by `equinox._module._module.generate_flatten_functions`, and JAX has
no way to unregister a type. AutoModule therefore hands Equinox its own flatten
functions at that single point.

`eqx.tree_at` and `eqx.nn.inference_mode` (alias `eqx.tree_inference`) cannot see the
static values of an AutoModule; `route_surgery` replaces those three public names with
functions that handle trees holding AutoModules and call Equinox's own otherwise, and
the `tree_at` that `eqx.nn.Shared` calls on its own pytree.

Everything touched here is private to Equinox, so a version whose internals differ
fails loudly at import instead of misbehaving later; the one name private to JAX (its
current trace, read in C++) falls back to JAX's public function where it is missing.
"""

import contextlib
import dataclasses
import functools
import inspect
import re
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Final

import equinox as eqx
import equinox._filters as _eqx_filters
import equinox._module._module as _eqx_module
import equinox._serialisation as _eqx_serialisation
import equinox._tree as _eqx_tree
import equinox.internal._closure_to_pytree as _eqx_closure_to_pytree
import equinox.nn as _eqx_nn
import equinox.nn._inference as _eqx_inference
import equinox.nn._shared as _eqx_shared
import jax
import jax.tree_util as jtu
from jax.extend.core import find_top_trace

from ._identity import WeakIdentitySet

# Equinox's `_ModuleMeta.__call__` raises TypeError(f"Field {name!r} was not initialized.")
_UNSET_FIELD_MESSAGE_END = " was not initialized."
_UNSET_FIELD = re.compile(r"Field '(\w+)' was not initialized\.")

SUPPORTED_EQUINOX = (
    (0, 13, 3),
    (0, 14, 0),
)  # [lower, upper): 0.13.3, 0.13.6, 0.13.8 tested


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:3] if part.isdigit())


def _unwrap(function: Any) -> Any:
    """`function` without the wrappers around it (`__wrapped__` chains)."""
    try:
        return inspect.unwrap(function) if callable(function) else function
    except ValueError:  # a cycle of __wrapped__
        return function


def _other_readers_of_dataclass_init() -> list[str]:
    """The functions and methods of `equinox._module._module`, besides
    `_ModuleMeta.__new__` and `__call__`, that read `_has_dataclass_init` (none in
    the verified versions)."""
    meta = getattr(_eqx_module, "_ModuleMeta", type)
    known = (_unwrap(vars(meta).get("__new__")), _unwrap(vars(meta).get("__call__")))
    classes = [
        v
        for v in vars(_eqx_module).values()
        if isinstance(v, type) and v.__module__ == _eqx_module.__name__
    ]
    readers = []
    for holder in (vars(_eqx_module), *map(vars, classes)):
        for name, value in holder.items():
            function = _unwrap(value)
            code = getattr(function, "__code__", None)
            if (
                code is not None
                and "_has_dataclass_init" in code.co_names
                and not any(function is k for k in known)
            ):
                readers.append(name)
    return readers


def _routed_name_problems() -> list[str]:
    """What is wrong with the Equinox functions autostatic routes or relies on: the
    public names it replaces, `eqx.Module`'s instance dict, and closure conversion."""
    problems = []
    tree_at = _unwrap(eqx.tree_at)
    inference_mode = _unwrap(_eqx_nn.inference_mode)
    if not (
        tree_at is _unwrap(getattr(_eqx_tree, "tree_at", None))
        and _unwrap(getattr(_eqx_shared, "tree_at", None)) is tree_at
        and inference_mode is _unwrap(getattr(_eqx_inference, "inference_mode", None))
        and _unwrap(getattr(eqx, "tree_inference", None)) is inference_mode
    ):
        problems.append(
            "eqx.tree_at / equinox.nn._shared.tree_at / eqx.nn.inference_mode / "
            "eqx.tree_inference are not the functions of equinox._tree and "
            "equinox.nn._inference"
        )
    for module, name in (
        (_eqx_filters, "filter"),
        (_eqx_filters, "partition"),
        (_eqx_filters, "combine"),
        (_eqx_serialisation, "tree_serialise_leaves"),
        (_eqx_serialisation, "tree_deserialise_leaves"),
    ):
        if _unwrap(getattr(eqx, name, None)) is not _unwrap(getattr(module, name, 0)):
            problems.append(f"eqx.{name} is not {module.__name__}.{name}")
    if type(vars(eqx.Module).get("__dict__")).__name__ != "getset_descriptor":
        problems.append("eqx.Module no longer gives its instances a __dict__")
    closure_class = getattr(_eqx_closure_to_pytree, "_Closure", object)
    closure_call = _unwrap(vars(closure_class).get("__call__"))
    if not hasattr(_eqx_closure_to_pytree, "_FunctionWithEquality") or (
        "_adjust_function_closure"
        not in getattr(getattr(closure_call, "__code__", None), "co_names", ())
    ):
        problems.append(
            "equinox.internal.closure_to_pytree no longer calls its function with the "
            "cells rebuilt from its contents"
        )
    return problems


# The names `eqx.Module.__setattr__` uses, in the verified versions.
_MODULE_SETATTR_NAMES: Final = frozenset(
    {
        "_currently_initialising",
        "_module_info",
        "type",
        "names_set",
        "WRAPPER_FIELD_NAMES",
        "_error_method_assignment",
        "_warn_jax_transformed_function",
        "object",
        "__setattr__",
        "dataclasses",
        "FrozenInstanceError",
    }
)


# What a `SharedNode` would need to tell two apart: none is defined.
_STATE_NAMES: Final = {"__init__", "__new__", "__slots__", "__eq__", "__hash__"}


def _check_equinox() -> None:
    version = _version_tuple(eqx.__version__)
    lower, upper = SUPPORTED_EQUINOX
    problems = []
    if not lower <= version < upper:
        problems.append(f"equinox {eqx.__version__} is outside the verified range")
    for name in (
        "generate_flatten_functions",
        "_currently_initialising",
        "MSG_METHOD_IN_INIT",
        "_has_dataclass_init",
        "_warn_jax_transformed_function",
        "_error_method_assignment",
        "_transform_types",
        "_ModuleMeta",
        "WRAPPER_FIELD_NAMES",
    ):
        if not hasattr(_eqx_module, name):
            problems.append(f"equinox._module._module.{name} is missing")
    # Unwrapped throughout: a type-checking import hook (jaxtyping + beartype, as
    # Equinox's own test suite runs) wraps Equinox's functions; our routed names
    # wrap them too (the check runs again in tests, after routing).
    meta_call = _unwrap(vars(getattr(_eqx_module, "_ModuleMeta", type)).get("__call__"))
    call_consts = getattr(getattr(meta_call, "__code__", None), "co_consts", ())
    if _UNSET_FIELD_MESSAGE_END not in call_consts:
        problems.append("_ModuleMeta.__call__ no longer reports unset fields as before")
    call_names = getattr(getattr(meta_call, "__code__", None), "co_names", ())
    # `skip_argument_walk` relies on the entry guarding the walk and nothing else.
    if (
        not {"_has_dataclass_init", "_warn_jax_transformed_function"} <= set(call_names)
        or _other_readers_of_dataclass_init()
    ):
        problems.append(
            "_has_dataclass_init is no longer read by _ModuleMeta.__call__ for its "
            "argument walk alone"
        )
    meta_new = _unwrap(
        getattr(getattr(_eqx_module, "_ModuleMeta", None), "__new__", None)
    )
    code_names = getattr(getattr(meta_new, "__code__", None), "co_names", ())
    for name in ("generate_flatten_functions", "register_pytree_with_keys"):
        if name not in code_names:
            problems.append(f"_ModuleMeta.__new__ no longer calls {name}")
    # `assign_in_init` does what `Module.__setattr__` does for a field in `__init__`.
    setattr_code = getattr(
        _unwrap(vars(eqx.Module).get("__setattr__")), "__code__", None
    )
    if set(getattr(setattr_code, "co_names", ())) != _MODULE_SETATTR_NAMES:
        problems.append("Module.__setattr__ no longer does what assign_in_init does")
    shared_node = getattr(_eqx_shared, "SharedNode", None)
    if not isinstance(shared_node, type) or _STATE_NAMES & vars(shared_node).keys():
        problems.append("equinox.nn._shared.SharedNode is no longer a bare placeholder")
    problems += _routed_name_problems()
    if problems:
        raise ImportError(
            "autostatic cannot work with the installed equinox: "
            + "; ".join(problems)
            + ". Install a verified version: pip install 'equinox>="
            + ".".join(map(str, lower))
            + ",<"
            + ".".join(map(str, upper))
            + "'."
        )


_check_equinox()

# `_check_equinox` has verified each of these private names above.
ModuleMeta = _eqx_module._ModuleMeta
currently_initialising = _eqx_module._currently_initialising
# What `eqx.nn.Shared` puts where a tied node was: a fresh object each time, stateless.
SharedNode: Final = _eqx_shared.SharedNode


# The true `_has_dataclass_init` of the classes whose entry `skip_argument_walk` set
# to False.
_dataclass_init: "weakref.WeakKeyDictionary[type, bool]" = weakref.WeakKeyDictionary()
_class_creation = threading.RLock()


def has_dataclass_init(cls: type) -> bool:
    """Whether `cls` has a generated `__init__`, whose arguments Equinox flattens."""
    try:
        return _dataclass_init[cls]
    except KeyError:
        return _eqx_module._has_dataclass_init[cls]


def skip_argument_walk(cls: type) -> None:
    """Stops Equinox's `_ModuleMeta.__call__` from flattening the arguments of
    `cls`'s generated `__init__` (every layer passed, through Equinox's slow flatten)
    only to warn of a JAX-transformed callable among the leaves: AutoModule's decision
    visits every leaf anyway and warns there (`warn_if_transformed`). Equinox reads
    the entry for nothing else but the subclasses of `cls`, made by
    `creating_subclass`."""
    with _class_creation:
        _dataclass_init[cls] = _eqx_module._has_dataclass_init[cls]
        _eqx_module._has_dataclass_init[cls] = False


@contextlib.contextmanager
def creating_subclass(bases: tuple[type, ...]) -> Iterator[None]:
    """The true entries of `bases` while Equinox makes a subclass of them, which
    inherits a generated `__init__` from them."""
    with _class_creation:
        marked = [b for b in bases for b in b.__mro__ if b in _dataclass_init]
        for base in marked:
            _eqx_module._has_dataclass_init[base] = _dataclass_init[base]
        try:
            yield
        finally:
            for base in marked:
                _eqx_module._has_dataclass_init[base] = False


def warn_if_transformed(cls: type, value: Any) -> None:
    """Equinox's warning for a JAX-transformed callable (`jax.jit(layer)`) stored in
    a module, where its arrays are baked in as constants.

    Equinox's check flattens what the callable wraps (3 us for `jax.nn.relu`, a
    `custom_jvp`, in every block of a model): an object found to hide no array is
    remembered (weakly, by identity) and not looked into again."""
    if type(value) not in _eqx_module._transform_types:  # pyright: ignore[reportPrivateUsage]  # verified at import
        return  # what Equinox's check looks at first
    if value in _hides_no_array:
        return
    check = _eqx_module._warn_jax_transformed_function  # pyright: ignore[reportPrivateUsage]  # verified at import
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check(cls, value)
    if caught:
        check(cls, value)  # again, to warn as Equinox warns
    else:
        _hides_no_array.add(value)


def assign_in_init(module: Any, name: str, value: Any) -> None:
    """What `eqx.Module.__setattr__` does for a declared field while `__init__` runs
    (the caller has checked both; verified at import), with its transformed-callable
    check remembered per object (`warn_if_transformed`): Equinox's own `__setattr__`
    would look into `jax.nn.relu` at every assignment."""
    _eqx_module._error_method_assignment(module, value)  # pyright: ignore[reportPrivateUsage]  # verified at import
    warn_if_transformed(type(module), value)
    object.__setattr__(module, name, value)


# The callables found to wrap no array (`warn_if_transformed`).
_hides_no_array = WeakIdentitySet()


def has_unread_closure(value: Any) -> bool:
    """Whether `value` holds a function whose closure cells are never read.

    `equinox.internal.closure_to_pytree` (optimistix applies it to Optax's
    transformations) keeps a function beside its cells' contents as pytree leaves,
    and calls it with cells rebuilt from those leaves: the original cells are dead.
    """
    return isinstance(value, _eqx_closure_to_pytree._FunctionWithEquality)  # pyright: ignore[reportPrivateUsage]  # verified at import


# "Cannot assign methods in __init__. ...": Equinox's explanation, with the fix.
METHOD_IN_INIT_MESSAGE: str = _eqx_module.MSG_METHOD_IN_INIT
WRAPPER_FIELD_NAMES: tuple[str, ...] = _eqx_module.WRAPPER_FIELD_NAMES  # pyright: ignore[reportPrivateImportUsage]  # verified at import

FlattenFunctions = tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]


def install_flatten_generator(
    claims: Callable[[type], bool], generate: Callable[[type], FlattenFunctions]
) -> None:
    """Route `generate_flatten_functions` to `generate` for classes that `claims`.

    Every other class keeps Equinox's own generated functions; the dispatcher stays
    installed, so class creation in any thread sees a consistent function.
    """
    original = _eqx_module.generate_flatten_functions  # pyright: ignore[reportPrivateImportUsage]  # verified at import

    def generate_flatten_functions(
        cls: type, fields: tuple[dataclasses.Field, ...]
    ) -> FlattenFunctions:
        if claims(cls):
            return generate(cls)
        return original(cls, fields)

    generate_flatten_functions.__wrapped__ = original  # pyright: ignore[reportFunctionMemberAccess]  # functools' convention for what a wrapper wraps
    _eqx_module.generate_flatten_functions = generate_flatten_functions  # pyright: ignore[reportPrivateImportUsage]  # verified at import


NamespaceRewrite = Callable[[tuple[type, ...], dict[str, Any]], dict[str, Any]]


def wrap_module_creation(rewrite: NamespaceRewrite) -> Callable[[], None]:
    """Passes the namespace of every new Module class through `rewrite(bases,
    namespace)` before Equinox makes the class of it (the class body is known there,
    and its dataclass fields not yet made). Returns the function that undoes this."""
    original = vars(ModuleMeta)["__new__"]
    create = original.__func__

    def __new__(mcs: type, name: str, bases: tuple[type, ...], namespace, /, **kw):
        return create(mcs, name, bases, rewrite(bases, namespace), **kw)

    __new__.__wrapped__ = create  # pyright: ignore[reportFunctionMemberAccess]  # functools' convention
    ModuleMeta.__new__ = staticmethod(__new__)  # pyright: ignore[reportAttributeAccessIssue]  # a metaclass's __new__

    def undo() -> None:
        ModuleMeta.__new__ = original  # pyright: ignore[reportAttributeAccessIssue]  # a metaclass's __new__

    return undo


def unset_field(err: TypeError) -> str | None:
    """The field name if `err` is Equinox's error for a field `__init__` never set."""
    match = _UNSET_FIELD.fullmatch(str(err))
    return None if match is None else match[1]


# Equinox's own functions, kept before `route_surgery` replaces the public names.
original_tree_at: Callable[..., Any] = eqx.tree_at
original_inference_mode: Callable[..., Any] = _eqx_nn.inference_mode


def _route(
    name: str, function: Callable[..., Any], original: Callable[..., Any]
) -> None:
    """Makes `eqx.<name>` be `function`, which stands in for Equinox's `original`."""
    function.__wrapped__ = original  # pyright: ignore[reportFunctionMemberAccess]  # functools' convention
    setattr(eqx, name, function)


def route_surgery(
    tree_at: Callable[..., Any], inference_mode: Callable[..., Any]
) -> None:
    """Makes `eqx.tree_at`, `eqx.nn.inference_mode` and `eqx.tree_inference` these.

    Only the public names change, and one internal caller: `eqx.nn.Shared.__call__`
    puts the tied nodes back with `tree_at` into its `pytree`, which inside an
    AutoModule holds the placeholders as static values. Equinox's other internal
    callers keep their own imports (their targets are arrays or `StateIndex`es, always
    children), and a `from equinox import tree_at` run before autostatic was imported
    keeps Equinox's function.
    """
    _route("tree_at", tree_at, original_tree_at)
    _route("tree_inference", inference_mode, original_inference_mode)
    _eqx_shared.tree_at = tree_at  # pyright: ignore[reportPrivateImportUsage]  # verified at import
    _eqx_nn.inference_mode = inference_mode


original_filter: Callable[..., Any] = eqx.filter
original_partition: Callable[..., Any] = eqx.partition
original_combine: Callable[..., Any] = eqx.combine


def route_splice(
    filter: Callable[..., Any],  # Equinox's name
    partition: Callable[..., Any],
    combine: Callable[..., Any],
) -> None:
    """Makes `eqx.filter`, `eqx.partition` and `eqx.combine` these.

    Only the public names change: Equinox's own transforms (`filter_jit`,
    `filter_grad`, ...) keep the functions they imported, whose halves of an
    AutoModule have the module's own treedef, as their gradients need.
    """
    _route("filter", filter, original_filter)
    _route("partition", partition, original_partition)
    _route("combine", combine, original_combine)


original_tree_serialise_leaves: Callable[..., Any] = eqx.tree_serialise_leaves
original_tree_deserialise_leaves: Callable[..., Any] = eqx.tree_deserialise_leaves


def route_serialisation(
    serialise: Callable[..., Any], deserialise: Callable[..., Any]
) -> None:
    """Makes `eqx.tree_serialise_leaves` and `eqx.tree_deserialise_leaves` these."""
    _route("tree_serialise_leaves", serialise, original_tree_serialise_leaves)
    _route("tree_deserialise_leaves", deserialise, original_tree_deserialise_leaves)


def saved_by_tree_serialise_leaves(leaf: Any) -> bool:
    """Whether `eqx.tree_serialise_leaves` writes `leaf` with its default filter spec.

    `eqx.default_serialise_filter_spec` writes a blob for exactly the leaves that pass
    `eqx.is_array_like` (JAX and numpy arrays and scalars, Python bool/int/float/
    complex, objects with `__jax_array__`) and skips every other leaf; asking Equinox
    keeps `load_eqx` in step with the version that wrote the file.
    """
    return eqx.is_array_like(leaf)


class _PublicTraceState:
    """JAX's current trace read through its public function, for a JAX version
    without the private state below."""

    @property
    def value(self) -> Any:
        return find_top_trace(())


# JAX's current trace, read in C++ (`jax._src.core`, private to JAX): an unflatten
# of a node holding static numbers asks for it once, where the public
# `find_top_trace` costs three Python frames. Checked to agree with the public one.
trace_state: Any
try:
    from jax._src.core import trace_state_strong_ref as trace_state
except ImportError:  # pragma: no cover - another JAX version
    trace_state = _PublicTraceState()
if type(trace_state.value) is not type(find_top_trace(())):  # pragma: no cover
    trace_state = _PublicTraceState()


def _staging_trace() -> type:
    found: list[type] = []
    jax.make_jaxpr(lambda: found.append(type(trace_state.value)))()
    return found[0]


# The trace `jax.jit` traces a function's program in (JAX's `DynamicJaxprTrace`),
# found through the public `jax.make_jaxpr`.
STAGING_TRACE: Final = _staging_trace()


# Stops a flatten at every `eqx.Module` (and a carrier, whose `__class__` is its
# layer's), in C: no Python code runs while JAX walks the containers.
_stop_at_modules: Final = functools.partial(type.__instancecheck__, eqx.Module)


def _flatten_none_leaves_public(
    value: Any, stop_at_modules: bool = True
) -> tuple[list[Any], Any]:  # pragma: no cover
    if stop_at_modules:
        return jtu.tree_flatten(
            value, is_leaf=lambda x: x is None or _stop_at_modules(x)
        )
    return jtu.tree_flatten(value, is_leaf=lambda x: x is None)


def _flatten_none_leaves_in_c(
    value: Any, stop_at_modules: bool = True
) -> tuple[list[Any], Any]:
    return _none_leaf_flatten(value, _stop_at_modules if stop_at_modules else None)


# A flatten in which `None` is a leaf, stopping at modules, or (`stop_at_modules`
# false, for a value that holds none) with no predicate at all: JAX's registry of
# that kind (`jax._src.tree_util`, private to JAX) walks the containers in C, so that
# no other thread can change them halfway; its treedefs equal the public registry's.
# Checked against the public equivalent; falls back to it where missing.
flatten_none_leaves: Callable[..., tuple[list[Any], Any]]
try:
    from jax._src.tree_util import none_leaf_registry as _none_leaf_registry

    _none_leaf_flatten = _none_leaf_registry.flatten
    flatten_none_leaves = _flatten_none_leaves_in_c
    _probe = {"a": None, "b": [1, (eqx.nn.Identity(), None)]}
    if flatten_none_leaves(_probe) != _flatten_none_leaves_public(_probe):
        flatten_none_leaves = _flatten_none_leaves_public  # pragma: no cover
except ImportError:  # pragma: no cover - another JAX version
    flatten_none_leaves = _flatten_none_leaves_public
