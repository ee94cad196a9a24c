"""What is measured. Each function returns plain JSON-ready dicts (times in µs or ms).

- `tree_ops`: tree_flatten / tree_unflatten / tree_flatten_with_path / treedef `==`
  (plus model construction and unflatten-then-read-everything) and the per-call
  dispatch of an already-compiled cheap function, all cells of one model interleaved.
- `async_dispatch`: K steps of a device-heavy function with host work between them,
  blocking only at the end: how much host work each jit variant hides.
- `retracing`: trace counts over scripted scenarios, fresh jitted function each, and
  the contrasts (`CONTRASTS`): small modules where eqx.Module and AutoModule retrace
  differently, in both directions.
- `first_call`: trace + compile + run time of a fresh jitted function (the cheap
  dispatch function; the whole forward pass too in --full).
- `training`: steps/s of a forward + grad + optax adam step.

Every result is blocked with `block_until_ready`, so the numbers mean the same on
CPU, GPU and TPU (on an accelerator, jax.jit's asynchronous dispatch matters more).
"""

import dataclasses
import functools
import operator
import random
import re
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from . import models as M
from .timing import (
    busy_wait,
    frozen_heap,
    paired_ratio,
    run_interleaved,
    summary,
    timed_once,
)

US = 1e6
MS = 1e3


@dataclasses.dataclass(frozen=True)
class Settings:
    """How much of everything one mode measures."""

    mode: str
    sizes: tuple[int, ...]
    rounds: int  # rounds of the interleaved tree-op / dispatch groups
    target_batch_s: float
    group_budget_s: (
        float | None
    )  # wall budget of one interleaved group (after 5 rounds)
    target_group_budget_s: float | None  # the same for the MLP the targets are read on
    retrace_repeats: int  # the "x20" of the retracing scenarios
    contrast_calls: int  # calls per scenario of the retracing contrasts (`CONTRASTS`)
    adam_steps: int
    ttfc_reps: (
        int  # fresh functions per variant for time to first call (cheap function)
    )
    ttfc_forward_reps: (
        int  # the same for the whole forward pass (0: skipped; ~1 s at N=256)
    )
    train_sizes: tuple[int, ...]  # MLP depths trained
    train_transformer: bool
    train_steps: int  # steps per timed batch
    train_rounds: int
    train_budget_s: float | None
    async_steps: int
    async_rounds: int
    async_host_s: float  # host work between two steps
    async_device_s: float  # aimed device time of one step


_JAX_NON_ARRAY = re.compile(r"of type <class '([^']+)'>.* at path (\S+?)\.?$")


def _error(err: BaseException) -> str:
    """One line: the exception type and the first line of its message, shortened."""
    lines = str(err).strip().splitlines()
    first = lines[0] if lines else ""
    found = _JAX_NON_ARRAY.search(first)
    if found and "abstract array" in first:  # jax.jit given a non-array leaf
        kind = found[1].rsplit(".", 1)[-1]
        first = f"jax.jit: non-array leaf of type {kind} at path {found[2]}"
    first = re.sub(r" at 0x[0-9a-f]+", "", first)
    return f"{type(err).__name__}: {first[:240]}"


def _stats_us(values: list[float]) -> dict[str, float]:
    s = summary(values)
    return {k: (v * US if k != "n" else v) for k, v in s.items()}


def _block(x: Any) -> Any:
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


def tree_ops(
    model: str,
    family: M.Family,
    arrays: Any,
    settings: Settings,
    seed: int = 0,
    budget_s: float | None = None,
) -> dict[str, Any]:
    """All tree-op and dispatch cells of one model, interleaved in one run."""
    built: dict[str, M.Built] = {}
    failures: dict[str, str] = {}
    for impl in M.IMPLS:
        try:
            built[impl] = family.build(impl, arrays)
        except Exception as err:
            failures[impl] = _error(err)
    # Tree ops only: the floor of a node whose flatten/unflatten run in Python.
    rebuild = {impl: functools.partial(family.build, impl, arrays) for impl in built}
    if family.name == "mlp":
        rebuild[M.PYNODE] = functools.partial(M.build_pynode_mlp, arrays)
        built[M.PYNODE] = rebuild[M.PYNODE]()
    info: dict[str, Any] = {}
    cells: dict[str, Callable[[], Any]] = {}
    for impl, b in built.items():
        tree = b.tree
        leaves, treedef = jtu.tree_flatten(tree)
        twin = rebuild[impl]()  # separately built, equal
        twin_def = jtu.tree_structure(twin.tree)
        info[impl] = {
            "leaves": len(leaves),
            "array_leaves": sum(eqx.is_array(x) for x in leaves),
            "treedef_nodes": treedef.num_nodes,
            "treedefs_equal": bool(treedef == twin_def),
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
        cells[f"{impl}|treedef_eq"] = functools.partial(operator.eq, treedef, twin_def)
        cells[f"{impl}|unflatten_read"] = lambda td=treedef, lv=leaves: (
            _read_everything(jtu.tree_unflatten(td, lv))
        )
        cells[f"{impl}|build"] = rebuild[impl]

    dispatch_fail: dict[str, str] = {}
    for impl, jit in M.VARIANTS:
        name = M.variant_name(impl, jit)
        if impl not in built:
            dispatch_fail[name] = failures[impl]
            continue
        b = built[impl]
        f = M.make_jitted(impl, jit, family.probe, b.cfg)
        try:
            _block(f(b.tree))
        except Exception as err:
            dispatch_fail[name] = _error(err)
            continue
        cells[f"{name}|dispatch"] = lambda f=f, t=b.tree: f(t).block_until_ready()

    slow = {k: cells.pop(k) for k in list(cells) if k.split("|")[1] in SLOW_OPS}
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

    ops: dict[str, dict[str, Any]] = {impl: {} for impl in built}
    # References of the paired ratios: the fair twin's class (static fields marked), the
    # eqx.Module users write without markers, and the dict floor.
    ratios: dict[str, dict[str, dict[str, Any]]] = {ref: {} for ref in TREE_OP_REFS}
    for impl in built:
        for op in TREE_OPS:
            ops[impl][op] = _stats_us(samples[f"{impl}|{op}"])
            for ref in ratios:
                if ref in built:
                    ratios[ref].setdefault(impl, {})[op] = paired_ratio(
                        samples[f"{impl}|{op}"], samples[f"{ref}|{op}"]
                    )
    dispatch: dict[str, Any] = {}
    for impl, jit in M.VARIANTS:
        name = M.variant_name(impl, jit)
        if name in dispatch_fail:
            dispatch[name] = {"fails": dispatch_fail[name]}
            continue
        entry: dict[str, Any] = dict(_stats_us(samples[f"{name}|dispatch"]))
        entry["ratios"] = {
            M.variant_name(*ref): paired_ratio(
                samples[f"{name}|dispatch"], samples[f"{M.variant_name(*ref)}|dispatch"]
            )
            for ref in DISPATCH_REFS
            if f"{M.variant_name(*ref)}|dispatch" in samples
        }
        dispatch[name] = entry
    return {
        "model": model,
        "rounds": min(
            (len(v) for k, v in samples.items() if k.split("|")[1] not in SLOW_OPS),
            default=0,
        ),
        "rounds_slow_ops": min(
            (len(v) for k, v in samples.items() if k.split("|")[1] in SLOW_OPS),
            default=0,
        ),
        "unavailable": failures,
        "info": info,
        "ops_us": ops,
        "ratios": ratios,
        "dispatch_us": dispatch,
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


def _heavy(depth: int) -> Callable[..., jax.Array]:
    # A fori_loop, not an unrolled chain: compiling stays cheap whatever the depth.
    def heavy(m: Any, h: jax.Array, w: jax.Array) -> jax.Array:
        h = jax.lax.fori_loop(0, depth, lambda i, h: jnp.tanh(h @ w), h)
        return h + m.layers[0].bias.sum()

    return heavy


def async_dispatch(arrays: Any, settings: Settings) -> dict[str, Any]:
    """K steps `h = f(model, h, w)` with `busy_wait(host)` between, blocked at the end.

    Ideal wall per step is max(device, host); fully serial is device + host. `jax.jit`
    returns before the device finishes, so the host work overlaps the device work;
    `eqx.filter_jit` blocks on every call (a marker output, for its runtime errors).
    On the CPU backend the "device" is the same cores as the host: the busy host loop
    takes a core away from XLA, so less is hidden than on an accelerator, and on a
    loaded machine the overlap can even come out negative.
    """
    dim = 256
    rng = np.random.default_rng(1)
    w = jax.device_put(
        rng.standard_normal((dim, dim)).astype(np.float32) / np.sqrt(dim)
    )
    h0 = jax.device_put(rng.standard_normal((dim, dim)).astype(np.float32))
    ref = M.build_mlp("dict", arrays)

    # Calibrate the loop so one step takes about `async_device_s` on this device: the
    # time of one iteration is the difference between two depths (dispatch cancels).
    def best(depth: int) -> float:
        f = M.make_jitted("dict", M.JAX_JIT, _heavy(depth), ref.cfg)
        _block(f(ref.tree, h0, w))
        return min(timed_once(lambda: _block(f(ref.tree, h0, w))) for _ in range(5))

    per_iter = max(1e-7, (best(16) - best(4)) / 12)
    depth = int(min(10_000, max(1, round(settings.async_device_s / per_iter))))
    heavy = _heavy(depth)

    k = settings.async_steps
    host_s = settings.async_host_s
    cells: dict[str, Callable[[], Any]] = {}
    fails: dict[str, str] = {}
    for impl, jit in ASYNC_VARIANTS:
        name = M.variant_name(impl, jit)
        try:
            b = M.build_mlp(impl, arrays)
            fn = M.make_jitted(impl, jit, heavy, b.cfg)
            _block(fn(b.tree, h0, w))
        except Exception as err:
            fails[name] = _error(err)
            continue

        def loop(fn=fn, tree=b.tree, host: float = host_s) -> None:
            h = h0
            for _ in range(k):
                h = fn(tree, h, w)
                if host:
                    busy_wait(host)
            h.block_until_ready()

        cells[f"{name}|host"] = loop
        cells[f"{name}|nohost"] = functools.partial(loop, host=0.0)
    cells["host only"] = lambda: [busy_wait(host_s) for _ in range(k)]
    samples = run_interleaved(
        cells, settings.async_rounds, loops={c: 1 for c in cells}, seed=3
    )
    per_step = {c: summary([v / k for v in vals]) for c, vals in samples.items()}
    ref_name = M.variant_name("eqx-static", M.FILTER_JIT)
    host = per_step["host only"]["median"]
    dict_name = M.variant_name("dict", M.JAX_JIT)
    device = per_step.get(f"{dict_name}|nohost", {"median": float("nan")})["median"]
    variants: dict[str, Any] = {}
    for impl, jit in ASYNC_VARIANTS:
        name = M.variant_name(impl, jit)
        if name in fails:
            variants[name] = {"fails": fails[name]}
            continue
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
        variants[name] = {
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
            f"wall vs {ref_name}": (
                paired_ratio(samples[f"{name}|host"], samples[f"{ref_name}|host"])
                if f"{ref_name}|host" in samples
                else None
            ),
            # Wall time with host work vs each reference, paired per round (< 1 faster).
            "wall_ratios": {
                ref: paired_ratio(samples[f"{name}|host"], samples[f"{ref}|host"])
                for ref in (M.variant_name(*v) for v in ASYNC_REFS)
                if f"{ref}|host" in samples
            },
        }
    return {
        "depth": len(arrays),
        "steps": k,
        "rounds": settings.async_rounds,
        "loop_depth": depth,
        "matrix": [dim, dim],
        "host_ms_per_step": host * MS,
        "device_ms_per_step": device * MS,
        "variants": variants,
    }


# --------------------------------------------------------------------------------------
# 4. Retracing, and time to first call.
# --------------------------------------------------------------------------------------

# (name, description, ideal count as a function of the repeat count, static values equal)
SCENARIOS: tuple[tuple[str, str, Callable[[int], int], bool], ...] = (
    ("same", "same model x{r}", lambda r: 1, True),
    ("rebuilt", "rebuilt each call, equal hyperparameters x{r}", lambda r: 1, True),
    ("new_lambda", "rebuilt with a new but equal lambda x{r}", lambda r: r, False),
    ("list_of_ints", "list-of-ints attribute: 3x same + 3x rebuilt", lambda r: 1, True),
    ("tree_map", "model, then tree_map(lambda x: x*2, model)", lambda r: 1, True),
    ("float_hparam", "float hyperparameter 1.0, 2.0, 1.0, 2.0", lambda r: 2, False),
    ("adam", "optax adam training loop ({steps} steps)", lambda r: 1, True),
)


def make_train_step(
    family: M.Family,
    impl: str,
    jit: str,
    cfg: Any,
    opt: Any,
    on_trace: Callable[[], None] | None = None,
) -> tuple[Callable[..., Any], Callable[[Any], Any]]:
    """(step, init): `step(tree, opt_state, x, y, key) -> (tree, opt_state, loss)`.

    The `jax.jit` variants are written as plain JAX (`jax.value_and_grad`,
    `optax.apply_updates`); the `eqx.filter_jit` variants with the Equinox idiom
    (`eqx.filter_value_and_grad`, `eqx.filter`, `eqx.apply_updates`).
    """
    import optax

    def loss_fn(model: Any, x: jax.Array, y: jax.Array, key: Any) -> jax.Array:
        out = family.apply(model, x, key) if family.uses_key else family.apply(model, x)
        return jnp.mean((out - y) ** 2)

    if jit == M.JAX_JIT:

        def step(tree: Any, opt_state: Any, x: jax.Array, y: jax.Array, key: Any):
            if on_trace is not None:
                on_trace()

            def loss_of(t: Any) -> jax.Array:
                return loss_fn(M.merge(t, cfg) if impl == "dict" else t, x, y, key)

            loss, grads = jax.value_and_grad(loss_of)(tree)
            updates, opt_state = opt.update(grads, opt_state, tree)
            return optax.apply_updates(tree, updates), opt_state, loss

        return jax.jit(step), opt.init

    def filter_step(model: Any, opt_state: Any, x: jax.Array, y: jax.Array, key: Any):
        if on_trace is not None:
            on_trace()
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y, key)
        updates, opt_state = opt.update(
            grads, opt_state, eqx.filter(model, eqx.is_array)
        )
        return eqx.apply_updates(model, updates), opt_state, loss

    return eqx.filter_jit(filter_step), lambda m: opt.init(eqx.filter(m, eqx.is_array))


def _retrace_fn(m: Any, v: jax.Array) -> jax.Array:
    """What the retracing scenarios jit: it reads the first layer's activation and bias
    and the float `scale` (so a stale `scale` shows in the result). What retraces is
    decided by the whole input treedef, and a small function keeps the ~150
    compilations of this section cheap."""
    layer = m.layers[0]
    return m.scale * layer.activation(layer.bias + v)


# `autostatic` + `eqx.filter_jit` is left out here (it is not one of the compared
# variants, and every variant costs ~25 compilations).
RETRACE_VARIANTS: tuple[tuple[str, str], ...] = tuple(
    v for v in M.VARIANTS if v != ("autostatic", M.FILTER_JIT)
)


def _run_scenario(
    name: str, impl: str, jit: str, arrays: Any, repeats: int, adam_steps: int
) -> dict[str, Any]:
    import optax

    count = 0
    x = jnp.ones(M.MLP_WIDTH)

    def counted(m: Any, v: jax.Array) -> jax.Array:
        nonlocal count
        count += 1
        return _retrace_fn(m, v)

    def build(**hyper: Any) -> M.Built:
        return M.build_mlp(impl, arrays, **hyper)

    def call(b: M.Built) -> Any:
        return _block(f(b.tree, x))

    out: dict[str, Any] = {}
    try:
        first = (
            build(activation=lambda v: jax.nn.relu(v))
            if name == "new_lambda"
            else build()
        )
        f = M.make_jitted(impl, jit, counted, first.cfg)
        if name == "same":
            for _ in range(repeats):
                call(first)
        elif name == "rebuilt":
            call(first)
            for _ in range(repeats - 1):
                call(build())
        elif name == "new_lambda":
            call(first)
            for _ in range(repeats - 1):
                call(build(activation=lambda v: jax.nn.relu(v)))
        elif name == "list_of_ints":
            for _ in range(3):
                call(first)
            for _ in range(3):
                call(build())
        elif name == "tree_map":
            call(first)
            doubled = jtu.tree_map(lambda v: v * 2, first.tree)
            call(M.Built(impl, doubled, first.cfg))
        elif name == "float_hparam":
            stale = False
            for scale in (1.0, 2.0, 1.0, 2.0):
                b = first if scale == 1.0 else build(scale=scale)
                got = np.asarray(call(b))
                want = np.asarray(_retrace_fn(M.view(b), x))
                stale |= not np.allclose(got, want, rtol=1e-5, atol=1e-6)
            out["stale"] = stale
        elif name == "adam":
            count = 0

            def on_trace() -> None:
                nonlocal count
                count += 1

            # The loss reads only the first layer (like `counted`), to keep compiling cheap;
            # gradients and adam updates still cover every array of the model.
            family = dataclasses.replace(M.FAMILIES["mlp"], apply=_retrace_fn)
            step, init = make_train_step(
                family, impl, jit, first.cfg, optax.adam(1e-3), on_trace
            )
            tree, opt_state = first.tree, init(first.tree)
            y = jnp.zeros_like(x)
            loss: Any = None
            for _ in range(adam_steps):
                tree, opt_state, loss = step(tree, opt_state, x, y, None)
            _block(loss)
        else:
            raise ValueError(name)
    except Exception as err:
        out["error"] = _error(err)
    out["count"] = count
    return out


def retracing(arrays: Any, settings: Settings) -> dict[str, Any]:
    """Trace counts per (variant, scenario); the `dict` floor's counts are the reference."""
    r = settings.retrace_repeats
    scenarios = {
        name: {
            "description": desc.format(r=r, steps=settings.adam_steps),
            "ideal": ideal(r),
            "static_values_equal": equal,
        }
        for name, desc, ideal, equal in SCENARIOS
    }
    counts: dict[str, dict[str, Any]] = {}
    for impl, jit in RETRACE_VARIANTS:
        row = counts[M.variant_name(impl, jit)] = {}
        for name, *_ in SCENARIOS:
            row[name] = _run_scenario(name, impl, jit, arrays, r, settings.adam_steps)
    return {
        "depth": len(arrays),
        "repeats": r,
        "scenarios": scenarios,
        "counts": counts,
        "contrasts": retrace_contrasts(settings.contrast_calls),
    }


# Where eqx.Module and AutoModule retrace differently: small purpose-built modules, one
# scenario each, called `calls` times with a model rebuilt before every call.
CONTRAST_VARIANTS: tuple[tuple[str, str], ...] = (
    ("autostatic", M.JAX_JIT),
    ("eqx-static", M.JAX_JIT),  # the fair twin
    ("eqx-static", M.FILTER_JIT),
    ("eqx-filter", M.FILTER_JIT),  # what Equinox users run without markers
    ("eqx-filter", M.JAX_JIT),  # only works for models of arrays and numbers
)


@dataclasses.dataclass
class MutableConfig:
    """A plain `@dataclass` config object: compared by value, unhashable (eq=True and not
    frozen sets `__hash__ = None`)."""

    act: str = "tanh"
    k: int = 3


_MASK = np.array([1.0, 0.0, 1.0], np.float32)


@dataclasses.dataclass(frozen=True)
class Contrast:
    """One retracing scenario: a module with an array `w` and the fields `fields`
    (`eqx-static` marks `static` of them with `eqx.field(static=True)`), rebuilt before
    call `i` with the field values `values(i)`."""

    name: str
    description: str
    static: tuple[str, ...]
    values: Callable[[int], dict[str, Any]]
    apply: Callable[[Any, jax.Array], jax.Array]
    why: str

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(self.values(0))


CONTRASTS: tuple[Contrast, ...] = (
    Contrast(
        "numpy_scalar",
        "a float hyperparameter taken from a numpy schedule (`np.float64`), a new value "
        "each call; eqx-static marks the float field static",
        ("temperature",),
        lambda i: {"temperature": np.linspace(0.5, 1.0, 64)[i]},
        lambda m, x: m.w * x / m.temperature,
        "a numpy scalar is an array to AutoModule (dynamic); a static-marked field makes it "
        "a compile-time constant, so each new value retraces (Equinox warns)",
    ),
    Contrast(
        "array_marked_static",
        "a `jnp` scalar (a learned temperature) in a field marked `static=True` by "
        "mistake, a new value each call",
        ("temperature",),
        lambda i: {"temperature": jnp.asarray(0.5 + i / 64)},
        lambda m, x: m.w * x / m.temperature,
        "AutoModule never makes an array static; a static-marked array is a compile-time "
        "constant, so each new value retraces (Equinox warns)",
    ),
    Contrast(
        "numpy_constant_static",
        "a numpy mask marked static (a constant kept out of the gradients), the model "
        "rebuilt each call with an equal copy",
        ("mask",),
        lambda i: {"mask": _MASK.copy()},
        lambda m, x: m.w * x * m.mask,
        "AutoModule makes a numpy array dynamic; eqx compares the static arrays with `==` "
        "(ambiguous truth value)",
    ),
    Contrast(
        "mutable_config",
        "a plain (not frozen) `@dataclass` config object, rebuilt equal each call",
        ("config",),
        lambda i: {"config": MutableConfig()},
        lambda m, x: m.w * x * m.config.k,
        "eqx.filter_jit hashes every non-array leaf (the config is unhashable); "
        "AutoModule and jax.jit compare static values with `==`",
    ),
    Contrast(
        "list_then_tuple",
        "int sizes given as a list, then as a tuple (read from a config), alternating",
        ("sizes",),
        lambda i: {"sizes": [3, 3] if i % 2 == 0 else (3, 3)},
        lambda m, x: m.w * x * m.sizes[0],
        "`[3, 3] != (3, 3)` everywhere: a static list and tuple differ, and so do the "
        "list and tuple pytree nodes",
    ),
    Contrast(
        "new_partial",
        "activation `functools.partial(jax.nn.leaky_relu, negative_slope=0.1)` made "
        "anew at each rebuild",
        ("activation",),
        lambda i: {
            "activation": functools.partial(jax.nn.leaky_relu, negative_slope=0.1)
        },
        lambda m, x: m.activation(m.w * x),
        "partials compare by identity: a new one is a new static value for every "
        "variant (plain jax.jit cannot take it as a leaf)",
    ),
    Contrast(
        "jnp_scalar",
        "the hyperparameter stored as a `jnp` scalar, a new value each call (the remedy "
        "for the float rows below)",
        (),
        lambda i: {"temperature": jnp.asarray(0.5 + i / 64)},
        lambda m, x: m.w * x / m.temperature,
        "an array is dynamic everywhere: one trace",
    ),
    Contrast(
        "float_unmarked",
        "a Python float hyperparameter, a new value each call; eqx-static leaves it "
        "unmarked (a value that changes is not static)",
        (),
        lambda i: {"temperature": 0.5 + i / 64},
        lambda m, x: m.w * x / m.temperature,
        "a Python float is static in AutoModule and under eqx.filter_jit; plain jax.jit "
        "makes an unmarked float leaf a tracer",
    ),
    Contrast(
        "float_list_unmarked",
        "a list of Python float loss weights, changed each call; eqx-static leaves it "
        "unmarked",
        (),
        lambda i: {"weights": [0.5 + i / 64, 0.25]},
        lambda m, x: m.w * x * m.weights[0] + m.weights[1],
        "as above, for every float in the list",
    ),
    Contrast(
        "int_step_unmarked",
        "a Python int step counter, incremented each call; eqx-static leaves it unmarked",
        (),
        lambda i: {"step": i},
        lambda m, x: m.w * x * (1.0 + m.step),
        "as above: an int is static in AutoModule; plain jax.jit makes it an int32 "
        "tracer",
    ),
)


def _contrast_classes(c: Contrast) -> dict[str, type]:
    """The scenario's module in each implementation: same fields, same order."""
    annotations = {f: Any for f in ("w",) + c.fields}

    def namespace(**extra: Any) -> dict[str, Any]:
        return {
            "__module__": __name__,
            "__qualname__": f"Contrast_{c.name}",
            "__annotations__": dict(annotations),
            **extra,
        }

    classes = {
        "eqx-static": type(
            f"Contrast_{c.name}",
            (eqx.Module,),
            namespace(**{f: eqx.field(static=True) for f in c.static}),
        ),
        "eqx-filter": type(f"Contrast_{c.name}", (eqx.Module,), namespace()),
    }
    if M.asx is not None:
        classes["autostatic"] = type(
            f"Contrast_{c.name}", (M.asx.AutoModule,), namespace()
        )
    return classes


def _contrast_run(
    c: Contrast, cls: type | None, jit: str, calls: int
) -> dict[str, Any]:
    """Traces of a fresh jitted `c.apply` over `calls` rebuilt models, counted by a
    Python side effect at trace time; a result that differs from the eager one is
    `stale` (the changed value was ignored)."""
    count = 0

    def counted(m: Any, x: jax.Array) -> jax.Array:
        nonlocal count
        count += 1
        return c.apply(m, x)

    f = jax.jit(counted) if jit == M.JAX_JIT else eqx.filter_jit(counted)
    x = jnp.arange(1.0, 4.0)
    w = jnp.full(3, 0.5)
    out: dict[str, Any] = {"stale": False}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if cls is None:
                raise RuntimeError(f"autostatic is unavailable ({M.AUTOSTATIC_ERROR})")
            for i in range(calls):
                m = cls(w=w, **c.values(i))
                got = np.asarray(_block(f(m, x)))
                want = np.asarray(c.apply(m, x))
                out["stale"] |= not np.allclose(got, want, rtol=1e-5, atol=1e-6)
        except Exception as err:
            out["error"] = _error(err)
    out["count"] = count
    messages = dict.fromkeys(str(w.message).splitlines()[0][:120] for w in caught)
    if messages:
        out["warnings"] = list(messages)
    return out


def retrace_contrasts(calls: int) -> dict[str, Any]:
    """Trace counts per (scenario, variant) of `CONTRASTS`."""
    scenarios: dict[str, Any] = {}
    for c in CONTRASTS:
        classes = _contrast_classes(c)
        counts = {
            M.variant_name(impl, jit): _contrast_run(c, classes.get(impl), jit, calls)
            for impl, jit in CONTRAST_VARIANTS
        }
        scenarios[c.name] = {
            "description": c.description,
            "why": c.why,
            "eqx_static_fields": list(c.static),
            "counts": counts,
        }
    return {
        "calls": calls,
        "variants": [M.variant_name(*v) for v in CONTRAST_VARIANTS],
        "scenarios": scenarios,
    }


def _first_calls(
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
                b = built[impl]
                if fn == "probe":
                    f = M.make_jitted(impl, jit, lambda m: M.mlp_probe(m), b.cfg)
                    samples.setdefault(name, []).append(
                        timed_once(lambda f=f, b=b: _block(f(b.tree)))
                    )
                else:
                    f = M.make_jitted(impl, jit, lambda m, v: M.mlp_apply(m, v), b.cfg)
                    samples.setdefault(name, []).append(
                        timed_once(lambda f=f, b=b: _block(f(b.tree, x)))
                    )
            except Exception as err:
                fails[name] = _error(err)


# The references of the first-call ratios: the fair twin and both eqx.filter_jit ones.
FIRST_CALL_REFS: tuple[tuple[str, str], ...] = (
    ("eqx-static", M.JAX_JIT),
    ("eqx-static", M.FILTER_JIT),
    ("eqx-filter", M.FILTER_JIT),
)


def first_call(
    n: int, arrays: Any, settings: Settings, fn: str = "probe", seed: int = 0
) -> dict[str, Any]:
    """Trace + compile + first run of a fresh jitted function, ms per variant.

    `fn="probe"` is the cheap function of the dispatch benchmark, so what differs
    between implementations (flattening the arguments, making tracers, unflattening,
    the cache miss) is not drowned by compile-time noise; `fn="forward"` is the whole
    MLP forward pass (compilation dominates: ~1 s at N=256 on a CPU).
    Every repetition makes new function objects (no cache can hit); variants are
    interleaved in a shuffled order per repetition and ratios are paired per repetition.
    """
    reps = settings.ttfc_reps if fn == "probe" else settings.ttfc_forward_reps
    x = jnp.ones(M.FAMILIES["mlp"].input_shape)
    built: dict[str, M.Built] = {}
    samples: dict[str, list[float]] = {}
    fails: dict[str, str] = {}
    rng = random.Random(seed)
    with frozen_heap():
        _first_calls(fn, reps, arrays, x, built, samples, fails, rng)
    out: dict[str, Any] = {"n": n, "fn": fn, "reps": reps, "variants": {}}
    ref = samples.get(M.variant_name("eqx-static", M.JAX_JIT))
    refs = {
        M.variant_name(*v): samples[M.variant_name(*v)]
        for v in FIRST_CALL_REFS
        if M.variant_name(*v) in samples
    }
    for impl, jit in M.VARIANTS:
        name = M.variant_name(impl, jit)
        if name in fails:
            out["variants"][name] = {"fails": fails[name]}
            continue
        vals = samples[name]
        entry: dict[str, Any] = {
            k: (v * MS if k != "n" else v) for k, v in summary(vals).items()
        }
        entry["samples_ms"] = [round(v * MS, 2) for v in vals]
        if ref is not None:
            entry["vs eqx-static / jax.jit"] = paired_ratio(vals, ref)
        # Paired per repetition (every variant once per repetition, shuffled).
        entry["ratios"] = {r: paired_ratio(vals, v) for r, v in refs.items()}
        out["variants"][name] = entry
    return out


# --------------------------------------------------------------------------------------
# 5. Training-step throughput.
# --------------------------------------------------------------------------------------

TRAIN_VARIANTS: tuple[tuple[str, str], ...] = (
    ("autostatic", M.JAX_JIT),
    ("eqx-static", M.JAX_JIT),
    ("eqx-static", M.FILTER_JIT),
    ("eqx-filter", M.FILTER_JIT),
    ("dict", M.JAX_JIT),
)
# The fair twin (same step code, plain jax.jit), what Equinox users run (eqx.filter_jit
# with the Equinox idiom, static fields marked or not), and the dict floor.
TRAIN_REFS: tuple[tuple[str, str], ...] = (
    ("eqx-static", M.JAX_JIT),
    ("eqx-static", M.FILTER_JIT),
    ("eqx-filter", M.FILTER_JIT),
    ("dict", M.JAX_JIT),
)


def training(
    model: str, family: M.Family, arrays: Any, settings: Settings
) -> dict[str, Any]:
    """Steps/s of `step` in a loop that blocks only every `train_steps` steps."""
    import optax

    opt = optax.adam(1e-3)
    x = jax.device_put(
        np.random.default_rng(2).standard_normal(family.input_shape).astype(np.float32)
    )
    key = jax.random.key(0) if family.uses_key else None
    cells: dict[str, Callable[[], Any]] = {}
    fails: dict[str, str] = {}
    compile_s: dict[str, float] = {}
    s = settings.train_steps
    for impl, jit in TRAIN_VARIANTS:
        name = M.variant_name(impl, jit)
        try:
            b = family.build(impl, arrays)
            y = jnp.zeros_like(x)  # every family maps x to the same shape
            step, init = make_train_step(family, impl, jit, b.cfg, opt)
            state = [b.tree, init(b.tree)]
            start = time.perf_counter()
            _block(step(state[0], state[1], x, y, key))
            compile_s[name] = time.perf_counter() - start
        except Exception as err:
            fails[name] = _error(err)
            traceback.print_exc()
            continue

        def run(step=step, state=state, y=y) -> None:
            tree, opt_state = state
            loss: Any = None
            for _ in range(s):
                tree, opt_state, loss = step(tree, opt_state, x, y, key)
            _block((tree, opt_state, loss))
            state[0], state[1] = tree, opt_state

        cells[name] = run
    samples = run_interleaved(
        cells,
        settings.train_rounds,
        loops={c: 1 for c in cells},
        seed=5,
        min_rounds=3,
        max_seconds=settings.train_budget_s,
    )
    out: dict[str, Any] = {"model": model, "steps_per_batch": s, "variants": {}}
    for impl, jit in TRAIN_VARIANTS:
        name = M.variant_name(impl, jit)
        if name in fails:
            out["variants"][name] = {"fails": fails[name]}
            continue
        per_step = [v / s for v in samples[name]]
        st = summary(per_step)
        entry: dict[str, Any] = {
            "ms_per_step": st["median"] * MS,
            "ms_iqr": [st["q1"] * MS, st["q3"] * MS],
            "steps_per_s": 1.0 / st["median"],
            "rounds": st["n"],
            "first_call_s": compile_s[name],
            "throughput_ratios": {},
        }
        for ref in TRAIN_REFS:
            rname = M.variant_name(*ref)
            if rname in samples:
                # Throughput ratio = reference time / this time (>1 = more steps/s).
                entry["throughput_ratios"][rname] = paired_ratio(
                    samples[rname], samples[name]
                )
        out["variants"][name] = entry
    return out
