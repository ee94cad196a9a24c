"""Retracing: how often a fresh jitted function traces, per variant and scenario.

- Scripted scenarios on the MLP (`SCRIPTED`): the same model called again, rebuilt,
  rebuilt with a new lambda, and so on, each a fresh jitted function whose traces are
  counted by a Python side effect at trace time.
- Contrasts (`CONTRASTS`): small purpose-built modules where eqx.Module and AutoModule
  retrace differently, in both directions, each rebuilt before every call.
"""

import dataclasses
import functools
import warnings
from collections.abc import Callable
from typing import Any, cast

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

import autostatic as asx

from . import models as M
from .scenarios import block
from .schema import (
    Contrasts,
    ContrastScenario,
    describe_error,
    Retracing,
    ScriptedScenario,
    TraceCount,
)
from .settings import Settings
from .training import make_train_step

# --------------------------------------------------------------------------------------
# Scripted scenarios on the MLP.
# --------------------------------------------------------------------------------------


def _retrace_fn(m: Any, v: jax.Array) -> jax.Array:
    """What the scripted scenarios jit: it reads the first layer's activation and bias
    and the float `scale` (so a stale `scale` shows in the result). What retraces is
    decided by the whole input treedef, and a small function keeps the ~150
    compilations of this section cheap."""
    layer = m.layers[0]
    return m.scale * layer.activation(layer.bias + v)


class ScriptedRun:
    """One scripted scenario of one variant: builds MLPs from the same arrays and
    calls them through a fresh jitted `_retrace_fn` whose traces it counts."""

    def __init__(
        self, impl: str, jit: str, arrays: Any, repeats: int, adam_steps: int
    ) -> None:
        self.impl, self.jit, self.arrays = impl, jit, arrays
        self.repeats, self.adam_steps = repeats, adam_steps
        self.count = 0
        self.x = jnp.ones(M.MLP_WIDTH)
        self._f: Callable[..., Any] | None = None

    def count_trace(self) -> None:
        """Called by the jitted function at trace time."""
        self.count += 1

    def build(self, **hyper: Any) -> M.Built:
        """An MLP of the shared arrays, with these hyperparameters."""
        return M.build_mlp(self.impl, self.arrays, **hyper)

    def start(self, **hyper: Any) -> M.Built:
        """Builds the first model and the counted jitted function (the `dict` floor
        closes over this model's config)."""
        first = self.build(**hyper)

        def counted(m: Any, v: jax.Array) -> jax.Array:
            self.count_trace()
            return _retrace_fn(m, v)

        self._f = M.make_jitted(self.impl, self.jit, counted, first.cfg)
        return first

    def call(self, b: M.Built) -> Any:
        """The jitted function's result on `b`, computed."""
        assert self._f is not None, "start() first"
        # The scenarios retrace on purpose, and count it; the warning meant for a
        # user who does not know would only clutter the output.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", asx.RetraceWarning)
            return block(self._f(b.tree, self.x))


# Each scripted scenario's script: what it calls, on which models. It returns whether
# a result was stale (ignored a changed value) where that can happen, else None.


def _same(run: ScriptedRun) -> bool | None:
    """The same model, called `repeats` times."""
    first = run.start()
    for _ in range(run.repeats):
        run.call(first)
    return None


def _rebuilt(run: ScriptedRun) -> bool | None:
    """A model rebuilt with equal hyperparameters before each call."""
    run.call(run.start())
    for _ in range(run.repeats - 1):
        run.call(run.build())
    return None


def _new_lambda(run: ScriptedRun) -> bool | None:
    """A model rebuilt before each call with a new lambda activation object, equal
    in what it does."""
    run.call(run.start(activation=lambda v: jax.nn.relu(v)))
    for _ in range(run.repeats - 1):
        run.call(run.build(activation=lambda v: jax.nn.relu(v)))
    return None


def _list_of_ints(run: ScriptedRun) -> bool | None:
    """A list-of-ints field: the same model 3 times, then 3 rebuilt ones."""
    first = run.start()
    for _ in range(3):
        run.call(first)
    for _ in range(3):
        run.call(run.build())
    return None


def _tree_map(run: ScriptedRun) -> bool | None:
    """The model, then `tree_map(lambda x: x * 2, model)` of it."""
    first = run.start()
    run.call(first)
    doubled = jtu.tree_map(lambda v: v * 2, first.tree)
    run.call(M.Built(run.impl, doubled, first.cfg))
    return None


def _float_hparam(run: ScriptedRun) -> bool | None:
    """A float hyperparameter alternating 1.0, 2.0; stale if a result ignored the
    change."""
    first = run.start()
    stale = False
    for scale in (1.0, 2.0, 1.0, 2.0):
        b = first if scale == 1.0 else run.build(scale=scale)
        got = np.asarray(run.call(b))
        want = np.asarray(_retrace_fn(M.view(b), run.x))
        stale |= not np.allclose(got, want, rtol=1e-5, atol=1e-6)
    return stale


def _adam(run: ScriptedRun) -> bool | None:
    """An optax adam training loop; counts the train step's traces."""
    import optax

    first = run.start()
    run.count = 0  # the train step's traces, not the counted function's
    # The loss reads only the first layer (like `_retrace_fn`), to keep compiling
    # cheap; gradients and adam updates still cover every array of the model.
    step, init = make_train_step(
        _retrace_fn,
        False,
        run.impl,
        run.jit,
        first.cfg,
        optax.adam(1e-3),
        run.count_trace,
    )
    tree, opt_state = first.tree, init(first.tree)
    y = jnp.zeros_like(run.x)
    loss: Any = None
    for _ in range(run.adam_steps):
        tree, opt_state, loss = step(tree, opt_state, run.x, y, None)
    block(loss)
    return None


@dataclasses.dataclass(frozen=True)
class Scripted:
    """A scripted scenario: what it does (`{r}`: the repeat count, `{steps}`: adam's
    steps), the ideal trace count for `r` repeats, whether the static values stay
    equal (only then is the `dict` floor a valid reference), and its script."""

    description: str
    ideal: Callable[[int], int]
    static_values_equal: bool
    script: Callable[[ScriptedRun], bool | None]


SCRIPTED: dict[str, Scripted] = {
    "same": Scripted("same model x{r}", lambda r: 1, True, _same),
    "rebuilt": Scripted(
        "rebuilt each call, equal hyperparameters x{r}", lambda r: 1, True, _rebuilt
    ),
    "new_lambda": Scripted(
        "rebuilt with a new but equal lambda x{r}", lambda r: r, False, _new_lambda
    ),
    "list_of_ints": Scripted(
        "list-of-ints attribute: 3x same + 3x rebuilt", lambda r: 1, True, _list_of_ints
    ),
    "tree_map": Scripted(
        "model, then tree_map(lambda x: x*2, model)", lambda r: 1, True, _tree_map
    ),
    "float_hparam": Scripted(
        "float hyperparameter 1.0, 2.0, 1.0, 2.0", lambda r: 2, False, _float_hparam
    ),
    "adam": Scripted(
        "optax adam training loop ({steps} steps)", lambda r: 1, True, _adam
    ),
}

# `autostatic` + `eqx.filter_jit` is left out here (it is not one of the compared
# variants, and every variant costs ~25 compilations).
RETRACE_VARIANTS: tuple[tuple[str, str], ...] = tuple(
    v for v in M.VARIANTS if v != ("autostatic", M.FILTER_JIT)
)


def run_scripted(
    scenario: Scripted, impl: str, jit: str, arrays: Any, repeats: int, adam_steps: int
) -> TraceCount:
    """The trace count of one scripted scenario under one variant (with the error
    that stopped it, and whether a result was stale, where those apply)."""
    run = ScriptedRun(impl, jit, arrays, repeats, adam_steps)
    out: dict[str, Any] = {}
    try:
        stale = scenario.script(run)
        if stale is not None:
            out["stale"] = stale
    except Exception as err:
        out["error"] = describe_error(err)
    out["count"] = run.count
    return cast(TraceCount, out)


# --------------------------------------------------------------------------------------
# Contrasts.
# --------------------------------------------------------------------------------------

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
    """A mutable `@dataclass` config object: compared by value, unhashable (eq=True and
    not frozen sets `__hash__ = None`)."""

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


def define_contrast_classes(c: Contrast) -> dict[str, type]:
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


def count_contrast_traces(
    c: Contrast, cls: type | None, jit: str, calls: int
) -> TraceCount:
    """Traces of a fresh jitted `c.apply` over `calls` rebuilt models, counted by a
    Python side effect at trace time; a result that differs from the eager one is
    `stale` (the changed value was ignored)."""
    count = 0

    def counted(m: Any, x: jax.Array) -> jax.Array:
        nonlocal count
        count += 1
        return c.apply(m, x)

    f = M.JITS[jit](counted)
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
                got = np.asarray(block(f(m, x)))
                want = np.asarray(c.apply(m, x))
                out["stale"] |= not np.allclose(got, want, rtol=1e-5, atol=1e-6)
        except Exception as err:
            out["error"] = describe_error(err)
    out["count"] = count
    messages = dict.fromkeys(str(w.message).splitlines()[0][:120] for w in caught)
    if messages:
        out["warnings"] = list(messages)
    return cast(TraceCount, out)


def measure_contrasts(calls: int) -> Contrasts:
    """Trace counts per (scenario, variant) of `CONTRASTS`."""
    scenarios: dict[str, ContrastScenario] = {}
    for c in CONTRASTS:
        classes = define_contrast_classes(c)
        counts = {
            M.variant_name(impl, jit): count_contrast_traces(
                c, classes.get(impl), jit, calls
            )
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


def retracing(arrays: Any, settings: Settings) -> Retracing:
    """Trace counts per (variant, scripted scenario), the `dict` floor's the
    reference; and the contrasts."""
    r = settings.retrace_repeats
    scenarios: dict[str, ScriptedScenario] = {
        name: {
            "description": s.description.format(r=r, steps=settings.adam_steps),
            "ideal": s.ideal(r),
            "static_values_equal": s.static_values_equal,
        }
        for name, s in SCRIPTED.items()
    }
    counts: dict[str, dict[str, TraceCount]] = {}
    for impl, jit in RETRACE_VARIANTS:
        row = counts[M.variant_name(impl, jit)] = {}
        for name, scenario in SCRIPTED.items():
            row[name] = run_scripted(
                scenario, impl, jit, arrays, r, settings.adam_steps
            )
    return {
        "depth": len(arrays),
        "repeats": r,
        "scenarios": scenarios,
        "counts": counts,
        "contrasts": measure_contrasts(settings.contrast_calls),
    }
