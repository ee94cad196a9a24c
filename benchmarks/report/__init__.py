"""The report of a run: markdown tables, targets (MET / MISSED), the verdict and the
summary, PNG plots and `results.json`, one module per idea:

- `format`: times, ratios, markdown tables, the baselines' names;
- `tables`: one table per section of results.json;
- `targets`: the fixed thresholds and how each section's are judged;
- `retracing`, `construction`, `scaling`, `containers`: the tables of those sections
  (and the targets of the last three);
- `summary`: the verdict (first) and the summary (last), which read across sections;
- `plots`: the PNGs;
- `files`: `results.json` and where results are written;
- `document`: the whole report, in order.

Every table shows medians with the interquartile range, and ratios that are paired per
round (see `timing`). Targets are checked against fixed thresholds that are never
adjusted to the results; a target that cannot be evaluated is `N/A` with the reason.
The results it reads are typed in `benchmarks.schema`.
"""

from ..schema import NOT_JUDGED
from .construction import BUILD_TARGETS, construction_section, construction_targets
from .containers import containers_section, containers_targets
from .document import render
from .files import default_out_dir, jsonable, results_dir, write_json
from .format import (
    AUTO_JIT,
    DICT_JIT,
    EQX_FILTER_FILTER,
    EQX_STATIC_FILTER,
    FAIR_TWIN,
    fmt_ratio,
    fmt_stat_us,
    fmt_time_us,
    OP_LABELS,
    REF_IMPL_NOTES,
    REF_IMPLS,
    table,
)
from .plots import IMPL_COLOURS, JIT_HATCHES, JIT_LINES, plot
from .retracing import retrace_contrast_section, retrace_verdict, retracing_section
from .summary import (
    PARTITIONED_MARK,
    SAME_WITHIN,
    SCALE_MARK,
    SPEED_GROUPS,
    summary_section,
    VERDICT_OPS,
    verdict_section,
)
from .tables import (
    async_section,
    collector_section,
    first_call_section,
    machine_section,
    overview_section,
    real_models_section,
    serialisation_section,
    targets_section,
    training_section,
    tree_ops_section,
)
from .targets import (
    evaluate_targets,
    REAL_INFO_TARGETS,
    real_models_targets,
    REAL_TARGETS,
    serialisation_targets,
    TARGETS_DEPTH,
)

__all__ = [
    "AUTO_JIT",
    "BUILD_TARGETS",
    "DICT_JIT",
    "EQX_FILTER_FILTER",
    "EQX_STATIC_FILTER",
    "FAIR_TWIN",
    "IMPL_COLOURS",
    "JIT_HATCHES",
    "JIT_LINES",
    "NOT_JUDGED",
    "OP_LABELS",
    "PARTITIONED_MARK",
    "REAL_INFO_TARGETS",
    "REAL_TARGETS",
    "REF_IMPLS",
    "REF_IMPL_NOTES",
    "SAME_WITHIN",
    "SCALE_MARK",
    "SPEED_GROUPS",
    "TARGETS_DEPTH",
    "VERDICT_OPS",
    "async_section",
    "collector_section",
    "construction_section",
    "construction_targets",
    "containers_section",
    "containers_targets",
    "default_out_dir",
    "evaluate_targets",
    "first_call_section",
    "fmt_ratio",
    "fmt_stat_us",
    "fmt_time_us",
    "jsonable",
    "machine_section",
    "overview_section",
    "plot",
    "real_models_section",
    "real_models_targets",
    "render",
    "results_dir",
    "retrace_contrast_section",
    "retrace_verdict",
    "retracing_section",
    "serialisation_section",
    "serialisation_targets",
    "summary_section",
    "table",
    "targets_section",
    "training_section",
    "tree_ops_section",
    "verdict_section",
    "write_json",
]
