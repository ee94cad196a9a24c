"""autostatic: an `equinox.Module` base class that decides static fields by itself."""

from ._module import AutoModule as AutoModule

__version__ = "0.1.0"
