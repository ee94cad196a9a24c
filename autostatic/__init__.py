"""autostatic: an `equinox.Module` base class that decides static fields by itself."""

from ._checkpoint import load as load, save as save
from ._diagnostics import (
    explain as explain,
    Explanation as Explanation,
    logged_jit as logged_jit,
    Reason as Reason,
    retrace_reasons as retrace_reasons,
)
from ._eqx_format import load_eqx as load_eqx
from ._module import AutoModule as AutoModule
from ._rebase import Rebase as Rebase, rebase as rebase, RebaseError as RebaseError
from ._retrace import (
    RetraceWarning as RetraceWarning,
    warn_on_retrace as warn_on_retrace,
)
from ._safetensors import CheckpointError as CheckpointError
from ._serialisation import (
    tree_deserialise_leaves as tree_deserialise_leaves,
    tree_serialise_leaves as tree_serialise_leaves,
)
from ._splice import (
    combine as combine,
    filter as filter,  # Equinox's name
    partition as partition,
)
from ._surgery import inference_mode as inference_mode, tree_at as tree_at

__version__ = "0.1.0"
