"""The service's response documents, shared by the service (which writes them and
documents them in its OpenAPI schema) and the HTTP client (which reads them): one
definition of each, in the vocabulary that both import. The check's report is also what
``shardplan check --format json`` prints (``planner_service/check`` computes it).

Unknown fields are ignored when reading, so a client keeps working against a newer
service that adds fields.
"""

from __future__ import annotations

import json
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from planner_service.plan.json_data import JsonObject
from planner_service.plan.types import (
    ComputeKernel,
    CostModel,
    Infeasibility,
    ShardingPlan,
    SmallestFixes,
    SolverStatus,
    Violation,
)

# GET /v1/plans and GET /v1/aliases: page sizes.
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500


class _Document(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class RankHeadroom(_Document):
    rank: int
    hbm_used_bytes: int
    hbm_usable_bytes: int = Field(description="after hbm_headroom_fraction and dense bytes")
    hbm_free_bytes: int
    ddr_used_bytes: int
    ddr_usable_bytes: int
    ddr_free_bytes: int
    perf_total_ms: float


# The check's documents: ``shardplan check --format json`` prints a ``CheckReport`` (its
# what-if questions, ``planner_service/check/what_if.py``, one per cell), and POST
# /v1/check answers a ``CheckResult``, the same report and what the service's store knows.
# 1.x only adds fields; a field's meaning never changes within a major version.
CHECK_SCHEMA_VERSION = "1.1"
TIGHTEST_SHOWN = 3  # ranks in a headroom's ``tightest``


class MemoryTier(StrEnum):
    """Where tables live: HBM on cuda, DDR on cpu (which has no HBM)."""

    HBM = "hbm"
    DDR = "ddr"


class Verdict(StrEnum):
    FITS = "fits"
    OVER_LIMIT = "over_limit"  # a plan exists, but a rank uses more than the limit allows
    NO_PLAN = "no_plan"
    GATE_FAILED = "gate_failed"  # a plan within the limit, but another gate fails


class BindingKind(StrEnum):
    """What binds a plan (``HBM``, ``DDR``, ``PERF``, ``MAX_HBM_UTILIZATION``) or stops any
    (``MEMORY``, ``CONSTRAINTS``, ``TIME_LIMIT``: from the first reason of the report)."""

    HBM = "hbm"
    DDR = "ddr"
    PERF = "perf"
    MAX_HBM_UTILIZATION = "max_hbm_utilization"
    MEMORY = "memory"
    CONSTRAINTS = "constraints"
    TIME_LIMIT = "time_limit"


class TierUse(_Document):
    """One rank's use of one tier."""

    rank: int
    used_bytes: int
    usable_bytes: int
    free_bytes: int
    utilization: float = Field(description="used / usable (0 when nothing is usable)")


class Headroom(_Document):
    """The spread of free bytes over the ranks, in the tier tables live in."""

    tier: MemoryTier
    least: TierUse
    median: TierUse
    most: TierUse
    tightest: list[TierUse] = Field(description=f"the {TIGHTEST_SHOWN} least free, least first")


class Binding(_Document):
    """What limits the plan, or what stops any plan."""

    kind: BindingKind
    rank: int | None = None
    message: str


class KernelPlacement(_Document):
    """The tables a plan puts on one compute kernel, and where their bytes live."""

    compute_kernel: ComputeKernel
    tables: int
    hbm_bytes: int = Field(description="weights, optimizer state, caches and buffers in HBM")
    ddr_bytes: int = Field(description="the same in host memory (DDR)")
    outside_hbm: bool = Field(
        description="the kernel keeps the tables' weights in host memory (UVM), read over "
        "the host link: fused_uvm and fused_uvm_caching on cuda"
    )


class TableOutsideHbm(_Document):
    """A table whose weights left HBM: its kernel and bytes per tier."""

    name: str
    compute_kernel: ComputeKernel
    hbm_bytes: int
    ddr_bytes: int


class Placement(_Document):
    """Where every byte of a plan lives: per compute kernel, and the tables that left HBM
    (on cuda; a cpu plan keeps everything in DDR and has no HBM to leave)."""

    kernels: list[KernelPlacement] = Field(description="by kernel, fused first")
    outside_hbm: list[TableOutsideHbm] = Field(
        description="tables whose weights live in host memory, most bytes first"
    )


class GateName(StrEnum):
    """The check's gates, each named as the CLI option (and POST /v1/check parameter) that
    sets it."""

    MAX_HBM_UTILIZATION = "max_hbm_utilization"
    REQUIRE_KERNELS = "require_kernels"
    MAX_STEP_MS = "max_step_ms"
    MAX_REGRESSION = "max_regression"


class GateResult(_Document):
    """One gate: its limit, the value the plan has, and whether it passed."""

    gate: GateName
    passed: bool
    limit: float | list[ComputeKernel] = Field(
        description="the limit set: a fraction (max_hbm_utilization, max_regression), "
        "milliseconds (max_step_ms) or the kernels allowed (require_kernels)"
    )
    value: float | None = Field(
        description="the plan's value: the fullest rank's utilization, the predicted step "
        "time (ms), its change over the baseline (a fraction), or the tables on other "
        "kernels; null without a plan"
    )
    message: str


class KernelMove(_Document):
    """A table the plan puts on another compute kernel than the baseline did."""

    name: str
    baseline: ComputeKernel
    plan: ComputeKernel


class BaselineComparison(_Document):
    """The plan against a baseline (the plan running today): predicted step time, the
    fullest rank's memory, tables that change kernel, and the bytes that would move."""

    plan_id: str = Field(description="the baseline's id")
    source: str = Field(description="where it came from: a file, a plan id or alias:NAME")
    repriced: bool = Field(
        description="true: the baseline priced under this request's cost model (every one of "
        "its tables is in the request with the same shape); false: the figures it was "
        "planned with"
    )
    still_valid: bool = Field(
        description="the baseline is a valid plan of this request (it places every table, "
        "within every rank's memory)"
    )
    step_ms: float = Field(description="the baseline's predicted step time (slowest rank)")
    plan_step_ms: float = Field(description="the plan's predicted step time")
    change: float = Field(description="plan_step_ms / step_ms - 1 (0.05: 5% slower)")
    max_hbm_bytes: int = Field(description="the baseline's fullest rank, HBM")
    plan_max_hbm_bytes: int
    max_ddr_bytes: int = Field(description="the baseline's fullest rank, DDR")
    plan_max_ddr_bytes: int
    outside_hbm: int = Field(description="the baseline's tables outside HBM")
    plan_outside_hbm: int
    kernel_moves: list[KernelMove] = Field(description="tables that change kernel, by name")
    tables_added: int
    tables_removed: int
    moved_bytes: int = Field(description="weights and optimizer state that move between ranks")
    imported: bool | None = Field(
        None,
        description="true when the baseline is a plan stored by PUT /v1/plans/{plan_id} (made "
        "elsewhere): its solver status, lower bound and gap are the importer's word, "
        "unverified here (its step time was recomputed when it was stored); absent otherwise",
    )

    @model_serializer(mode="wrap")
    def _omit_unless_imported(self, handler: SerializerFunctionWrapHandler) -> JsonObject:
        return _unless_false(handler(self), "imported")


def _unless_false(data: JsonObject, field: str) -> JsonObject:
    """``data`` without ``field`` unless it is true: a mark absent from the documents of
    the common case, so they read as before it existed."""
    if not data.get(field):
        data.pop(field, None)
    return data


class CheckGates(_Document):
    """The gates a check applies beside "a plan exists" (all optional): POST /v1/check's
    query parameters and ``shardplan check``'s options of the same names."""

    max_hbm_utilization: float | None = Field(None, gt=0, le=1)
    require_kernels: list[ComputeKernel] | None = Field(None, min_length=1)
    max_step_ms: float | None = Field(None, gt=0, le=1e9)
    max_regression: float | None = Field(None, ge=0, le=100)


class MarginFix(_Document):
    """Planning for the margin: the ``hbm_headroom_fraction`` that shrinks every rank's
    usable memory to ``max_hbm_utilization`` of today's, and what the planner makes of the
    request with it: a plan (its max-rank perf), or none (and the fixes it found)."""

    hbm_headroom_fraction: float
    fits: bool
    objective: float | None = None
    fixes: SmallestFixes | None = None


class CheckReport(_Document):
    """Does a request fit, how much room each rank has left and what binds; or why no plan
    exists and the smallest fixes (``shardplan check --format json``)."""

    schema_version: str = CHECK_SCHEMA_VERSION
    fits: bool = Field(description="the check passes: a plan, within max_hbm_utilization")
    verdict: Verdict
    status: SolverStatus
    world_size: int
    tables: int
    plan_id: str | None = Field(
        description="the plan's id (POST /v1/plans stores exactly this plan); null without one"
    )
    objective: float | None = Field(None, description="max-rank perf, ms per iteration")
    lower_bound: float | None = None
    gap: float | None = None
    max_hbm_utilization: float | None = None
    headroom: Headroom | None = None
    binding: Binding
    over_limit: list[TierUse] = Field(default_factory=list)
    margin_fix: MarginFix | None = None
    ranks: list[RankHeadroom] = Field(default_factory=list)
    infeasibility: Infeasibility | None = None
    # 1.1: where the bytes live, the predicted step time, DDR headroom, gates and baseline.
    passed: bool | None = Field(
        None, description="every gate passes (and a plan exists): exit 0; null before 1.1"
    )
    step_ms: float | None = Field(
        None, description="predicted step time: the slowest rank's perf (ms per iteration)"
    )
    cost_model: CostModel | None = Field(None, description="the model that predicted it")
    device_profile: str | None = Field(
        None, description="the calibrated model's device profile (its name)"
    )
    placement: Placement | None = None
    ddr_headroom: Headroom | None = Field(
        None, description="on cuda, the spread of free host memory (headroom is HBM's)"
    )
    gates: list[GateResult] = Field(default_factory=list)
    baseline: BaselineComparison | None = None


class CheckResult(CheckReport):
    """POST /v1/check: the check's report, and what the service's store knows of its plan."""

    stored: bool = Field(description="a plan for this request is already stored")
    min_hbm_free_bytes: int | None = Field(None, description="the tightest rank's free HBM")


class ValidateResult(_Document):
    """POST /v1/validate: every way the plan breaks the request (none when valid)."""

    valid: bool
    violations: list[Violation]


class AliasRecord(_Document):
    """One change of an alias; in a list of aliases, the change that set it last."""

    name: str
    version: int = Field(description="1 for the first change, then +1 per change")
    plan_id: str
    previous_plan_id: str | None
    actor: str = Field(description="the token name that made the change (or anonymous)")
    comment: str | None
    changed_at: str = Field(description="ISO 8601, UTC")


class AliasHistory(_Document):
    name: str
    changes: list[AliasRecord] = Field(description="newest first")


class AliasPage(_Document):
    """GET /v1/aliases: aliases by name (bytewise order), each as its latest change."""

    aliases: list[AliasRecord]
    next: str | None = Field(description="pass as `after` for the next page; null on the last page")


class PlanSummary(_Document):
    """What a list shows of a plan, without the plan."""

    world_size: int
    num_tables: int
    objective: float = Field(description="the slowest rank's perf, ms (solver.objective)")
    status: SolverStatus

    @classmethod
    def of(cls, plan: ShardingPlan) -> PlanSummary:
        return cls(
            world_size=plan.world_size,
            num_tables=len(plan.tables),
            objective=plan.solver.objective,
            status=plan.solver.status,
        )

    @classmethod
    def of_stored(cls, data: bytes) -> PlanSummary:
        """From a stored plan's bytes, read as JSON only: the store holds only plans that
        were validated when they were stored."""
        document = json.loads(data)
        solver = document["solver"]
        return cls(
            world_size=document["world_size"],
            num_tables=len(document["tables"]),
            objective=solver["objective"],
            status=solver["status"],
        )


class PlanListing(_Document):
    plan_id: str
    planner_version: str = Field(description="the planner that made the plan")
    created_at: str = Field(description="when this service stored it: ISO 8601, UTC")
    summary: PlanSummary
    imported: bool | None = Field(
        None,
        description="true for a plan stored by PUT /v1/plans/{plan_id} (made elsewhere): "
        "its solver report (status, bound, gap) is the importer's word, unverified here; "
        "absent for plans this service's planner made",
    )

    @model_serializer(mode="wrap")
    def _omit_unless_imported(self, handler: SerializerFunctionWrapHandler) -> JsonObject:
        return _unless_false(handler(self), "imported")


class PlanPage(_Document):
    """GET /v1/plans: stored plans, newest first."""

    plans: list[PlanListing]
    next: str | None = Field(description="pass as `after` for the next page; null on the last page")


class SolveJobStatus(StrEnum):
    """Where a job is: ``queued`` (admitted, waiting for a solver process), ``running``,
    and the ends: ``done`` (``plan_id`` names the stored plan), ``no_plan`` (``problem``
    says why none exists, with the infeasibility report, as a sync POST's 422) and
    ``failed`` (``problem``: the solve overran, its process died, or it was abandoned)."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    NO_PLAN = "no_plan"
    FAILED = "failed"

    @property
    def ended(self) -> bool:
        return self not in (SolveJobStatus.QUEUED, SolveJobStatus.RUNNING)


class SolveJob(_Document):
    """GET /v1/solves/{job_id} (and each event of its stream): one asynchronous solve.

    The job id is derived from the request's hash and the planner version, so the same
    request always names the same job (and shares its solve)."""

    job_id: str
    status: SolveJobStatus
    request_hash: str
    planner_version: str
    stage: str | None = Field(
        None, description="the solver's stage: enumerate, warm start, packing bound, cp-sat"
    )
    objective: float | None = Field(None, description="the best plan's objective so far, ms")
    lower_bound: float | None = Field(None, description="the best lower bound so far, ms")
    gap: float | None = Field(None, description="(objective - lower_bound) / objective")
    elapsed_s: float | None = Field(None, description="since a solver process took it")
    time_limit_s: float
    attempts: int = Field(description="times a service process started it (resumed: > 1)")
    created_at: str = Field(description="ISO 8601, UTC")
    updated_at: str = Field(description="ISO 8601, UTC")
    plan_id: str | None = Field(None, description="when done: the stored plan")
    plan_url: str | None = Field(None, description="when done: /v1/plans/{plan_id}")
    # The problem document as the service wrote it (its model, with extensions that vary by
    # error, is the service's ``problems.Problem``): carried through as JSON.
    problem: JsonObject | None = Field(
        None, description="when no_plan or failed: the RFC 9457 problem a sync POST answers"
    )
