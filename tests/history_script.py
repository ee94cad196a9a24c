"""Builds a fixed set of models in the order given on the command line and prints,
as JSON, what JAX sees of them: which models have equal treedefs (and equal treedef
hashes), and how many times a jitted function traced for each class when called with
that class's models in one fixed order. `tests/test_history.py` runs it in fresh
interpreters with the models met in different orders: what it prints must not
depend on the order."""

import json
import math
import sys
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import autostatic as asx


class Cast(asx.AutoModule):
    dtype: Any
    w: jax.Array


class Scaled(asx.AutoModule):
    scale: Any
    w: jax.Array


class Holder(asx.AutoModule):
    items: Any
    w: jax.Array


class Block(asx.AutoModule):
    layers: list


_W = jnp.ones(2)
_LINEAR = eqx.nn.Linear(2, 2, key=jax.random.key(0))

MODELS: dict[str, Callable[[], Any]] = {
    "cast np.float32": lambda: Cast(np.float32, _W),
    "cast jnp.float32": lambda: Cast(jnp.float32, _W),
    "cast np.dtype": lambda: Cast(np.dtype("float32"), _W),
    "cast int": lambda: Cast(int, _W),
    "cast float": lambda: Cast(float, _W),
    "cast str": lambda: Cast("float32", _W),
    "scaled 1": lambda: Scaled(1, _W),
    "scaled 1.0": lambda: Scaled(1.0, _W),
    "scaled True": lambda: Scaled(True, _W),
    "scaled 0.0": lambda: Scaled(0.0, _W),
    "scaled -0.0": lambda: Scaled(-0.0, _W),
    "scaled nan": lambda: Scaled(math.nan, _W),
    "holder [1, 2]": lambda: Holder([1, 2], _W),
    "holder [1.0, 2]": lambda: Holder([1.0, 2], _W),
    "holder (1, 2)": lambda: Holder((1, 2), _W),
    "holder [relu, 1]": lambda: Holder([jax.nn.relu, 1], _W),
    "holder [int, w]": lambda: Holder([int, _W], _W),
    "holder [np.float32, w]": lambda: Holder([np.float32, _W], _W),
    "holder [jnp.float32, w]": lambda: Holder([jnp.float32, _W], _W),
    "holder {dtype: np.float32, w}": lambda: Holder({"d": np.float32, "w": _W}, _W),
    "holder {dtype: jnp.float32, w}": lambda: Holder({"d": jnp.float32, "w": _W}, _W),
    "holder {w, 0.0}": lambda: Holder({"w": _W, "s": 0.0}, _W),
    "holder {w, -0.0}": lambda: Holder({"w": _W, "s": -0.0}, _W),
    "block [linear, relu]": lambda: Block([_LINEAR, jax.nn.relu]),
    "block [linear, np.float32]": lambda: Block([_LINEAR, np.float32]),
    "block [linear, jnp.float32]": lambda: Block([_LINEAR, jnp.float32]),
    "block [linear, int]": lambda: Block([_LINEAR, int]),
}


def main(order: list[str]) -> None:
    built = {name: MODELS[name]() for name in order}
    treedefs = {name: jax.tree_util.tree_structure(m) for name, m in built.items()}
    names = sorted(built)
    equal = {
        a: [b for b in names if b != a and treedefs[a] == treedefs[b]] for a in names
    }
    equal_hashes = {
        a: [b for b in names if b != a and hash(treedefs[a]) == hash(treedefs[b])]
        for a in names
    }
    traces: dict[str, int] = {}
    for cls in (Cast, Scaled, Holder, Block):
        count = [0]

        def step(m: Any, count: list[int] = count) -> Any:
            count[0] += 1
            return jax.tree_util.tree_leaves(m)[0] * 2

        jitted = jax.jit(step)
        for name in names:
            if type(built[name]) is cls:
                jitted(built[name])
        traces[cls.__name__] = count[0]
    print(json.dumps({"equal": equal, "equal hashes": equal_hashes, "traces": traces}))


if __name__ == "__main__":
    main(sys.argv[1].split("|"))
