"""`jax.lax.switch` over bound methods of several AutoModules, under `vmap`.

With `eqx.Module` this fails with `unhashable type` because JAX hashes the branches; an
AutoModule's bound methods hash by function and module (array identity), so it works,
also for `@eqx.filter_jit` methods inside `eqx.filter_jit` and `eqx.filter_vmap`.

    python examples/switch_over_modules.py
"""

import argparse

import equinox as eqx
import jax
import jax.numpy as jnp

import autostatic as asx


class Expert(asx.AutoModule):
    weight: jax.Array
    name: str

    def __init__(self, name: str, key: jax.Array):
        self.weight = jax.random.normal(key, (4, 4))
        self.name = name

    def forward(self, x: jax.Array) -> jax.Array:
        return jnp.tanh(self.weight @ x)

    @eqx.filter_jit
    def scaled(self, x: jax.Array) -> jax.Array:
        return 2.0 * self.forward(x)


class Router(asx.AutoModule):
    experts: list

    def __init__(self, n: int, key: jax.Array):
        self.experts = [
            Expert(f"expert{i}", k) for i, k in enumerate(jax.random.split(key, n))
        ]

    def __call__(self, choice: jax.Array, x: jax.Array) -> jax.Array:
        # A hard routing decision per example: one expert per row of the batch.
        branches = [expert.forward for expert in self.experts]
        return jax.vmap(lambda i, xi: jax.lax.switch(i, branches, xi))(choice, x)

    @eqx.filter_jit
    def all_scaled(self, x: jax.Array) -> jax.Array:
        branches = tuple(expert.scaled for expert in self.experts)
        indices = jnp.arange(len(self.experts))
        return eqx.filter_vmap(
            lambda i, x: jax.lax.switch(i, branches, x), in_axes=(0, None)
        )(indices, x)


def main(fast: bool = False) -> dict[str, float]:
    del fast
    router = Router(3, jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (5, 4))
    choice = jnp.array([0, 1, 2, 1, 0])
    routed = jax.jit(lambda r, c, x: r(c, x))(router, choice, x)
    expected = jnp.stack(
        [router.experts[int(c)].forward(xi) for c, xi in zip(choice, x)]
    )
    print(
        "routed outputs match each expert's own:",
        bool(jnp.allclose(routed, expected, atol=1e-6)),
    )
    every = router.all_scaled(x[0])
    print("all experts on one input, shape", every.shape)
    grads = jax.grad(lambda r: jnp.sum(r(choice, x)))(router)
    print(
        "gradient reaches every expert:",
        [float(jnp.abs(e.weight).sum()) > 0 for e in grads.experts],
    )
    # Note: vmap over the switch index turns the switch into a select, so every
    # branch is evaluated for every row; worth knowing for expensive experts.
    return {"max_error": float(jnp.max(jnp.abs(routed - expected)))}


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
