"""Catching a hyperparameter that retraces every step.

A learning-rate schedule stored as a Python float attribute is static, so every new
value compiles the step again. `autostatic.logged_jit` says which attribute changed on
each retrace, and warns after a few; `autostatic.explain` shows the partition; the fix
is to store the value as an array.

    python examples/retrace_debugging.py
"""

import argparse
import logging
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
            step(Model(jnp.ones(3), 0.1 / (i + 1)), x)
    float_retraces = step.retraces
    print(f"retraces of the step with a float lr: {len(float_retraces)}")
    for number, reasons in float_retraces[:2]:
        print(f"  trace {number}: {'; '.join(map(str, reasons))}")
    for warning in caught:
        print("warning:", str(warning.message).splitlines()[0])
    fixed_step = asx.logged_jit(sgd_step)
    for i in range(5):
        fixed_step(FixedModel(jnp.ones(3), 0.1 / (i + 1)), x)
    array_retraces = fixed_step.retraces
    print(f"retraces with lr stored as an array: {len(array_retraces)}")
    return {
        "float_retraces": len(float_retraces),
        "array_retraces": len(array_retraces),
    }


def parse_args() -> argparse.Namespace:
    """`--help` prints the docstring above and exits before anything runs."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--fast",
        action="store_true",
        help="no effect here: this example is already small",
    )
    return parser.parse_args()


if __name__ == "__main__":
    main(fast=parse_args().fast)
