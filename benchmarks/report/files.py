"""Where results are written, and `results.json` itself."""

import json
import math
import os
from pathlib import Path
from typing import Any

from ..schema import Results

# The `benchmarks/` folder.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def jsonable(x: Any) -> Any:
    """`x` as JSON can hold it: non-finite floats as None, keys as strings, tuples as
    lists, anything else unknown as its repr."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return repr(x)


def write_json(results: Results, path: Path) -> None:
    """Writes `results.json`."""
    path.write_text(json.dumps(jsonable(results), indent=1) + "\n")


def results_dir(backend: str) -> Path:
    """The committed results (`python -m benchmarks --write-results`)."""
    return Path(_PACKAGE) / "results" / backend


def default_out_dir(backend: str) -> Path:
    """Where an ad-hoc run writes: `benchmarks/out/<backend>/`, ignored by git."""
    return Path(_PACKAGE) / "out" / backend
