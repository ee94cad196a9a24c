"""Training-step throughput on the synthetic models: steps/s of a forward + grad +
optax adam step in a loop that blocks only every `train_steps` steps, every variant
interleaved, with paired throughput ratios to the references."""

import time
import traceback
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from . import models as M
from .scenarios import block, Cells, MS
from .schema import describe_error, Failed, Training, TrainingVariant
from .settings import Settings
from .timing import paired_ratio, run_interleaved, summary


def make_train_step(
    apply: Callable[..., jax.Array],
    uses_key: bool,
    impl: str,
    jit: str,
    cfg: Any,
    opt: Any,
    on_trace: Callable[[], None] | None = None,
) -> tuple[Callable[..., Any], Callable[[Any], Any]]:
    """(step, init): `step(tree, opt_state, x, y, key) -> (tree, opt_state, loss)` of
    the forward pass `apply` (given `key` where it `uses_key`).

    The `jax.jit` variants are written with JAX's own functions
    (`jax.value_and_grad`, `optax.apply_updates`); the `eqx.filter_jit` variants with
    the Equinox idiom (`eqx.filter_value_and_grad`, `eqx.filter`,
    `eqx.apply_updates`).
    """
    import optax

    def loss_fn(model: Any, x: jax.Array, y: jax.Array, key: Any) -> jax.Array:
        out = apply(model, x, key) if uses_key else apply(model, x)
        return jnp.mean((out - y) ** 2)

    if jit == M.JAX_JIT:

        def step(
            tree: Any, opt_state: Any, x: jax.Array, y: jax.Array, key: Any
        ) -> tuple[Any, Any, jax.Array]:
            if on_trace is not None:
                on_trace()

            def loss_of(t: Any) -> jax.Array:
                return loss_fn(M.merge(t, cfg) if impl == "dict" else t, x, y, key)

            loss, grads = jax.value_and_grad(loss_of)(tree)
            updates, opt_state = opt.update(grads, opt_state, tree)
            return optax.apply_updates(tree, updates), opt_state, loss

        return jax.jit(step), opt.init

    def filter_step(
        model: Any, opt_state: Any, x: jax.Array, y: jax.Array, key: Any
    ) -> tuple[Any, Any, jax.Array]:
        if on_trace is not None:
            on_trace()
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y, key)
        updates, opt_state = opt.update(
            grads, opt_state, eqx.filter(model, eqx.is_array)
        )
        return eqx.apply_updates(model, updates), opt_state, loss

    return eqx.filter_jit(filter_step), lambda m: opt.init(eqx.filter(m, eqx.is_array))


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


def _make_training_cells(
    model: M.Model, parts: Any, settings: Settings
) -> tuple[Cells, dict[str, str], dict[str, float]]:
    """Per variant, a cell running `train_steps` steps (blocked at the end), why the
    others fail, and each one's first call (compilation) in seconds."""
    import optax

    assert model.apply is not None  # `Model` refuses a synthetic model without one
    opt = optax.adam(1e-3)
    x = jax.device_put(
        np.random.default_rng(2).standard_normal(model.input_shape).astype(np.float32)
    )
    key = jax.random.key(0) if model.uses_key else None
    cells: Cells = {}
    fails: dict[str, str] = {}
    compile_s: dict[str, float] = {}
    s = settings.train_steps
    for impl, jit in TRAIN_VARIANTS:
        name = M.variant_name(impl, jit)
        try:
            b = model.build(impl, parts)
            y = jnp.zeros_like(x)  # every model maps x to the same shape
            step, init = make_train_step(
                model.apply, model.uses_key, impl, jit, b.cfg, opt
            )
            state = [b.tree, init(b.tree)]
            start = time.perf_counter()
            block(step(state[0], state[1], x, y, key))
            compile_s[name] = time.perf_counter() - start
        except Exception as err:
            fails[name] = describe_error(err)
            traceback.print_exc()
            continue

        def run(
            step: Callable[..., Any] = step, state: list[Any] = state, y: jax.Array = y
        ) -> None:
            tree, opt_state = state
            loss: Any = None
            for _ in range(s):
                tree, opt_state, loss = step(tree, opt_state, x, y, key)
            block((tree, opt_state, loss))
            state[0], state[1] = tree, opt_state

        cells[name] = run
    return cells, fails, compile_s


def _summarise_training_variant(
    name: str, samples: dict[str, list[float]], steps: int, compile_s: float
) -> TrainingVariant:
    """One variant's time per step and its paired throughput ratios."""
    st = summary([v / steps for v in samples[name]])
    entry: TrainingVariant = {
        "ms_per_step": st["median"] * MS,
        "ms_iqr": [st["q1"] * MS, st["q3"] * MS],
        "steps_per_s": 1.0 / st["median"],
        "rounds": st["n"],
        "first_call_s": compile_s,
        "throughput_ratios": {},
    }
    for ref in TRAIN_REFS:
        rname = M.variant_name(*ref)
        if rname in samples:
            # Throughput ratio = reference time / this time (>1 = more steps/s).
            entry["throughput_ratios"][rname] = paired_ratio(
                samples[rname], samples[name]
            )
    return entry


def training(name: str, model: M.Model, parts: Any, settings: Settings) -> Training:
    """Steps/s of `step` in a loop that blocks only every `train_steps` steps."""
    cells, fails, compile_s = _make_training_cells(model, parts, settings)
    samples = run_interleaved(
        cells,
        settings.train_rounds,
        loops={c: 1 for c in cells},
        seed=5,
        min_rounds=3,
        max_seconds=settings.train_budget_s,
    )
    s = settings.train_steps
    variants: dict[str, TrainingVariant | Failed] = {}
    for impl, jit in TRAIN_VARIANTS:
        vname = M.variant_name(impl, jit)
        if vname in fails:
            variants[vname] = {"fails": fails[vname]}
        else:
            variants[vname] = _summarise_training_variant(
                vname, samples, s, compile_s[vname]
            )
    return {"model": name, "steps_per_batch": s, "variants": variants}
