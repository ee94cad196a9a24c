"""Shared by the tests: the same models written as AutoModule and as eqx.Module for
side-by-side checks, hypothesis strategies for random nests, and small utilities."""

import random
import tracemalloc
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

import autostatic as asx


def needs_devices(n: int) -> pytest.MarkDecorator:
    """Skips a test on fewer than `n` devices (conftest.py asks XLA for 8 host
    devices, which a user's own XLA_FLAGS may override)."""
    return pytest.mark.skipif(
        len(jax.devices()) < n,
        reason=f"needs {n} devices: XLA_FLAGS=--xla_force_host_platform_device_count=8",
    )


class AutoLayer(asx.AutoModule):
    weight: jax.Array
    bias: jax.Array
    activation: Callable
    width: int
    sizes: list

    def __init__(self, width: int, key: jax.Array, activation: Callable = jax.nn.relu):
        self.weight = jax.random.normal(key, (width, width))
        self.bias = jnp.zeros(width)
        self.activation = activation
        self.width = width
        self.sizes = [width, width]

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.activation(self.weight @ x + self.bias)


class EqxLayer(eqx.Module):
    weight: jax.Array
    bias: jax.Array
    activation: Callable = eqx.field(static=True)
    width: int = eqx.field(static=True)
    sizes: tuple = eqx.field(static=True)

    def __init__(self, width: int, key: jax.Array, activation: Callable = jax.nn.relu):
        self.weight = jax.random.normal(key, (width, width))
        self.bias = jnp.zeros(width)
        self.activation = activation
        self.width = width
        self.sizes = (width, width)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.activation(self.weight @ x + self.bias)


class AutoMLP(asx.AutoModule):
    layers: list
    scale: float

    def __init__(self, depth: int, width: int, key: jax.Array, scale: float = 1.0):
        self.layers = []
        for k in jax.random.split(key, depth):
            self.layers.append(AutoLayer(width, k))
        self.scale = scale

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = layer(x)
        return self.scale * x


class EqxMLP(eqx.Module):
    layers: list
    scale: float = eqx.field(static=True)

    def __init__(self, depth: int, width: int, key: jax.Array, scale: float = 1.0):
        self.layers = []
        for k in jax.random.split(key, depth):
            self.layers.append(EqxLayer(width, k))
        self.scale = scale

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = layer(x)
        return self.scale * x


class AutoMixed(asx.AutoModule):
    """The mixed container of the issue, plus foreign Equinox layers."""

    stuff: list
    seq: eqx.nn.Sequential
    blocks: dict

    def __init__(self, key: jax.Array):
        k1, k2, _k3 = jax.random.split(key, 3)
        self.stuff = [
            eqx.nn.Linear(3, 3, key=k1),
            jax.nn.relu,
            3,
            {"w": jnp.ones(3), "tag": "x"},
            None,
        ]
        self.seq = eqx.nn.Sequential(
            [eqx.nn.Linear(3, 3, key=k2), eqx.nn.Lambda(jax.nn.gelu)]
        )
        self.blocks = {"b": jnp.arange(3.0), "a": [jnp.zeros(2), "name"]}


class EqxMixed(eqx.Module):
    stuff: list
    seq: eqx.nn.Sequential
    blocks: dict

    __init__ = AutoMixed.__init__


def keystrs(tree: Any) -> list[str]:
    return [
        jax.tree_util.keystr(p)
        for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]
    ]


def array_keystrs(tree: Any) -> list[str]:
    return [
        jax.tree_util.keystr(p)
        for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
        if eqx.is_array(leaf)
    ]


class TraceCounter:
    """Wraps a function for jax.jit and counts how often it is traced."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.count = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.count += 1
        return self.fn(*args, **kwargs)


# Random nests of arrays, non-arrays, containers and modules, built twice: as
# AutoModules and as the eqx.Module twins.
class Box(asx.AutoModule):
    value: Any
    other: Any


class EqxBox(eqx.Module):
    value: Any
    other: Any


_FUNCTIONS = [jax.nn.relu, jnp.tanh, len, None]

leaf_descs = st.one_of(
    st.tuples(st.just("jax"), st.integers(0, 2), st.integers(-3, 3)),
    st.tuples(st.just("numpy"), st.integers(0, 2), st.integers(-3, 3)),
    st.tuples(
        st.just("lit"),
        st.one_of(
            st.integers(-5, 5),
            st.floats(-2, 2, allow_nan=False),
            st.text("abc", max_size=3),
            st.booleans(),
            st.sampled_from(_FUNCTIONS),
        ),
    ),
)


def container_descs(children: st.SearchStrategy) -> list[st.SearchStrategy]:
    """Descriptions of lists, tuples and dicts of `children` (see `build`)."""
    return [
        st.tuples(st.just("list"), st.lists(children, max_size=3)),
        st.tuples(st.just("tuple"), st.lists(children, max_size=3)),
        st.tuples(
            st.just("dict"),
            st.dictionaries(
                st.text("xyz", min_size=1, max_size=2), children, max_size=3
            ),
        ),
    ]


descs = st.recursive(
    leaf_descs,
    lambda children: st.one_of(
        *container_descs(children), st.tuples(st.just("module"), children, children)
    ),
    max_leaves=10,
)


def build(desc: tuple, auto: bool) -> Any:
    kind = desc[0]
    if kind == "jax":
        return jnp.full((2,) * desc[1], desc[2], jnp.float32)
    if kind == "numpy":
        return np.full((3,) * desc[1], desc[2], np.int32)
    if kind == "lit":
        return desc[1]
    if kind == "list":
        return [build(d, auto) for d in desc[1]]
    if kind == "tuple":
        return tuple(build(d, auto) for d in desc[1])
    if kind == "dict":
        return {k: build(d, auto) for k, d in desc[1].items()}
    box = Box if auto else EqxBox
    return box(build(desc[1], auto), build(desc[2], auto))


def assert_same_arrays(a: Any, b: Any) -> None:
    """The array leaves of `a` and `b` have the same key paths, dtypes, shapes and
    bytes (what a checkpoint round trip must preserve)."""

    def by_key(tree: Any) -> dict[str, Any]:
        return {
            jax.tree_util.keystr(p): leaf
            for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
            if eqx.is_array(leaf)
        }

    la, lb = by_key(a), by_key(b)
    assert la.keys() == lb.keys()
    for key in la:
        x, y = np.asarray(la[key]), np.asarray(lb[key])
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert x.tobytes() == y.tobytes(), key


def fuzz_loads(
    load_bytes: Callable[[bytes], Any],
    data: bytes,
    template: Any,
    mutate: Callable[[bytes, random.Random], bytes],
    cases: int,
) -> dict[str, int]:
    """Loads `cases` seeded mutations of the valid file `data`: each must raise
    CheckpointError or load the template's shapes and dtypes (flipped data bytes
    load as changed values: there is no checksum), without allocating much more than
    the file. Returns how many were refused and loaded."""
    want = [(x.shape, x.dtype) for x in jax.tree_util.tree_leaves(template)]
    rng = random.Random(0)
    outcomes = {"refused": 0, "loaded": 0}
    tracemalloc.start()
    try:
        for case in range(cases):
            mutated = mutate(data, rng)
            tracemalloc.reset_peak()
            before, _ = tracemalloc.get_traced_memory()
            try:
                out = load_bytes(mutated)
            except asx.CheckpointError:
                outcomes["refused"] += 1
            else:
                outcomes["loaded"] += 1
                got = [(x.shape, x.dtype) for x in jax.tree_util.tree_leaves(out)]
                assert got == want, case
            _, peak = tracemalloc.get_traced_memory()
            assert peak - before < 2 * len(data) + 2**16, (case, peak - before)
            out = None
    finally:
        tracemalloc.stop()
    return outcomes
