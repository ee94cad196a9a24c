"""autostatic: an `equinox.Module` base class that decides static fields by itself."""

from ._diagnostics import (
    explain as explain,
    Explanation as Explanation,
    logged_jit as logged_jit,
    Reason as Reason,
    retrace_reasons as retrace_reasons,
)
from ._module import AutoModule as AutoModule
from ._serialisation import (
    CheckpointError as CheckpointError,
    load as load,
    load_eqx as load_eqx,
    save as save,
)
from ._surgery import inference_mode as inference_mode, tree_at as tree_at

__version__ = "0.1.0"
