"""pytest-benchmark versions of the main micro-benchmarks, on the 256-layer MLP.

    python -m pytest benchmarks/test_bench.py --benchmark-only

Not part of the test suite (`testpaths = ["tests"]`), and nothing here asserts a time:
pytest-benchmark's own statistics are the output. The runner (`python -m benchmarks`)
interleaves implementations and pairs ratios per round, which these tests cannot; use
them for quick before/after comparisons of one implementation
(`--benchmark-save` / `--benchmark-compare`).
"""

from typing import Any

import equinox as eqx
import jax.tree_util as jtu
import pytest

from benchmarks import forward as F, models as M

pytest.importorskip("pytest_benchmark")

N = 256
# Plain jax.jit rejects eqx-filter's function/int leaves (the runner records the error).
DISPATCH_VARIANTS = [v for v in M.VARIANTS if v != ("eqx-filter", M.JAX_JIT)]


@pytest.fixture(scope="module")
def built() -> dict[str, M.Built]:
    """The 256-layer MLP in every implementation (or why it could not be built)."""
    arrays = M.mlp_arrays(N)
    out = {}
    for impl in M.IMPLS:
        try:
            out[impl] = M.build_mlp(impl, arrays)
        except Exception as err:
            out[impl] = err
    return out


def _get(built: dict[str, Any], impl: str) -> M.Built:
    """An implementation's model, or a skip where it could not be built."""
    b = built[impl]
    if isinstance(b, Exception):
        pytest.skip(f"{impl} unavailable: {type(b).__name__}: {b}")
    return b


@pytest.mark.parametrize("impl", M.IMPLS)
def test_tree_flatten(benchmark: Any, built: dict[str, Any], impl: str) -> None:
    """`tree_flatten` of the MLP."""
    benchmark.group = f"tree_flatten, {N}-layer MLP"
    b = _get(built, impl)
    leaves, _ = benchmark(jtu.tree_flatten, b.tree)
    assert sum(eqx.is_array(x) for x in leaves) == 2 * N


@pytest.mark.parametrize("impl", M.IMPLS)
def test_tree_unflatten(benchmark: Any, built: dict[str, Any], impl: str) -> None:
    """`tree_unflatten` of the MLP's leaves."""
    benchmark.group = f"tree_unflatten, {N}-layer MLP"
    b = _get(built, impl)
    leaves, treedef = jtu.tree_flatten(b.tree)
    rebuilt = benchmark(jtu.tree_unflatten, treedef, leaves)
    assert jtu.tree_structure(rebuilt) == treedef


@pytest.mark.parametrize(
    "impl,jit", DISPATCH_VARIANTS, ids=[f"{i}-{j}" for i, j in DISPATCH_VARIANTS]
)
def test_dispatch(benchmark: Any, built: dict[str, Any], impl: str, jit: str) -> None:
    """A compiled `lambda m: m.layers[0].bias + 1`, blocked on every call."""
    benchmark.group = f"dispatch, {N}-layer MLP"
    b = _get(built, impl)
    f = M.make_jitted(impl, jit, F.mlp_probe, b.cfg)
    f(b.tree).block_until_ready()  # compile outside the timing
    out = benchmark(lambda: f(b.tree).block_until_ready())
    assert out.shape == (M.MLP_WIDTH,)
