"""A small typed user model, which must type-check clean.

Checked by tests/test_typing.py (not collected by pytest: no `test_` prefix). The
only diagnostics allowed are marked `# expect: <pyright rule> | <mypy code>` (`-`:
none): mypy does not implement dataclass converters (PEP 712), so it takes a field's
annotation as the `__init__` parameter type; it does the same for `eqx.Module`.
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp

import autostatic as asx


class Point(asx.AutoModule):
    x: float
    y: float = 0.0


class Linear(asx.AutoModule):
    weight: jax.Array
    bias: jax.Array
    activation: Callable[[jax.Array], jax.Array]
    sizes: list[int]

    def __init__(self, n_in: int, n_out: int, key: jax.Array) -> None:
        self.weight = jax.random.normal(key, (n_out, n_in))
        self.bias = jnp.zeros(n_out)
        self.activation = jax.nn.relu
        self.sizes = [n_in, n_out]

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.activation(self.weight @ x + self.bias)

    def n_params(self) -> int:
        return self.weight.size + self.bias.size


class Scaled(asx.AutoModule):
    # The converter's parameter type is what __init__ accepts.
    scale: jax.Array = eqx.field(converter=jnp.asarray)
    count: int = eqx.field(default=1, converter=int)
    name: str = "scaled"


class Point3(Point):
    z: float = 0.0


def use() -> float:
    p = Point(1.0, y=2.0)
    q = Point(x=3.0)
    r = Point3(1.0, 2.0, z=3.0)
    layer = Linear(2, 3, jax.random.key(0))
    out: jax.Array = layer(jnp.ones(2))
    n: int = layer.n_params()
    method: Callable[[], int] = layer.n_params
    s = Scaled(1.5)
    t = Scaled(scale=[1.0, 2.0], count="3", name="t")  # expect: - | arg-type
    widths: list[int] = layer.sizes
    total = p.x + p.y + q.x + r.z + float(out.sum()) + n + method()
    return total + float(s.scale.sum() + t.scale.sum()) + widths[0] + t.count
