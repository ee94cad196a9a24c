"""What is measured on the synthetic models. Each function returns its section of
`results.json` (`schema`), times in µs or ms.

- `tree_ops`: tree_flatten / tree_unflatten / tree_flatten_with_path / treedef `==`
  (plus model construction and unflatten-then-read-everything) and the per-call
  dispatch of an already-compiled cheap function, all cells of one model interleaved.
- `async_dispatch`: K steps of a device-heavy function with host work between them,
  blocking only at the end: how much host work each jit variant hides.
- `first_call`: trace + compile + run time of a fresh jitted function (the cheap
  dispatch function; the whole forward pass too in --full).

The training step is measured in `training`, retracing in `retracing`, the eqx.nn
models in `real_models`.

Every result is blocked with `block_until_ready`, so the numbers mean the same on
CPU, GPU and TPU (on an accelerator, jax.jit's asynchronous dispatch matters more).
"""

import dataclasses
import functools
import operator
import random
from collections.abc import Callable
from typing import Any, cast

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from . import forward as F, models as M
from .schema import (
    AsyncDispatch,
    AsyncVariant,
    describe_error,
    DispatchStat,
    Failed,
    FirstCall,
    FirstCallVariant,
    Ratio,
    Stat,
    TreeInfo,
    TreeOpsGroup,
)
from .settings import Settings
from .timing import (
    busy_wait,
    frozen_heap,
    paired_ratio,
    run_interleaved,
    scaled_summary,
    summary,
    timed_once,
)

US = 1e6
MS = 1e3


def block(x: Any) -> Any:
    """`x` once the device has computed it."""
    return jax.block_until_ready(x)


# --------------------------------------------------------------------------------------
# 1 + 2. Pytree operations and per-call dispatch.
# --------------------------------------------------------------------------------------

TREE_OPS: tuple[str, ...] = (
    "flatten",
    "unflatten",
    "flatten_with_path",
    "treedef_eq",
    "unflatten_read",
    "build",
)
# Building a 256-layer model takes ~30 ms, 100x a flatten: it is timed in a separate,
# shorter interleaved run so it does not eat the rounds of the others.
SLOW_OPS: tuple[str, ...] = ("build",)
# Reference implementations of the tree-op ratios (no jit involved: `eqx-static` is the
# fair twin's class, `eqx-filter` the eqx.Module users write without markers).
TREE_OP_REFS: tuple[str, ...] = ("eqx-static", "eqx-filter", "dict")
# Reference variants for dispatch ratios.
DISPATCH_REFS: tuple[tuple[str, str], ...] = (
    ("dict", M.JAX_JIT),
    ("eqx-static", M.JAX_JIT),
    ("eqx-static", M.FILTER_JIT),
    ("eqx-filter", M.FILTER_JIT),
)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    """A dataclass's field names, cached."""
    try:
        return _FIELD_NAMES[cls]
    except KeyError:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
        return names


def _read_everything(tree: Any) -> None:
    """Reads every array of a freshly unflattened tree through its attributes.

    `autostatic` unflattens lazily (attributes are filled on first access), so
    `tree_unflatten` alone flatters it; this op charges the deferred work.
    """
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
        elif dataclasses.is_dataclass(node):  # eqx / AutoModule / dataclass nodes
            stack.extend([getattr(node, name) for name in _field_names(type(node))])
        elif type(node) is M.PyNode:
            stack.extend(node.children)


Cells = dict[str, Callable[[], Any]]  # "<implementation or variant>|<op>" -> timed


def _build_all(
    model: M.Model, parts: Any
) -> tuple[dict[str, M.Built], dict[str, str], dict[str, Callable[[], M.Built]]]:
    """Every implementation of the model (and its Python-node floor, if it has one),
    why the others could not be built, and how to build each anew."""
    built: dict[str, M.Built] = {}
    failures: dict[str, str] = {}
    for impl in M.IMPLS:
        try:
            built[impl] = model.build(impl, parts)
        except Exception as err:
            failures[impl] = describe_error(err)
    rebuild = {impl: functools.partial(model.build, impl, parts) for impl in built}
    if model.python_node is not None:  # tree ops only: not a model implementation
        rebuild[M.PYNODE] = functools.partial(model.python_node, parts)
        built[M.PYNODE] = rebuild[M.PYNODE]()
    return built, failures, rebuild


def _make_tree_op_cells(
    built: dict[str, M.Built], rebuild: dict[str, Callable[[], M.Built]]
) -> tuple[Cells, dict[str, TreeInfo]]:
    """The tree-op cells of every implementation, and the shape of each pytree."""
    info: dict[str, TreeInfo] = {}
    cells: Cells = {}
    for impl, b in built.items():
        tree = b.tree
        leaves, treedef = jtu.tree_flatten(tree)
        equal_def = jtu.tree_structure(rebuild[impl]().tree)  # separately built, equal
        info[impl] = {
            "leaves": len(leaves),
            "array_leaves": sum(eqx.is_array(x) for x in leaves),
            "treedef_nodes": treedef.num_nodes,
            "treedefs_equal": bool(treedef == equal_def),
            "first_paths": [
                jtu.keystr(p) for p, _ in jtu.tree_flatten_with_path(tree)[0][:3]
            ],
        }
        cells[f"{impl}|flatten"] = functools.partial(jtu.tree_flatten, tree)
        cells[f"{impl}|unflatten"] = functools.partial(
            jtu.tree_unflatten, treedef, leaves
        )
        cells[f"{impl}|flatten_with_path"] = functools.partial(
            jtu.tree_flatten_with_path, tree
        )
        cells[f"{impl}|treedef_eq"] = functools.partial(operator.eq, treedef, equal_def)
        cells[f"{impl}|unflatten_read"] = lambda td=treedef, lv=leaves: (
            _read_everything(jtu.tree_unflatten(td, lv))
        )
        cells[f"{impl}|build"] = rebuild[impl]
    return cells, info


def _add_dispatch_cells(
    cells: Cells, model: M.Model, built: dict[str, M.Built], failures: dict[str, str]
) -> dict[str, str]:
    """Adds a dispatch cell per variant that compiles; returns why the others fail."""
    dispatch_fail: dict[str, str] = {}
    for impl, jit in M.VARIANTS:
        name = M.variant_name(impl, jit)
        if impl not in built:
            dispatch_fail[name] = failures[impl]
            continue
        b = built[impl]
        f = M.make_jitted(impl, jit, model.probe, b.cfg)
        try:
            block(f(b.tree))
        except Exception as err:
            dispatch_fail[name] = describe_error(err)
            continue
        cells[f"{name}|dispatch"] = lambda f=f, t=b.tree: f(t).block_until_ready()
    return dispatch_fail


def _is_slow(key: str) -> bool:
    """Whether a cell is one of the slow ops (`SLOW_OPS`)."""
    return key.split("|")[1] in SLOW_OPS


def _time_tree_cells(
    cells: Cells, settings: Settings, seed: int, budget_s: float | None
) -> dict[str, list[float]]:
    """Times the fast cells in one interleaved run and the slow ones (`SLOW_OPS`) in
    a shorter one of their own."""
    slow = {k: cells.pop(k) for k in list(cells) if _is_slow(k)}
    samples = run_interleaved(
        cells,
        settings.rounds,
        settings.target_batch_s,
        seed=seed,
        max_seconds=budget_s if budget_s is not None else settings.group_budget_s,
    )
    samples.update(
        run_interleaved(
            slow,
            max(3, settings.rounds // 5),
            settings.target_batch_s,
            seed=seed,
            min_rounds=3,
        )
    )
    return samples


def _summarise_tree_ops(
    samples: dict[str, list[float]], built: dict[str, M.Built]
) -> tuple[dict[str, dict[str, Stat]], dict[str, dict[str, dict[str, Ratio]]]]:
    """µs per implementation and op, and the paired ratios to each reference: the
    fair twin's class (static fields marked), the eqx.Module users write without
    markers, and the dict floor."""
    ops: dict[str, dict[str, Stat]] = {impl: {} for impl in built}
    ratios: dict[str, dict[str, dict[str, Ratio]]] = {ref: {} for ref in TREE_OP_REFS}
    for impl in built:
        for op in TREE_OPS:
            ops[impl][op] = scaled_summary(samples[f"{impl}|{op}"], US)
            for ref in ratios:
                if ref in built:
                    ratios[ref].setdefault(impl, {})[op] = paired_ratio(
                        samples[f"{impl}|{op}"], samples[f"{ref}|{op}"]
                    )
    return ops, ratios


def _summarise_dispatch(
    samples: dict[str, list[float]], dispatch_fail: dict[str, str]
) -> dict[str, DispatchStat | Failed]:
    """µs per call of every variant, with its paired ratios to `DISPATCH_REFS`."""
    dispatch: dict[str, DispatchStat | Failed] = {}
    for impl, jit in M.VARIANTS:
        name = M.variant_name(impl, jit)
        if name in dispatch_fail:
            dispatch[name] = {"fails": dispatch_fail[name]}
            continue
        entry: DispatchStat = {
            **scaled_summary(samples[f"{name}|dispatch"], US),
            "ratios": {
                M.variant_name(*ref): paired_ratio(
                    samples[f"{name}|dispatch"],
                    samples[f"{M.variant_name(*ref)}|dispatch"],
                )
                for ref in DISPATCH_REFS
                if f"{M.variant_name(*ref)}|dispatch" in samples
            },
        }
        dispatch[name] = entry
    return dispatch


def tree_ops(
    name: str,
    model: M.Model,
    parts: Any,
    settings: Settings,
    seed: int = 0,
    budget_s: float | None = None,
) -> TreeOpsGroup:
    """All tree-op and dispatch cells of one model, interleaved in one run."""
    built, failures, rebuild = _build_all(model, parts)
    cells, info = _make_tree_op_cells(built, rebuild)
    dispatch_fail = _add_dispatch_cells(cells, model, built, failures)
    samples = _time_tree_cells(cells, settings, seed, budget_s)
    ops, ratios = _summarise_tree_ops(samples, built)
    return {
        "model": name,
        "rounds": min(
            (len(v) for k, v in samples.items() if not _is_slow(k)), default=0
        ),
        "rounds_slow_ops": min(
            (len(v) for k, v in samples.items() if _is_slow(k)), default=0
        ),
        "unavailable": failures,
        "info": info,
        "ops_us": ops,
        "ratios": ratios,
        "dispatch_us": _summarise_dispatch(samples, dispatch_fail),
    }


# --------------------------------------------------------------------------------------
# 3. Asynchronous dispatch: is host work between steps hidden behind device work?
# --------------------------------------------------------------------------------------

ASYNC_VARIANTS: tuple[tuple[str, str], ...] = (
    ("autostatic", M.JAX_JIT),
    ("eqx-static", M.JAX_JIT),
    ("eqx-static", M.FILTER_JIT),
    ("eqx-filter", M.FILTER_JIT),
    ("dict", M.JAX_JIT),
)


# The references of the async wall-time ratios: the fair twin, and eqx.filter_jit on the
# static-marked and the unmarked eqx.Module.
ASYNC_REFS: tuple[tuple[str, str], ...] = (
    ("eqx-static", M.JAX_JIT),
    ("eqx-static", M.FILTER_JIT),
    ("eqx-filter", M.FILTER_JIT),
)
# Matmuls per step, unrolled: on a GPU every iteration of a loop returns to the host to
# test its condition, which serialised the steps (no variant hid any host work there).
ASYNC_MATMULS = 4


def _make_device_step() -> Callable[..., jax.Array]:
    """The device work of one step: `ASYNC_MATMULS` matmuls, reading the model once."""

    def heavy(m: Any, h: jax.Array, w: jax.Array) -> jax.Array:
        for _ in range(ASYNC_MATMULS):
            h = jnp.tanh(h @ w)
        return h + m.layers[0].bias.sum()

    return heavy


def _square_pair(n: int) -> tuple[jax.Array, jax.Array]:
    """`h0` and `w` of side `n`, on the device (`w` scaled to keep `h` bounded)."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((n, n)).astype(np.float32) / np.sqrt(n)
    h0 = rng.standard_normal((n, n)).astype(np.float32)
    return jax.device_put(h0), jax.device_put(w)


def _calibrate_matrix_side(arrays: Any, device_s: float) -> int:
    """The side of the square matrices that makes one step take about `device_s` on
    this device: doubled until a step takes half of it (the dispatch no longer
    dominates), then scaled by the cube root (a matmul's time grows as the side
    cubed), a multiple of 64."""
    ref = M.build_mlp("dict", arrays)
    f = M.make_jitted("dict", M.JAX_JIT, _make_device_step(), ref.cfg)

    def best(n: int) -> float:
        h0, w = _square_pair(n)
        block(f(ref.tree, h0, w))
        return min(timed_once(lambda: block(f(ref.tree, h0, w))) for _ in range(5))

    n, t = 64, best(64)
    while t < device_s / 2 and n < 8192:
        n *= 2
        t = best(n)
    scaled = n * (device_s / max(t, 1e-7)) ** (1 / 3)
    return int(min(16384, max(64, round(scaled / 64) * 64)))


def _make_async_cells(
    arrays: Any,
    heavy: Callable[..., jax.Array],
    h0: jax.Array,
    w: jax.Array,
    k: int,
    host_s: float,
) -> tuple[Cells, dict[str, str]]:
    """Per variant, `k` steps with host work between them and without; and the host
    work alone. Returns the cells and why the variants without any fail."""
    cells: Cells = {}
    fails: dict[str, str] = {}
    for impl, jit in ASYNC_VARIANTS:
        name = M.variant_name(impl, jit)
        try:
            b = M.build_mlp(impl, arrays)
            fn = M.make_jitted(impl, jit, heavy, b.cfg)
            block(fn(b.tree, h0, w))
        except Exception as err:
            fails[name] = describe_error(err)
            continue

        def loop(
            fn: Callable[..., jax.Array] = fn, tree: Any = b.tree, host: float = host_s
        ) -> None:
            h = h0
            for _ in range(k):
                h = fn(tree, h, w)
                if host:
                    busy_wait(host)
            h.block_until_ready()

        cells[f"{name}|host"] = loop
        cells[f"{name}|nohost"] = functools.partial(loop, host=0.0)
    cells["host only"] = lambda: [busy_wait(host_s) for _ in range(k)]
    return cells, fails


def _summarise_async_variant(
    name: str, samples: dict[str, list[float]], per_step: dict[str, Stat], k: int
) -> AsyncVariant:
    """One variant's wall time per step, the host work it hid, and its ratios."""
    host = per_step["host only"]["median"]
    wall = per_step[f"{name}|host"]["median"]
    alone = per_step[f"{name}|nohost"]["median"]
    # Hidden host work, paired per round like every ratio here: this variant's own
    # step time plus the host work, minus the wall time with both (same round).
    rounds = zip(
        samples[f"{name}|host"], samples[f"{name}|nohost"], samples["host only"]
    )
    hidden = [(a + h - w) / k for w, a, h in rounds]
    fraction = [
        x / min(a / k, h / k)
        for x, a, h in zip(hidden, samples[f"{name}|nohost"], samples["host only"])
        if min(a, h) > 0
    ]
    filter_static = M.variant_name("eqx-static", M.FILTER_JIT)
    return {
        "wall_ms_per_step": wall * MS,
        "wall_iqr_ms": [
            per_step[f"{name}|host"]["q1"] * MS,
            per_step[f"{name}|host"]["q3"] * MS,
        ],
        "no_host_ms_per_step": alone * MS,
        "serial_ms_per_step": (alone + host) * MS,
        "ideal_ms_per_step": max(alone, host) * MS,
        "hidden_ms_per_step": summary(hidden)["median"] * MS,
        "hidden_fraction": summary(fraction)["median"],
        "hidden_fraction_iqr": [summary(fraction)["q1"], summary(fraction)["q3"]],
        "wall vs eqx-static / eqx.filter_jit": (
            paired_ratio(samples[f"{name}|host"], samples[f"{filter_static}|host"])
            if f"{filter_static}|host" in samples
            else None
        ),
        # Wall time with host work vs each reference, paired per round (< 1 faster).
        "wall_ratios": {
            ref: paired_ratio(samples[f"{name}|host"], samples[f"{ref}|host"])
            for ref in (M.variant_name(*v) for v in ASYNC_REFS)
            if f"{ref}|host" in samples
        },
    }


def async_dispatch(arrays: Any, settings: Settings) -> AsyncDispatch:
    """K steps `h = f(model, h, w)` with `busy_wait(host)` between, blocked at the end.

    Ideal wall per step is max(device, host); fully serial is device + host. `jax.jit`
    returns before the device finishes, so the host work overlaps the device work;
    `eqx.filter_jit` blocks on every call (a marker output, for its runtime errors).
    On the CPU backend the "device" is the same cores as the host: the busy host loop
    takes a core away from XLA, so less is hidden than on an accelerator, and on a
    loaded machine the overlap can even come out negative.
    """
    side = _calibrate_matrix_side(arrays, settings.async_device_s)
    h0, w = _square_pair(side)
    k = settings.async_steps
    cells, fails = _make_async_cells(
        arrays, _make_device_step(), h0, w, k, settings.async_host_s
    )
    samples = run_interleaved(
        cells, settings.async_rounds, loops={c: 1 for c in cells}, seed=3
    )
    per_step = {c: summary([v / k for v in vals]) for c, vals in samples.items()}
    floor = f"{M.variant_name('dict', M.JAX_JIT)}|nohost"
    device = per_step[floor]["median"] if floor in per_step else float("nan")
    variants: dict[str, AsyncVariant | Failed] = {}
    for impl, jit in ASYNC_VARIANTS:
        name = M.variant_name(impl, jit)
        if name in fails:
            variants[name] = {"fails": fails[name]}
        else:
            variants[name] = _summarise_async_variant(name, samples, per_step, k)
    return {
        "depth": len(arrays),
        "steps": k,
        "rounds": settings.async_rounds,
        "matmuls": ASYNC_MATMULS,
        "matrix": [side, side],
        "host_ms_per_step": per_step["host only"]["median"] * MS,
        "device_ms_per_step": device * MS,
        "variants": variants,
    }


# --------------------------------------------------------------------------------------
# 4. Time to first call.
# --------------------------------------------------------------------------------------

FirstCallFn = Callable[[str, str, M.Built, jax.Array], Callable[[], Any]]


def _prepare_probe_call(
    impl: str, jit: str, b: M.Built, x: jax.Array
) -> Callable[[], Any]:
    """A first call of a new jitted copy of the dispatch benchmark's function."""
    f = M.make_jitted(impl, jit, lambda m: F.mlp_probe(m), b.cfg)
    return lambda: block(f(b.tree))


def _prepare_forward_call(
    impl: str, jit: str, b: M.Built, x: jax.Array
) -> Callable[[], Any]:
    """A first call of a new jitted copy of the whole MLP forward pass."""
    f = M.make_jitted(impl, jit, lambda m, v: F.mlp_apply(m, v), b.cfg)
    return lambda: block(f(b.tree, x))


# `first_call`'s `fn`: what a first call compiles and runs.
FIRST_CALL_FUNCTIONS: dict[str, FirstCallFn] = {
    "probe": _prepare_probe_call,
    "forward": _prepare_forward_call,
}


def _time_first_calls(
    fn: str,
    reps: int,
    arrays: Any,
    x: jax.Array,
    built: dict[str, M.Built],
    samples: dict[str, list[float]],
    fails: dict[str, str],
    rng: random.Random,
) -> None:
    """Times `reps` rounds of fresh functions, one per variant, in a shuffled order."""
    first_call_of = FIRST_CALL_FUNCTIONS[fn]
    for _ in range(reps):
        order = list(M.VARIANTS)
        rng.shuffle(order)
        for impl, jit in order:
            name = M.variant_name(impl, jit)
            if name in fails:
                continue
            try:
                if impl not in built:
                    built[impl] = M.build_mlp(impl, arrays)
                call = first_call_of(impl, jit, built[impl], x)
                samples.setdefault(name, []).append(timed_once(call))
            except Exception as err:
                fails[name] = describe_error(err)


# The references of the first-call ratios: the fair twin and both eqx.filter_jit ones.
FIRST_CALL_REFS: tuple[tuple[str, str], ...] = (
    ("eqx-static", M.JAX_JIT),
    ("eqx-static", M.FILTER_JIT),
    ("eqx-filter", M.FILTER_JIT),
)


def _summarise_first_call(
    vals: list[float], fair_twin: list[float] | None, refs: dict[str, list[float]]
) -> FirstCallVariant:
    """One variant's first-call ms, with its ratios paired per repetition (every
    variant once per repetition, shuffled)."""
    entry: dict[str, Any] = {
        **scaled_summary(vals, MS),
        "samples_ms": [round(v * MS, 2) for v in vals],
    }
    if fair_twin is not None:  # `ratios` repeats it; results.json has always had it
        entry["vs eqx-static / jax.jit"] = paired_ratio(vals, fair_twin)
    entry["ratios"] = {r: paired_ratio(vals, v) for r, v in refs.items()}
    return cast(FirstCallVariant, entry)


def first_call(
    n: int, arrays: Any, settings: Settings, fn: str = "probe", seed: int = 0
) -> FirstCall:
    """Trace + compile + first run of a fresh jitted function, ms per variant.

    `fn="probe"` is the cheap function of the dispatch benchmark, so what differs
    between implementations (flattening the arguments, making tracers, unflattening,
    the cache miss) is not drowned by compile-time noise; `fn="forward"` is the whole
    MLP forward pass (compilation dominates: ~1 s at N=256 on a CPU).
    Every repetition makes new function objects (no cache can hit); variants are
    interleaved in a shuffled order per repetition and ratios are paired per repetition.
    """
    reps = settings.ttfc_reps if fn == "probe" else settings.ttfc_forward_reps
    x = jnp.ones(M.MLP_INPUT_SHAPE)
    built: dict[str, M.Built] = {}
    samples: dict[str, list[float]] = {}
    fails: dict[str, str] = {}
    rng = random.Random(seed)
    with frozen_heap():
        _time_first_calls(fn, reps, arrays, x, built, samples, fails, rng)
    fair_twin = samples.get(M.variant_name("eqx-static", M.JAX_JIT))
    refs = {
        M.variant_name(*v): samples[M.variant_name(*v)]
        for v in FIRST_CALL_REFS
        if M.variant_name(*v) in samples
    }
    variants: dict[str, FirstCallVariant | Failed] = {}
    for impl, jit in M.VARIANTS:
        name = M.variant_name(impl, jit)
        if name in fails:
            variants[name] = {"fails": fails[name]}
            continue
        variants[name] = _summarise_first_call(samples[name], fair_twin, refs)
    return {"n": n, "fn": fn, "reps": reps, "variants": variants}
