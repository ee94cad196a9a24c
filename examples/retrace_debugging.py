"""Catching a hyperparameter that retraces every step.

A learning-rate schedule stored as a Python float attribute is static, so every new
value compiles the step again. `autostatic.logged_jit` says which attribute changed on
each retrace, and warns after a few; `autostatic.explain` shows the partition; the fix
is to store the value as an array.

    python examples/retrace_debugging.py
"""

import logging
import sys
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp

import autostatic as asx


class Model(asx.AutoModule):
    weight: jax.Array
    lr: float  # the mistake: a value that changes every step, kept as a Python float

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.weight * x


class FixedModel(asx.AutoModule):
    weight: jax.Array
    lr: jax.Array = eqx.field(converter=jnp.asarray)  # now dynamic: no retrace

    __call__ = Model.__call__


def sgd_step(model, x):
    grad = jax.grad(lambda m: jnp.sum(m(x) ** 2))(model)
    return asx.tree_at(lambda m: m.weight, model, model.weight - model.lr * grad.weight)


def main(fast: bool = False) -> dict[str, int]:
    del fast
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    print(asx.explain(Model(jnp.ones(3), 0.1)))
    step = asx.logged_jit(sgd_step)
    x = jnp.ones(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(5):
            model = step(Model(jnp.ones(3), 0.1 / (i + 1)), x)
    print(f"retraces of the step with a float lr: {len(step.retraces)}")
    for number, reasons in step.retraces[:2]:
        print(f"  trace {number}: {'; '.join(map(str, reasons))}")
    for warning in caught:
        print("warning:", str(warning.message).splitlines()[0])
    fixed_step = asx.logged_jit(sgd_step)
    for i in range(5):
        fixed = fixed_step(FixedModel(jnp.ones(3), 0.1 / (i + 1)), x)
    print(f"retraces with lr stored as an array: {len(fixed_step.retraces)}")
    del model, fixed
    return {
        "float_retraces": len(step.retraces),
        "array_retraces": len(fixed_step.retraces),
    }


if __name__ == "__main__":
    main(fast="--fast" in sys.argv)
