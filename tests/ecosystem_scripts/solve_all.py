"""One diffrax solve, one lineax solve and one optimistix root find, printed as JSON
with the programs they lower to; run stock and rebased (`python -m autostatic.rebased
diffrax,lineax,optimistix ...`) by tests/test_ecosystem.py, which compares the two."""

import hashlib
import json
import re
import sys

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import lineax
import optimistix

import autostatic as asx

term = diffrax.ODETerm(lambda t, y, args: -args * y)


def solve(y0: jax.Array) -> diffrax.Solution:
    return diffrax.diffeqsolve(
        term,
        diffrax.Tsit5(),
        t0=0.0,
        t1=1.0,
        dt0=0.1,
        y0=y0,
        args=0.5,
        stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-6),
        saveat=diffrax.SaveAt(ts=jnp.linspace(0.0, 1.0, 4)),
    )


def find_root(y0: jax.Array) -> optimistix.Solution:
    return optimistix.root_find(
        lambda y, args: jnp.tanh(y) - args,
        optimistix.Newton(rtol=1e-8, atol=1e-8),
        y0,
        args=jnp.array([0.3, -0.4]),
    )


def program(fn, *args) -> str:
    """A digest of the StableHLO `fn` lowers to, source locations left out."""
    text = jax.jit(fn).lower(*args).as_text()
    text = re.sub(r"loc\(.*?\)|#loc\d*", "", text)
    return hashlib.sha1(text.encode()).hexdigest()


solution = solve(jnp.array([1.0, 2.0]))
matrix = jnp.array([[3.0, 1.0], [1.0, 2.0]])
linear = lineax.linear_solve(
    lineax.MatrixLinearOperator(matrix, lineax.positive_semidefinite_tag),
    jnp.array([1.0, 1.0]),
    lineax.AutoLinearSolver(well_posed=True),
)
root = find_root(jnp.array([0.1, 0.2]))
grad = jax.grad(
    lambda y0: diffrax.diffeqsolve(
        term, diffrax.Tsit5(), 0.0, 1.0, 0.1, y0, args=0.5
    ).ys.sum()  # pyright: ignore[reportOptionalMemberAccess]
)(jnp.array([1.0, 2.0]))
json.dump(
    {
        "rebased": [
            issubclass(cls, asx.AutoModule)
            for cls in (diffrax.Tsit5, lineax.MatrixLinearOperator, optimistix.Newton)
        ],
        "ode": solution.ys.tolist(),  # pyright: ignore[reportOptionalMemberAccess]
        "steps": int(solution.stats["num_steps"]),
        "linear": linear.value.tolist(),
        "root": root.value.tolist(),
        "grad": grad.tolist(),
        "is_module": isinstance(diffrax.Tsit5(), eqx.Module),
        # The arrays only: a solution's `stats["max_steps"]`, a Python int, is an
        # output of the stock program and static rebased.
        "programs": [
            program(lambda y0: solve(y0).ys, jnp.array([1.0, 2.0])),
            program(lambda y0: find_root(y0).value, jnp.array([0.1, 0.2])),
        ],
    },
    sys.stdout,
)
