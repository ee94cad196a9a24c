"""Train an MLP with optax and plain `jax.jit`, side by side with the same model written
as `eqx.Module` and trained with `eqx.filter_jit`. The loss curves are equal; the step
times show what skipping `filter_jit` saves.

    python examples/mlp_optax.py [--fast]
"""

import argparse
import itertools
import time
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

import autostatic as asx


class AutoMLP(asx.AutoModule):
    layers: list
    activation: Callable
    depth: int

    def __init__(self, sizes: list[int], key: jax.Array):
        self.layers = []
        for k, (n_in, n_out) in zip(
            jax.random.split(key, len(sizes) - 1), itertools.pairwise(sizes)
        ):
            self.layers.append(eqx.nn.Linear(n_in, n_out, key=k))
        self.activation = jax.nn.tanh
        self.depth = len(self.layers)

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers[:-1]:
            x = self.activation(layer(x))
        return self.layers[-1](x)


class EqxMLP(eqx.Module):
    layers: list
    activation: Callable  # unmarked, as usually written: needs eqx.filter_jit
    depth: int

    def __init__(self, sizes: list[int], key: jax.Array):
        self.layers = []
        for k, (n_in, n_out) in zip(
            jax.random.split(key, len(sizes) - 1), itertools.pairwise(sizes)
        ):
            self.layers.append(eqx.nn.Linear(n_in, n_out, key=k))
        self.activation = jax.nn.tanh
        self.depth = len(self.layers)

    __call__ = AutoMLP.__call__


def make_data(key: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
    x = jax.random.uniform(key, (n, 1), minval=-3, maxval=3)
    return x, jnp.sin(x) + 0.1 * jnp.cos(3 * x)


def loss_fn(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


optimiser = optax.adam(1e-2)


@jax.jit
def auto_step(model, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(model, x, y)
    updates, opt_state = optimiser.update(grads, opt_state, model)
    return optax.apply_updates(model, updates), opt_state, loss


@eqx.filter_jit
def eqx_step(model, opt_state, x, y):
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
    updates, opt_state = optimiser.update(
        grads, opt_state, eqx.filter(model, eqx.is_array)
    )
    return eqx.apply_updates(model, updates), opt_state, loss


def train(step, model, opt_state, x, y, steps):
    losses = []
    for _ in range(steps):
        model, opt_state, loss = step(model, opt_state, x, y)
        losses.append(loss)
    return model, opt_state, jnp.stack(losses)


def time_per_step(runs, rounds: int, steps: int) -> list[float]:
    """Median seconds per step of each run, measured in interleaved rounds so that
    machine noise and warm-up hit every run alike."""
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(rounds):
        for i, (step, model, opt_state, x, y) in enumerate(runs):
            start = time.perf_counter()
            jax.block_until_ready(train(step, model, opt_state, x, y, steps))
            times[i].append((time.perf_counter() - start) / steps)
    return [sorted(t)[len(t) // 2] for t in times]


def main(fast: bool = False) -> dict[str, float]:
    steps = 40 if fast else 500
    key_model, key_data = jax.random.split(jax.random.key(0))
    x, y = make_data(key_data, 256)
    auto, ref = AutoMLP([1, 32, 32, 1], key_model), EqxMLP([1, 32, 32, 1], key_model)
    # optax's `Params` annotation lists arrays and containers; any pytree works.
    auto_state = optimiser.init(auto)  # pyright: ignore[reportArgumentType]
    ref_state = optimiser.init(eqx.filter(ref, eqx.is_array))
    _, _, auto_losses = train(auto_step, auto, auto_state, x, y, steps)
    _, _, ref_losses = train(eqx_step, ref, ref_state, x, y, steps)
    gap = float(jnp.max(jnp.abs(auto_losses - ref_losses)))
    for i in range(0, steps, max(1, steps // 10)):
        print(
            f"step {i:4d}  AutoModule+jax.jit {auto_losses[i]:.6f}  eqx.Module+filter_jit {ref_losses[i]:.6f}"
        )
    print(f"largest loss difference: {gap:.2e}")
    auto_time, ref_time = time_per_step(
        [(auto_step, auto, auto_state, x, y), (eqx_step, ref, ref_state, x, y)],
        rounds=3 if fast else 15,
        steps=20,
    )
    print(
        "time per step, AutoModule+jax.jit / eqx.Module+eqx.filter_jit "
        f"(medians, interleaved in one run): {auto_time / ref_time:.2f}"
    )
    return {
        "max_loss_gap": gap,
        "time_ratio": auto_time / ref_time,
        "final_loss": float(auto_losses[-1]),
    }


def parse_args() -> argparse.Namespace:
    """`--help` prints the docstring above and exits before anything runs."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--fast",
        action="store_true",
        help="a short run (40 steps, 3 timing rounds), as the tests use",
    )
    return parser.parse_args()


if __name__ == "__main__":
    main(fast=parse_args().fast)
