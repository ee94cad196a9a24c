"""autostatic: an `equinox.Module` base class that decides static fields by itself."""

from .checkpoint._checkpoint import load as load, save as save
from .checkpoint._eqx_format import load_eqx as load_eqx
from .checkpoint._errors import CheckpointError as CheckpointError
from .core._module import AutoModule as AutoModule
from .core._retrace import (
    RetraceWarning as RetraceWarning,
    warn_on_retrace as warn_on_retrace,
)
from .diagnostics._explain import explain as explain, Explanation as Explanation
from .diagnostics._logged_jit import logged_jit as logged_jit
from .diagnostics._retrace_reasons import (
    Reason as Reason,
    retrace_reasons as retrace_reasons,
)
from .rebase._rebase import (
    Rebase as Rebase,
    rebase as rebase,
    RebaseError as RebaseError,
)
from .routing._hooks import install_routes as _install_routes
from .routing._serialisation import (
    tree_deserialise_leaves as tree_deserialise_leaves,
    tree_serialise_leaves as tree_serialise_leaves,
)
from .routing._splice import (
    combine as combine,
    filter as filter,  # Equinox's name
    partition as partition,
)
from .routing._surgery import inference_mode as inference_mode, tree_at as tree_at

_install_routes()

__version__ = "0.1.0"
