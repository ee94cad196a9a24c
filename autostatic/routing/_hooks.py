"""Equinox's public calls routed: installed once, when autostatic is imported.

`eqx.tree_at`, `eqx.nn.inference_mode` (`eqx.tree_inference`), `eqx.filter`,
`eqx.partition`, `eqx.combine` and `eqx.tree_(de)serialise_leaves` become functions
that also reach the static values of AutoModules and call Equinox's own otherwise
(`_compat` says how each is replaced).
"""

from .._compat import route_serialisation, route_splice, route_surgery
from . import _serialisation, _splice, _surgery


def install_routes() -> None:
    route_surgery(_surgery.routed_tree_at, _surgery.routed_inference_mode)
    route_splice(_splice.filter, _splice.partition, _splice.combine)
    route_serialisation(
        _serialisation.tree_serialise_leaves, _serialisation.tree_deserialise_leaves
    )
