"""Construction: what building, tracing and compiling cost with AutoModule.

AutoModule decides its partition when a model is built, so building is where it pays;
these three steps measure that cost where users meet it:

- `builds`: every cell interleaved in one `run_interleaved` run, ratios paired per
  round. `wrap_layers` puts 256 made `eqx.nn.Linear(8, 8)` in the list field of a
  `Holder(layers=[...])` (dataclass init; a new list each call, so nothing built
  before can be reused), `wrap_arrays` puts scalar arrays (made once, outside the
  timing) in an `Arrays(xs=[...])`, both against the floor
  `jax.tree_util.tree_leaves` of the same list and with the eqx.Module of the same
  fields beside (no markers: both lists hold arrays). `build_init` builds the
  transformer of `real_models` from scratch, its layers made by their constructors
  from keys (blocked on before they are wrapped), against the fair twin: the layers'
  random initialisation is part of the time, as when a user builds a model.
- `trace`: `jax.jit(f).trace(*args)` of the eqx.nn transformer's forward pass and of a
  training step (loss, `jax.grad`, an optax adam update), a new function object every
  repetition so that no trace is cached; variants interleaved in a shuffled order per
  repetition (after one untimed repetition), ratios paired per repetition. Plain
  `jax.jit` refuses the fair twin (`eqx.nn.MLP` holds its activation function as a
  field), so the fair twin is traced by Equinox's route: `eqx.partition` once,
  `jax.jit` over the arrays with the static half closed over.
- `ecosystem`: `benchmarks/ecosystem_trace.py` (trace + compile of a diffrax solve and
  an optimistix root find) in processes with the stock libraries and with them rebased
  onto AutoModule (`python -m autostatic.rebased`), alternated; one ratio per adjacent
  pair of processes, so the comparison is not paired within a process. A rebased
  process whose classes are not AutoModules (or a stock one whose are) fails the step.
"""

import functools
import json
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from . import models as M, real_models as R
from .processes import child_environment, child_platform
from .schema import (
    ConstructionBuilds,
    describe_error,
    EcosystemProcess,
    EcosystemTrace,
    EcosystemWorkload,
    Failed,
    Ratio,
    Spread,
    Stat,
    TraceTimes,
)
from .settings import Settings
from .timing import (
    frozen_heap,
    paired_ratio,
    run_interleaved,
    scaled_summary,
    timed_once,
)

US, MS = 1e6, 1e3
LAYERS = 256
FLOOR = "tree_leaves"
HOLDER = R.define_classes("Holder", "layers")
ARRAYS = R.define_classes("Arrays", "xs")
BUILD_OPS: dict[str, str] = {
    "wrap_layers": f"wrap {LAYERS} made Linear(8, 8) in a list field",
    "wrap_arrays": "wrap scalar arrays in a list field",
    "build_init": "build the transformer with its layers' init",
}
BUILD_IMPLS: dict[str, str] = {
    "autostatic": "AutoModule, bare annotations",
    "eqx-static": "the fair twin: eqx.Module, non-array fields static",
    "eqx-filter": "eqx.Module, no markers (the holders' lists hold arrays: nothing "
    "to mark)",
    FLOOR: "the floor: `jax.tree_util.tree_leaves` of the same list",
}
# Each op's reference: autostatic's (and the others') ratios are to it.
BUILD_REFS: dict[str, str] = {
    "wrap_layers": FLOOR,
    "wrap_arrays": FLOOR,
    "build_init": "eqx-static",
}


# --------------------------------------------------------------------------------------
# Building.
# --------------------------------------------------------------------------------------


def make_layers(key: jax.Array, blocks: int) -> list[dict[str, Any]]:
    """The transformer's layers, one dict per block, each made by its constructor
    from a key (as `real_models.transformer_layers` makes its templates), computed."""
    layers = []
    for k in jax.random.split(key, blocks):
        k_attn, k_mlp = jax.random.split(k)
        layers.append(
            {
                "attn": eqx.nn.MultiheadAttention(
                    num_heads=2, query_size=16, key=k_attn
                ),
                "ln1": eqx.nn.LayerNorm(16),
                "ln2": eqx.nn.LayerNorm(16),
                "mlp": eqx.nn.MLP(16, 16, 32, 1, key=k_mlp),
                "dropout": eqx.nn.Dropout(0.1),
            }
        )
    # Eager ops return before their results exist: the time includes computing them.
    return jax.block_until_ready(layers)


def build_with_init(impl: str, key: jax.Array, blocks: int) -> Any:
    """The `real_models` transformer in one implementation, built from scratch."""
    return R.build_transformer(impl, make_layers(key, blocks))


def _build_cells(settings: Settings) -> dict[str, Callable[[], Any]]:
    """Every build cell, keyed `"<op>|<impl>"`."""
    layers = R.linear_layers(0)
    xs = [jnp.zeros(()) for _ in range(settings.construction_arrays)]
    key, blocks = jax.random.key(0), settings.construction_blocks
    cells: dict[str, Callable[[], Any]] = {
        f"wrap_layers|{FLOOR}": lambda: jtu.tree_leaves(layers),
        f"wrap_arrays|{FLOOR}": lambda: jtu.tree_leaves(xs),
    }
    for impl in ("autostatic", "eqx-filter"):
        cells[f"wrap_layers|{impl}"] = lambda c=HOLDER[impl]: c(layers=[*layers])
        cells[f"wrap_arrays|{impl}"] = lambda c=ARRAYS[impl]: c(xs=[*xs])
    for impl in ("autostatic", "eqx-static"):
        cells[f"build_init|{impl}"] = lambda i=impl: build_with_init(i, key, blocks)
    return cells


def _summarise_builds(
    samples: dict[str, list[float]],
) -> tuple[dict[str, dict[str, Stat | Failed]], dict[str, dict[str, Ratio]]]:
    """µs per op and implementation; every implementation's paired ratio to its op's
    reference, and autostatic's to eqx.Module where both ran."""
    ops_us: dict[str, dict[str, Stat | Failed]] = {}
    ratios: dict[str, dict[str, Ratio]] = {}
    for op, ref in BUILD_REFS.items():
        ops_us[op], ratios[op] = {}, {}
        mine = {k.split("|")[1]: v for k, v in samples.items() if k.split("|")[0] == op}
        for impl, values in mine.items():
            ops_us[op][impl] = scaled_summary(values, US)
            if impl != ref:
                ratios[op][f"{impl} / {ref}"] = paired_ratio(values, mine[ref])
        if ref == FLOOR:
            ratios[op]["autostatic / eqx-filter"] = paired_ratio(
                mine["autostatic"], mine["eqx-filter"]
            )
    return ops_us, ratios


def builds(settings: Settings, seed: int = 0) -> ConstructionBuilds:
    """The `builds` part: every build cell interleaved in one run."""
    if M.asx is None:
        raise RuntimeError(f"autostatic is unavailable ({M.AUTOSTATIC_ERROR})")
    cells = _build_cells(settings)
    samples = run_interleaved(
        cells,
        settings.construction_rounds,
        settings.target_batch_s,
        seed=seed,
        min_rounds=min(5, settings.construction_rounds),
    )
    ops_us, ratios = _summarise_builds(samples)
    ops = dict(BUILD_OPS)
    ops["wrap_arrays"] = (
        f"wrap {settings.construction_arrays} scalar arrays in a list field"
    )
    ops["build_init"] = (
        f"build the {settings.construction_blocks}-block transformer with its "
        "layers' init"
    )
    return {
        "rounds": min(len(v) for v in samples.values()),
        "layers": LAYERS,
        "arrays": settings.construction_arrays,
        "blocks": settings.construction_blocks,
        "ops": ops,
        "impls": dict(BUILD_IMPLS),
        "ops_us": ops_us,
        "ratios": ratios,
        "note": (
            "`wrap_*` pass a new list each call (`Holder(layers=[*layers])`), the "
            "floor flattens the same list; `build_init` makes every layer by its "
            "constructor from a key (eager random init, blocked on) and builds the "
            "blocks and the model around them"
        ),
    }


# --------------------------------------------------------------------------------------
# Tracing.
# --------------------------------------------------------------------------------------

TRACE_FNS: dict[str, str] = {
    "forward": "the forward pass (pre-norm blocks: attention, layer norms, MLP, "
    "dropout)",
    "train_step": "a training step: MSE loss, `jax.grad`, optax adam update",
}
AUTO = M.variant_name("autostatic", M.JAX_JIT)
TWIN_PLAIN = M.variant_name("eqx-static", M.JAX_JIT)
TWIN = "eqx-static / eqx.partition + jax.jit"
TRACE_VARIANTS: dict[str, str] = {
    AUTO: "the model passed to a fresh `jax.jit`",
    TWIN_PLAIN: "the fair twin passed to a fresh `jax.jit` (refused: `eqx.nn.MLP` "
    "holds a function field)",
    TWIN: "the fair twin partitioned once by `eqx.partition`; a fresh `jax.jit` over "
    "its arrays, the static half closed over (Equinox's route to plain `jax.jit`)",
}


def transformer_forward(model: Any, x: jax.Array, key: jax.Array) -> jax.Array:
    """The eqx.nn transformer on a sequence `x` (tokens x 16), pre-norm residual
    blocks, dropout drawing from `key`."""
    keys = jax.random.split(key, len(model.blocks))
    for block, k in zip(model.blocks, keys):
        h = jax.vmap(block.ln1)(x)
        x = x + block.attn(h, h, h)
        h = jax.vmap(block.ln2)(x)
        x = x + block.dropout(jax.vmap(block.mlp)(h), key=k)
    return x


def make_train_step(
    forward: Callable[..., jax.Array], opt: Any
) -> Callable[..., tuple[Any, Any]]:
    """A new function object: `step(params, opt_state, x, y, key)`, one adam step on
    the MSE of `forward(params, x, key)` to `y`."""
    import optax

    def step(
        params: Any, opt_state: Any, x: jax.Array, y: jax.Array, key: jax.Array
    ) -> tuple[Any, Any]:
        def loss(p: Any) -> jax.Array:
            return jnp.mean((forward(p, x, key) - y) ** 2)

        grads = jax.grad(loss)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return step


# What a repetition traces: per (function, variant), a maker of a new function with
# its arguments.
TraceCase = Callable[[], tuple[Callable[..., Any], tuple[Any, ...]]]


def _trace_cases(blocks: int) -> dict[tuple[str, str], TraceCase]:
    """Every (function, variant) case of the transformer of `blocks` blocks."""
    import optax

    opt = optax.adam(1e-3)
    parts = R.transformer_layers(0)[:blocks]
    ours = R.build_transformer("autostatic", parts)
    twin = R.build_transformer("eqx-static", parts)
    params, static = eqx.partition(twin, eqx.is_array)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((8, 16)), jnp.float32)
    key = jax.random.key(0)

    def combined() -> Callable[..., jax.Array]:
        return lambda p, x, k: transformer_forward(eqx.combine(p, static), x, k)

    def fresh_forward() -> Callable[..., jax.Array]:
        return lambda m, x, k: transformer_forward(m, x, k)

    return {
        ("forward", AUTO): lambda: (fresh_forward(), (ours, x, key)),
        ("forward", TWIN_PLAIN): lambda: (fresh_forward(), (twin, x, key)),
        ("forward", TWIN): lambda: (combined(), (params, x, key)),
        ("train_step", AUTO): lambda: (
            make_train_step(transformer_forward, opt),
            (ours, opt.init(ours), x, x, key),
        ),
        ("train_step", TWIN): lambda: (
            make_train_step(combined(), opt),
            (params, opt.init(params), x, x, key),
        ),
    }


def _trace(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """`fn` traced by a new `jax.jit` wrapper."""
    return jax.jit(fn).trace(*args)


def _time_traces(
    cases: dict[tuple[str, str], TraceCase], reps: int, seed: int
) -> tuple[dict[tuple[str, str], list[float]], dict[tuple[str, str], str]]:
    """Seconds per trace of every case, `reps` repetitions after an untimed one, each
    in a shuffled order; the cases that fail, once, with why."""
    samples: dict[tuple[str, str], list[float]] = {c: [] for c in cases}
    fails: dict[tuple[str, str], str] = {}
    rng = random.Random(seed)
    order = list(cases)
    with frozen_heap():
        for rep in range(reps + 1):
            rng.shuffle(order)
            for case in order:
                if case in fails:
                    continue
                fn, args = cases[case]()
                try:
                    seconds = timed_once(functools.partial(_trace, fn, args))
                except Exception as err:
                    fails[case] = describe_error(err)
                    continue
                if rep:
                    samples[case].append(seconds)
    return samples, fails


def trace(settings: Settings, seed: int = 0) -> TraceTimes:
    """The `trace` part: trace times of the transformer's forward pass and training
    step, autostatic against the fair twin, paired per repetition."""
    blocks = settings.construction_blocks
    samples, fails = _time_traces(_trace_cases(blocks), settings.trace_reps, seed)
    ms: dict[str, dict[str, Stat | Failed]] = {fn: {} for fn in TRACE_FNS}
    ratios: dict[str, Ratio] = {}
    for (fn, variant), values in samples.items():
        if (fn, variant) in fails:
            ms[fn][variant] = {"fails": fails[fn, variant]}
        else:
            ms[fn][variant] = scaled_summary(values, MS)
    for fn in TRACE_FNS:
        ours, theirs = samples.get((fn, AUTO)), samples.get((fn, TWIN))
        if ours and theirs and (fn, AUTO) not in fails and (fn, TWIN) not in fails:
            ratios[fn] = paired_ratio(ours, theirs)
    return {
        "reps": settings.trace_reps,
        "blocks": blocks,
        "fns": dict(TRACE_FNS),
        "variants": dict(TRACE_VARIANTS),
        "ms": ms,
        "ratios": ratios,
        "note": (
            "`jax.jit(fn).trace(*args)` of a new function object each repetition (no "
            "trace cached); plain `jax.jit` refuses the fair twin of this model "
            "(`eqx.nn.MLP` holds a function field), so the ratio is against the fair "
            "twin partitioned once by `eqx.partition`, `jax.jit` over its arrays with "
            "the static half closed over"
        ),
    }


# --------------------------------------------------------------------------------------
# diffrax / optimistix, stock and rebased, in separate processes.
# --------------------------------------------------------------------------------------

SCRIPT = Path(__file__).resolve().parent / "ecosystem_trace.py"
LIBRARIES = "diffrax,lineax,optimistix"


def ecosystem_command(rebased: bool, reps: int) -> list[str]:
    """The command line of one process of `ecosystem_trace.py`."""
    expect = "--expect-rebased" if rebased else "--expect-stock"
    script = [str(SCRIPT), "--reps", str(reps), expect]
    if rebased:
        return [sys.executable, "-m", "autostatic.rebased", LIBRARIES, *script]
    return [sys.executable, *script]


def run_ecosystem_process(rebased: bool, reps: int) -> tuple[dict[str, Any], str]:
    """One process's JSON and its stderr's last line (the rebase's summary); raises
    if it failed or its classes are not as `rebased` says."""
    proc = subprocess.run(
        ecosystem_command(rebased, reps),
        cwd=SCRIPT.parent.parent,
        env=child_environment(),
        capture_output=True,
        text=True,
    )
    side = "rebased" if rebased else "stock"
    if proc.returncode != 0:
        raise RuntimeError(
            f"ecosystem_trace.py ({side}) exited {proc.returncode}:\n"
            f"{proc.stderr[-3000:]}"
        )
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if out["rebased"] is not rebased:  # the script checks too: a second line of defence
        raise RuntimeError(f"the {side} process reports rebased={out['rebased']}")
    lines = proc.stderr.strip().splitlines()
    return out, lines[-1] if lines else ""


def spread(values: list[float]) -> Spread:
    """Median, lowest and highest of `values`."""
    data = sorted(values)
    return {
        "median": float(np.median(data)),
        "min": data[0],
        "max": data[-1],
        "n": len(data),
    }


def _pair_ratios(
    pairs: list[tuple[EcosystemProcess, EcosystemProcess]], workload: str
) -> EcosystemWorkload:
    """One workload's medians per side and its ratio per (stock, rebased) pair."""

    def of(p: EcosystemProcess, key: str) -> float:
        return p["medians_s"][workload][key]

    def ratios(key: str) -> Spread:
        return spread([of(r, key) / of(s, key) for s, r in pairs])

    return {
        "stock_ms": spread([of(s, "total_s") * MS for s, _ in pairs]),
        "rebased_ms": spread([of(r, "total_s") * MS for _, r in pairs]),
        "ratio": ratios("total_s"),
        "lower_ratio": ratios("lower_s"),
        "compile_ratio": ratios("compile_s"),
    }


def ecosystem(settings: Settings) -> EcosystemTrace:
    """The `ecosystem` part: stock and rebased processes alternated (each pair in
    the other order than the last), a ratio per pair."""
    reps = settings.ecosystem_reps
    processes: list[EcosystemProcess] = []
    pairs: list[tuple[EcosystemProcess, EcosystemProcess]] = []
    summary = ""
    for i in range(settings.ecosystem_processes):
        pair: dict[bool, EcosystemProcess] = {}
        for rebased in (False, True) if i % 2 == 0 else (True, False):
            out, last_line = run_ecosystem_process(rebased, reps)
            summary = last_line if rebased else summary
            pair[rebased] = {
                "rebased": rebased,
                "medians_s": {
                    name: {k: w[k] for k in ("lower_s", "compile_s", "total_s")}
                    for name, w in out["workloads"].items()
                },
            }
            processes.append(pair[rebased])
        pairs.append((pair[False], pair[True]))
    return {
        "processes_per_side": settings.ecosystem_processes,
        "reps": reps,
        "rebase_checked": True,  # `run_ecosystem_process` raised otherwise
        "rebase_summary": summary,
        "command": " ".join(["python", *ecosystem_command(True, reps)[1:]]),
        "platform": child_platform(),
        "processes": processes,
        "workloads": {w: _pair_ratios(pairs, w) for w in pairs[0][0]["medians_s"]},
        "note": (
            "per process, the median of fresh `jax.jit(fn).lower(*args).compile()` "
            "(caches cleared before each); stock and rebased run in separate processes, "
            "alternated, so the ratio is per adjacent pair of processes (median, "
            "min-max over pairs), not paired within a process"
        ),
    }
