"""Where the processes a benchmark starts run: on this process's backend, except
beside a TPU, which one process holds at a time, where they run on the host's CPU."""

import os

import jax


def child_platform() -> str:
    """The backend the benchmark's own processes run on."""
    backend = jax.default_backend()
    return "cpu" if backend == "tpu" else backend


def child_environment() -> dict[str, str]:
    """The environment of a process the benchmark starts."""
    env = dict(os.environ)
    if child_platform() != jax.default_backend():
        env["JAX_PLATFORMS"] = child_platform()
    return env
