"""``shardplan measure``: a plan executed by this runtime on synthetic batches drawn to its
request's shapes, at the plan's world size, each rank's step time and its parts measured
beside the plan's predicted parts (docs/measure.md).

- ``report``: the parts, the result models and the summaries of a rank's steps.
- ``batches``: the synthetic batches.
- ``step``: one rank's collections, sharded, and its timed steps.
- ``launch``: the check that this machine can run the plan, the ranks spawned here or
  joined from torchrun, the report gathered on rank 0.
"""

from runtime.measure.launch import (
    MeasureRefused,
    RankFailed,
    default_device,
    measure_plan,
    measure_plans,
)
from runtime.measure.report import (
    DeviceKind,
    MeasureReport,
    MeasureSettings,
    Part,
    RankMeasurement,
    StepTimes,
)

__all__ = [
    "DeviceKind",
    "MeasureRefused",
    "MeasureReport",
    "MeasureSettings",
    "Part",
    "RankFailed",
    "RankMeasurement",
    "StepTimes",
    "default_device",
    "measure_plan",
    "measure_plans",
]
