"""The whole report, `results.md`: the machine, the verdict, the targets, every
section's tables in the order they ran, any errors, and the summary last."""

from collections.abc import Callable
from typing import Any

from ..schema import Results
from .construction import construction_section
from .containers import containers_section
from .retracing import retracing_section
from .scaling import scaling_section
from .summary import summary_section, verdict_section
from .tables import (
    async_section,
    collector_section,
    errors_section,
    first_call_section,
    machine_section,
    overview_section,
    real_models_section,
    serialisation_section,
    targets_section,
    training_section,
    tree_ops_section,
)


def _tree_ops_sections(tree_ops: Any) -> list[str]:
    """The MLP overview, then every model's group."""
    lines = overview_section(tree_ops)
    for res in tree_ops.values():
        lines += tree_ops_section(res)
    return lines


# Each part of the report between the verdict and the summary, by the results key it
# shows (a key absent or empty shows nothing).
PARTS: tuple[tuple[str, Callable[[Any], list[str]]], ...] = (
    ("targets", targets_section),
    ("tree_ops", _tree_ops_sections),
    ("async_dispatch", async_section),
    ("retracing", retracing_section),
    ("first_call", first_call_section),
    ("first_call_forward", first_call_section),
    ("training", training_section),
    ("serialisation", serialisation_section),
    ("real_models", real_models_section),
    ("scaling", scaling_section),
    ("containers", containers_section),
    ("construction", construction_section),
    ("errors", errors_section),
)


def render(results: Results) -> str:
    """The report's markdown, as `results.md` holds and the runner prints it."""
    lines = machine_section(results["machine"])
    lines += collector_section(results["settings"])
    lines += verdict_section(results)
    shown: dict[str, Any] = dict(results)
    for key, part in PARTS:
        if shown.get(key):
            lines += part(shown[key])
    lines += summary_section(results)
    return "\n".join(lines) + "\n"
