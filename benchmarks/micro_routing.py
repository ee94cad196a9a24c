"""Micro-benchmarks of the routed Equinox functions, each paired in one process (run
by `python -m benchmarks.micro`, beside the core's):

- the routed `eqx.tree_at` vs Equinox's own, on 256 `eqx.nn.Linear` layers held by an
  `eqx.Module` and by an `AutoModule`, replacing an array and a sub-module;
- `eqx.filter(model, eqx.is_array)` on the 256-layer MLPs of both layer kinds, routed
  vs Equinox's own filter of the fair twin and of the same AutoModule, and the route's
  cost on a tree of no AutoModule (filter and partition).
"""

import equinox as eqx
import jax
import jax.numpy as jnp

import autostatic as asx
from autostatic._compat import original_filter, original_partition, original_tree_at

from .timing import drop_failing, paired_ratio, run_interleaved


class _EqxHolder(eqx.Module):
    layers: list


class _AutoHolder(asx.AutoModule):
    layers: list


def routed_tree_at(rounds: int = 15) -> None:
    """The routed `eqx.tree_at` against Equinox's own, on both holders."""
    keys = jax.random.split(jax.random.key(0), 256)
    layers = [eqx.nn.Linear(8, 8, key=k) for k in keys]
    weight, linear = jnp.ones((8, 8)), eqx.nn.Linear(8, 8, key=keys[0])
    for holder in (_EqxHolder(layers), _AutoHolder(layers)):
        cells = {}
        for replaced, where, new in (
            ("array", lambda m: m.layers[3].weight, weight),
            ("sub-module", lambda m: m.layers[3], linear),
        ):
            cells[f"Equinox's, {replaced}"] = lambda w=where, n=new, h=holder: (
                original_tree_at(w, h, n)
            )
            cells[f"routed, {replaced}"] = lambda w=where, n=new, h=holder: eqx.tree_at(
                w, h, n
            )
        failed = drop_failing(cells)
        samples = run_interleaved(cells, rounds, batch_s=0.02)
        print(
            f"eqx.tree_at on 256 eqx.nn.Linear in an {type(holder).__mro__[1].__name__}"
        )
        for replaced in ("array", "sub-module"):
            reason = failed.get(f"Equinox's, {replaced}")
            if reason is not None:
                # A held layer's node is its carrier, not the layer its attribute
                # holds, which Equinox's own `tree_at` looks for: the route exists
                # for this.
                print(f"  {replaced}: Equinox's own fails ({reason})")
                continue
            ratio = paired_ratio(
                samples[f"routed, {replaced}"], samples[f"Equinox's, {replaced}"]
            )
            print(
                f"  {replaced}: routed / Equinox's {ratio['median']:.3f}x "
                f"(IQR {ratio['q1']:.3f}-{ratio['q3']:.3f})"
            )


def routed_filter(rounds: int = 15) -> None:
    """`eqx.filter(model, eqx.is_array)`, the array half, on the 256-layer MLPs of
    both layer kinds: routed against Equinox's own filter of the fair twin, and of
    the same AutoModule (whose array half reads the static values); and the route's
    cost on a tree of no AutoModule."""
    from .scaling import builder, layer_arrays

    arrays = layer_arrays(256)
    for kind in ("own", "eqx.nn"):
        ours, twin = (
            builder(kind, impl, arrays)() for impl in ("autostatic", "eqx-static")
        )
        cells = {
            "routed": lambda m=ours: eqx.filter(m, eqx.is_array),
            "Equinox's": lambda m=ours: original_filter(m, eqx.is_array),
            # As its users run it: without autostatic's route.
            "twin": lambda m=twin: original_filter(m, eqx.is_array),
        }
        samples = run_interleaved(cells, rounds, batch_s=0.02)
        line = [
            f"{ref} {paired_ratio(samples['routed'], samples[ref])['median']:.2f}x"
            for ref in ("twin", "Equinox's")
        ]
        print(
            f"eqx.filter(mlp-256 of {kind} layers, eqx.is_array): routed / "
            + ", / ".join(line)
        )
    # A tree of no AutoModule (Equinox's users beside autostatic): the route costs
    # its walk of the tree in search of one.
    keys = jax.random.split(jax.random.key(0), 256)
    plain = _EqxHolder([eqx.nn.Linear(8, 8, key=k) for k in keys])
    cells = {
        "routed filter": lambda: eqx.filter(plain, eqx.is_array),
        "own filter": lambda: original_filter(plain, eqx.is_array),
        "routed partition": lambda: eqx.partition(plain, eqx.is_array),
        "own partition": lambda: original_partition(plain, eqx.is_array),
    }
    samples = run_interleaved(cells, rounds, batch_s=0.02)
    line = []
    for op in ("filter", "partition"):
        ratio = paired_ratio(samples[f"routed {op}"], samples[f"own {op}"])
        line.append(f"{op} {ratio['median']:.2f}x")
    print(
        "256 eqx.nn.Linear in an eqx.Module, the route / Equinox's own: "
        + ", ".join(line)
    )
