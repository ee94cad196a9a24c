"""The differential mutation fuzz: the same random model built on `AutoModule` and on
`eqx.Module` (the oracle), changed in place at random depths (lists and dicts inside
containers, inside nested modules, before and after `jax.jit` returned the model) and
by `eqx.tree_at` at any leaf of the twin (an array, or a value static in ours), and
after every step compared on what JAX and Equinox see.

`tests/test_mutations.py` runs it under pytest with a few hundred examples;
`python -m tests.mutation_fuzz N` runs N examples and prints the disagreements;
`--thread` runs examples in a second thread beside them, `--seed S` in another
order, `--processes K` in K processes at once, each with its own seed.
"""

import argparse
import functools
import io
import random
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

import autostatic as asx


class ASub(asx.AutoModule):
    params: Any
    items: Any


class ATop(asx.AutoModule):
    a: Any
    b: Any


class ESub(eqx.Module):
    params: Any
    items: Any


class ETop(eqx.Module):
    a: Any
    b: Any


_LINEAR = eqx.nn.Linear(2, 2, key=jax.random.key(0))
_DROPOUT = eqx.nn.Dropout(0.5)


class Nothing(NamedTuple):
    """A namedtuple without fields, as optax's `MaskedNode`: a node of the tree."""


_STATICS = [3, -1, 0.5, True, "tag", None, jax.nn.relu, jnp.tanh, (2, 3), Nothing()]
_counter = [0]


def _array() -> jax.Array:
    # Distinct values, so that a leaf moved to another place is seen.
    _counter[0] += 1
    return jnp.full((2,), float(_counter[0]))


def descriptions(depth: int = 3) -> st.SearchStrategy[Any]:
    """A value as a nested description: leaves ("array",), ("static", i),
    ("layer", name), and nodes ("list" | "tuple" | "dict" | "module", parts)."""
    leaf = st.one_of(
        st.just(("array",)),
        st.tuples(st.just("static"), st.integers(0, len(_STATICS) - 1)),
        st.tuples(st.just("layer"), st.sampled_from(["linear", "dropout"])),
    )
    if depth == 0:
        return leaf
    inner = descriptions(depth - 1)
    module = st.tuples(st.just("module"), st.tuples(inner, inner))
    return st.one_of(
        leaf,
        module,  # twice as likely: every disagreement of the old core had one
        st.tuples(st.just("list"), st.lists(inner, max_size=3)),
        st.tuples(st.just("tuple"), st.lists(inner, max_size=3)),
        st.tuples(
            st.just("dict"),
            st.dictionaries(st.sampled_from("wxyz"), inner, max_size=3),
        ),
        st.tuples(st.just("module"), st.tuples(inner, inner)),
    )


def build(desc: Any, auto: bool) -> Any:
    """The value `desc` describes, with AutoModules (`auto`) or eqx.Modules. Arrays
    and layers made once per description node and shared by both builds."""
    kind = desc[0]
    if kind == "array":
        return desc[1] if len(desc) > 1 else _array()
    if kind == "static":
        return _STATICS[desc[1]]
    if kind == "layer":
        return _LINEAR if desc[1] == "linear" else _DROPOUT
    if kind in ("list", "tuple"):
        items = [build(d, auto) for d in desc[1]]
        return items if kind == "list" else tuple(items)
    if kind == "dict":
        return {k: build(d, auto) for k, d in desc[1].items()}
    params, items = (build(d, auto) for d in desc[1])
    return (ASub if auto else ESub)(params, items)


def with_arrays(desc: Any) -> Any:
    """`desc` with each ("array",) made into ("array", value): both builds share it."""
    kind = desc[0]
    if kind == "array":
        return ("array", _array())
    if kind in ("list", "tuple"):
        return (kind, [with_arrays(d) for d in desc[1]])
    if kind == "dict":
        return (kind, {k: with_arrays(d) for k, d in desc[1].items()})
    if kind == "module":
        return (kind, tuple(with_arrays(d) for d in desc[1]))
    return desc


# --------------------------------------------------------------------------------
# Comparing the two.
# --------------------------------------------------------------------------------


def same(ours: Any, twin: Any, where: str = "") -> None:
    """Raises AssertionError naming `where` unless the two values are the same: the
    same containers, equal arrays, the same static values, modules of the twin
    classes with the same fields."""
    if isinstance(twin, eqx.Module) and type(twin) in (ESub, ETop):
        assert type(ours).__name__[1:] == type(twin).__name__[1:], where
        for field in ("params", "items") if type(twin) is ESub else ("a", "b"):
            same(getattr(ours, field), getattr(twin, field), f"{where}.{field}")
        return
    assert type(ours) is type(twin), f"{where}: {type(ours)} != {type(twin)}"
    if isinstance(twin, (list, tuple)):
        assert len(ours) == len(twin), where
        for i, (a, b) in enumerate(zip(ours, twin)):
            same(a, b, f"{where}[{i}]")
    elif isinstance(twin, dict):
        assert list(ours) == list(twin), where
        for k in twin:
            same(ours[k], twin[k], f"{where}[{k!r}]")
    elif eqx.is_array(twin):
        np.testing.assert_array_equal(ours, twin, err_msg=where)
    elif isinstance(twin, eqx.Module):  # a layer
        assert eqx.tree_equal(ours, twin), where
    else:
        assert ours is twin or ours == twin, where


def array_leaves(tree: Any) -> list[tuple[str, Any]]:
    return [
        (jax.tree_util.keystr(path), leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
        if eqx.is_array(leaf)
    ]


def same_leaves(ours: Any, twin: Any) -> None:
    """Our leaves are arrays, and with their key paths they are the twin's arrays;
    the nodes without leaves are where the twin has them."""
    mine = jax.tree_util.tree_flatten_with_path(ours)[0]
    assert all(eqx.is_array(x) for _, x in mine), [type(x) for _, x in mine]
    expected = array_leaves(twin)
    assert [p for p, _ in array_leaves(ours)] == [p for p, _ in expected]
    for (path, a), (_, b) in zip(array_leaves(ours), expected):
        np.testing.assert_array_equal(a, b, err_msg=path)
    assert nothing_paths(ours) == nothing_paths(twin)


def nothing_paths(tree: Any) -> list[str]:
    is_nothing = lambda x: type(x) is Nothing
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_nothing)[0]
    return [jax.tree_util.keystr(p) for p, x in flat if is_nothing(x)]


def weighted_sum(tree: Any) -> jax.Array:
    """Each array leaf's sum weighted by its place: a result that tells the leaves and
    their order."""
    leaves = [x for x in jax.tree_util.tree_leaves(tree) if eqx.is_array(x)]
    return sum(((i + 1.0) * jnp.sum(x) for i, x in enumerate(leaves)), jnp.zeros(()))


def _identity(tree: Any) -> Any:
    return tree


def check_transforms(ours: Any, twin: Any) -> None:
    """`jax.jit`, `jax.grad`, unflatten, `eqx.partition`/`combine`, `eqx.filter_jit`,
    `eqx.tree_serialise_leaves` and `autostatic.save`/`load` see what Equinox sees."""
    np.testing.assert_allclose(
        jax.jit(weighted_sum)(ours), eqx.filter_jit(weighted_sum)(twin), rtol=1e-6
    )
    same_leaves(jax.grad(weighted_sum)(ours), eqx.filter_grad(weighted_sum)(twin))
    unflattened = (
        jax.tree_util.tree_unflatten(treedef, leaves)
        for leaves, treedef in map(jax.tree_util.tree_flatten, (ours, twin))
    )
    same(*unflattened, "unflattened")
    same(
        eqx.combine(*eqx.partition(ours, eqx.is_array)),
        eqx.combine(*eqx.partition(twin, eqx.is_array)),
        "combined",
    )
    # Equinox's own route: partitioned by `tree_map` inside the trace, combined
    # outside with `None` taken for a leaf.
    same(eqx.filter_jit(_identity)(ours), eqx.filter_jit(_identity)(twin), "filter_jit")
    mine, theirs = io.BytesIO(), io.BytesIO()
    eqx.tree_serialise_leaves(mine, ours)
    eqx.tree_serialise_leaves(theirs, twin)
    assert mine.getvalue() == theirs.getvalue(), "eqx.tree_serialise_leaves bytes"
    mine.seek(0)
    theirs.seek(0)
    same(
        eqx.tree_deserialise_leaves(mine, ours),
        eqx.tree_deserialise_leaves(theirs, twin),
        "eqx deserialised",
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m.safetensors"
        asx.save(path, ours)
        loaded = asx.load(path, jax.tree_util.tree_map(jnp.zeros_like, ours))
    same(loaded, jax.tree_util.tree_map(lambda x: x, twin), "autostatic.load")


# --------------------------------------------------------------------------------
# Changes in place.
# --------------------------------------------------------------------------------


def containers(tree: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The paths of every list and dict reachable in `tree` (through containers and
    module fields): where a change in place can happen."""
    found = []
    if isinstance(tree, (ASub, ATop, ESub, ETop)):
        fields = ("params", "items") if isinstance(tree, (ASub, ESub)) else ("a", "b")
        for f in fields:
            found += containers(getattr(tree, f), (*path, ("attr", f)))
    elif isinstance(tree, (list, tuple)):
        if type(tree) is list:
            found.append(path)
        for i, x in enumerate(tree):
            found += containers(x, (*path, ("item", i)))
    elif isinstance(tree, dict):
        found.append(path)
        for k, x in tree.items():
            found += containers(x, (*path, ("item", k)))
    return found


def at(tree: Any, path: tuple[Any, ...]) -> Any:
    for how, key in path:
        tree = getattr(tree, key) if how == "attr" else tree[key]
    return tree


def change(ours: Any, twin: Any, op: str, key: Any, desc: Any) -> None:
    """Applies one change in place to the list or dict `ours` and `twin`, `desc` the
    value put in (built for each side, its arrays and layers shared)."""
    new_ours, new_twin = build(desc, True), build(desc, False)
    for target, new in ((ours, new_ours), (twin, new_twin)):
        if isinstance(target, list):
            i = key % (len(target) + 1)
            if op == "append":
                target.append(new)
            elif op == "insert":
                target.insert(i, new)
            elif op == "pop" and target:
                target.pop(i % len(target))
            elif op == "set" and target:
                target[i % len(target)] = new
            elif op == "clear":
                target.clear()
        else:
            k = "wxyz"[key % 4]
            if op in ("append", "insert", "set"):
                target[k] = new
            elif op == "pop":
                target.pop(k, None)
            elif op == "clear":
                target.clear()


def at_key_path(path: tuple[Any, ...], tree: Any) -> Any:
    """The node or leaf at a JAX key path of `tree`, read as a `where` reads it."""
    for key in path:
        if isinstance(key, jax.tree_util.GetAttrKey):
            tree = getattr(tree, key.name)
        else:
            tree = tree[
                key.idx if isinstance(key, jax.tree_util.SequenceKey) else key.key
            ]
    return tree


def replace_leaf(ours: Any, twin: Any, index: int, new: Any) -> tuple[Any, Any]:
    """`eqx.tree_at` on both, at the twin's leaf `index` (an array, or a value that
    is static in ours), replacing it by `new` (a new array where one was)."""
    path, leaf = jax.tree_util.tree_flatten_with_path(twin)[0][index]
    if eqx.is_array(leaf) and new is None:
        new = _array()
    where = functools.partial(at_key_path, path)
    return eqx.tree_at(where, ours, new), eqx.tree_at(where, twin, new)


OPS = ("append", "insert", "pop", "set", "clear", "jit", "tree_map", "tree_at")


class Draws:
    """Where an example's choices come from: a hypothesis `data` object (`draw`), or
    a `random.Random` (for a second thread, which hypothesis does not serve)."""

    def __init__(self, source: Any):
        self.source = source

    def integer(self, low: int, high: int) -> int:
        if isinstance(self.source, random.Random):
            return self.source.randint(low, high)
        return self.source.draw(st.integers(low, high))

    def choice(self, options: Any) -> Any:
        if isinstance(self.source, random.Random):
            return self.source.choice(list(options))
        return self.source.draw(st.sampled_from(options))

    def description(self, depth: int = 3) -> Any:
        if isinstance(self.source, random.Random):
            return _random_description(self.source, depth)
        return self.source.draw(descriptions(depth))


def _random_description(rng: random.Random, depth: int) -> Any:
    """What `descriptions(depth)` draws, drawn by `rng`."""
    kinds = ["leaf"] if depth == 0 else ["leaf", "module", "list", "tuple", "dict"]
    kind = rng.choice(kinds + (["module"] if depth else []))
    if kind == "leaf":
        leaf = rng.randrange(3)
        if leaf == 0:
            return ("array",)
        if leaf == 1:
            return ("static", rng.randrange(len(_STATICS)))
        return ("layer", rng.choice(["linear", "dropout"]))
    if kind == "module":
        inner = (_random_description(rng, depth - 1) for _ in range(2))
        return ("module", tuple(inner))
    items = [_random_description(rng, depth - 1) for _ in range(rng.randrange(4))]
    if kind == "dict":
        return ("dict", dict(zip(rng.sample("wxyz", len(items)), items)))
    return (kind, items)


def run_example(data: Any) -> None:
    """One example: a model drawn, then a few steps, each compared (a hypothesis
    `data` object, anything with `draw`, or a `random.Random`)."""
    draws = Draws(data)
    desc = ("module", (draws.description(), draws.description()))
    desc = with_arrays(desc)
    a, b = (build(d, True) for d in desc[1])
    ours = ATop(a, b)
    c, d = (build(d, False) for d in desc[1])
    twin = ETop(c, d)
    same(ours, twin, "built")
    same_leaves(ours, twin)
    for _ in range(draws.integer(1, 8)):
        op = draws.choice(OPS)
        if op == "jit":
            ours = jax.jit(lambda m: m)(ours)
            twin = eqx.filter_jit(lambda m: m)(twin)
        elif op == "tree_map":
            ours = jax.tree_util.tree_map(lambda x: x, ours)
            twin = jax.tree_util.tree_map(lambda x: x, twin)
        elif op == "tree_at":
            count = len(jax.tree_util.tree_leaves(twin))
            if not count:
                continue
            index = draws.integer(0, count - 1)
            new = draws.choice([None, 7, "other", "array"])
            new = _array() if new == "array" else new
            ours, twin = replace_leaf(ours, twin, index, new)
        else:
            paths = containers(ours)
            if not paths:
                continue
            path = paths[draws.integer(0, len(paths) - 1)]
            key = draws.integer(0, 7)
            value = with_arrays(draws.description(2))
            change(at(ours, path), at(twin, path), op, key, value)
        same(ours, twin, f"after {op}")
        same_leaves(ours, twin)
    check_transforms(ours, twin)


class Beside:
    """A second thread running examples of its own (drawn by `random`) while the
    main one runs its: the classes' caches, plans and generated code are shared,
    changed from both. Its first failure is kept and raised by `stop`."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.done = threading.Event()
        self.failure: BaseException | None = None
        self.examples = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            try:
                run_example(self.rng)
            except BaseException as err:
                self.failure = err
                return
            self.examples += 1

    def stop(self) -> int:
        self.done.set()
        self.thread.join()
        if self.failure is not None:
            raise AssertionError("the second thread's example failed") from (
                self.failure
            )
        return self.examples


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.mutation_fuzz",
        description="The differential mutation fuzz: N examples, each compared "
        "with the eqx.Module twin after every step.",
    )
    parser.add_argument("n", type=int, nargs="?", default=1000)
    parser.add_argument("--seed", type=int, help="hypothesis's seed: another order")
    parser.add_argument(
        "--thread", action="store_true", help="a second thread runs examples beside"
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="run N examples split over this many processes, each with its own "
        "seed (so its own order of classes met), at once",
    )
    args = parser.parse_args(argv)
    if args.processes > 1:
        _in_processes(args)
        return
    from hypothesis import given, HealthCheck, seed, settings

    @settings(
        max_examples=args.n,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(st.data())
    def fuzz(data: Any) -> None:
        run_example(data)

    if args.seed is not None:
        fuzz = seed(args.seed)(fuzz)
    beside = Beside(args.seed or 0) if args.thread else None
    try:
        fuzz()
    finally:
        extra = beside.stop() if beside is not None else 0
    also = f" (and {extra} in a second thread)" if beside is not None else ""
    print(f"{args.n} examples{also}: no disagreement")


def _in_processes(args: argparse.Namespace) -> None:
    share = -(-args.n // args.processes)
    command = [sys.executable, "-m", "tests.mutation_fuzz", str(share)]
    command += ["--thread"] if args.thread else []
    runs = [
        subprocess.Popen([*command, "--seed", str((args.seed or 0) + i)])
        for i in range(args.processes)
    ]
    failed = [run.args for run in runs if run.wait() != 0]
    if failed:
        raise SystemExit(f"disagreements in: {failed}")
    print(
        f"{share * args.processes} examples in {args.processes} processes, "
        "each its own order: no disagreement"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
