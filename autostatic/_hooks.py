"""Every hook autostatic puts into Equinox, installed in one place.

Equinox's class creation asks `_partition` for the flatten functions of AutoModule
classes (the carriers of `eqx.nn` layers are no Equinox classes: `_partition`
registers them); `eqx.tree_at`, `eqx.nn.inference_mode`
(`eqx.tree_inference`), `eqx.filter`, `eqx.partition`, `eqx.combine` and
`eqx.tree_(de)serialise_leaves` become functions that also reach the static values of
AutoModules and call Equinox's own otherwise (`_compat` says how each is replaced).
"""

from collections.abc import Callable

from . import _partition, _serialisation, _splice, _surgery
from ._compat import (
    install_flatten_generator,
    route_serialisation,
    route_splice,
    route_surgery,
)


def install_hooks(is_automodule_class: Callable[[type], bool]) -> None:
    """Installs every hook; `is_automodule_class` tells AutoModule classes (by their
    metaclass, which `_module` defines after importing this)."""
    install_flatten_generator(is_automodule_class, _partition.flatten_functions)
    route_surgery(_surgery.routed_tree_at, _surgery.routed_inference_mode)
    route_splice(_splice.filter, _splice.partition, _splice.combine)
    route_serialisation(
        _serialisation.tree_serialise_leaves, _serialisation.tree_deserialise_leaves
    )
