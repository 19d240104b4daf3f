"""Plan a request end to end: enumerate -> fit -> bound -> warm start -> option mix ->
packing -> CP-SAT -> plan.

``solve`` is the one entry point the CLI and the service call. It returns either a sealed
``ShardingPlan`` (which passes ``validate_plan``) or an ``Infeasibility`` explaining why no
plan exists and what would fix it, plus the wall time, which is kept out of the plan so
that the same request always yields byte-identical plans.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from planner_service import PLANNER_VERSION
from planner_service.plan.codec import seal_plan_data
from planner_service.plan.types import (
    BoundSource,
    CostModel,
    Infeasibility,
    PlanOptions,
    PlanRequest,
    ShardingPlan,
    SolverReport,
    SolverStatus,
    StopReason,
    gap,
)
from planner_service.solve.bounds.option_mix import OPTION_MIX_SHARE, option_mix_bound
from planner_service.solve.bounds.packing import packing_bound
from planner_service.solve.bounds.simple import OPTIMAL_GAP, LowerBound, best_bound, proven_within
from planner_service.solve.cpsat.search import (
    CpSatResult,
    CpSatStatus,
    ProgressCallback,
    solve_cpsat,
)
from planner_service.solve.deadline import Deadline
from planner_service.solve.explain import explain, memory_reasons
from planner_service.solve.prepare import prepare, warm_start
from planner_service.solve.problem import Choice, Group, Loads, Problem, loads_of

log = logging.getLogger("shardplan.solver")
MIN_CPSAT_TIME_S = 0.05  # below this, the warm start is the answer
# Sealing a plan (building, hashing and validating its JSON) after the search, per shard:
# 41 us measured on large/128 (13,480 shards, 0.56 s) on a loaded 2-core machine. The
# search stops this much before the deadline (a plan's shard count barely varies).
SEAL_S_PER_SHARD = 40e-6
PERF_FIELDS = ("fwd_compute", "fwd_comms", "bwd_compute", "bwd_comms", "prefetch", "input_dist")


@dataclass
class SolveOutcome:
    """A plan or the reason there is none, with what is not part of the plan itself: the
    wall time, per-rank input/output buffer bytes (for reports) and solver details."""

    plan: ShardingPlan | None
    infeasibility: Infeasibility | None
    wall_time_s: float
    details: dict[str, object] = field(default_factory=dict)
    rank_io_bytes: list[tuple[int, int]] = field(default_factory=list)


def solve(
    request: PlanRequest,
    *,
    on_progress: ProgressCallback | None = None,
    deadline: Deadline | None = None,
) -> SolveOutcome:
    """Plan ``request`` within ``options.time_limit_s`` of wall time (``deadline``, when
    given, replaces that clock: tests and relaxed re-solves pass ``Deadline.never()``)."""
    start = time.perf_counter()
    deadline = deadline or Deadline.for_time_limit(request.options.time_limit_s)
    report = on_progress or (lambda stage, best, bound: None)
    report("enumerate", None, None)
    prepared = prepare(request, deadline)
    # The LP is solved in floating point: its "infeasible" is no proof, exact byte totals are.
    if prepared.problem is None or (
        prepared.relaxation_infeasible and memory_reasons(request, prepared.fitted)
    ):
        infeasibility = explain(
            request, prepared.table_problems, SolverStatus.INFEASIBLE, deadline, prepared.fitted
        )
        return SolveOutcome(None, infeasibility, time.perf_counter() - start)
    problem, groups = prepared.problem, prepared.groups
    assert groups is not None and prepared.bounds is not None
    bounds = prepared.bounds
    report("warm start", None, best_bound(bounds).value)
    warm = warm_start(prepared, deadline)
    details: dict[str, object] = {"groups": len(groups), "tables": len(problem.tables)}
    if prepared.relaxation_infeasible:  # a bug in the LP, not a proof: search on
        details["lp_relaxation"] = "infeasible"
        log.warning("the LP relaxation found no solution, but the byte totals fit; searching")
    candidates = [warm] if warm is not None else []
    search = _Search(problem, groups, request.options, bounds, deadline, details)
    if warm is not None:
        details["warm_start_objective"] = loads_of(problem, warm).objective
        shards = sum(
            len(entry.options[c.option].shards)
            for entry, c in zip(problem.tables, warm, strict=True)
        )
        deadline.reserve(shards * SEAL_S_PER_SHARD)
        candidates += search.relaxations(warm, report)
    proven_infeasible = False
    hint = _best(problem, candidates)[0] if candidates else None
    if search.worth_it(hint):
        result = search.cpsat(hint, report)
        if result.choices is not None:
            candidates.append(result.choices)
        proven_infeasible = result.status is CpSatStatus.INFEASIBLE and result.exact
    if not candidates:
        status = SolverStatus.INFEASIBLE if proven_infeasible else SolverStatus.NO_SOLUTION_IN_TIME
        infeasibility = explain(request, [], status, deadline, prepared.fitted)
        return SolveOutcome(None, infeasibility, time.perf_counter() - start, details)
    choices, loads = _best(problem, candidates)
    plan = build_plan(problem, choices, loads, best_bound(bounds), deadline.reached)
    return SolveOutcome(plan, None, time.perf_counter() - start, details, rank_io(problem, choices))


@dataclass
class _Search:
    """The search stages after the warm start, sharing the request's bounds (each stage
    adds the bound it proves), its deadline and the details reported beside the plan."""

    problem: Problem
    groups: list[Group]
    options: PlanOptions
    bounds: list[LowerBound]
    deadline: Deadline
    details: dict[str, object]
    search_time_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.search_time_s = self.options.time_limit_s

    def worth_it(self, plan: list[Choice] | None) -> bool:
        """Whether searching on could still improve ``plan``: time is left, and the plan is
        not proven within the gap limit yet."""
        if self.options.time_limit_s < MIN_CPSAT_TIME_S:
            return False
        if plan is not None:
            objective = loads_of(self.problem, plan).objective
            if proven_within(objective, best_bound(self.bounds).value, self.options.gap_limit):
                return False
        return not self.deadline.expired()

    def relaxations(self, warm: list[Choice], report: ProgressCallback) -> list[list[Choice]]:
        """The option-mix and packing relaxations: their bounds, and the packing plan."""
        options, problem = self.options, self.problem
        warm_objective = loads_of(problem, warm).objective
        if self.worth_it(warm):
            mix = option_mix_bound(
                problem,
                self.groups,
                warm_objective,
                time_limit_s=options.time_limit_s * OPTION_MIX_SHARE,
                seed=options.seed,
                deadline=self.deadline,
            )
            if mix is not None:
                self.bounds.append(mix)
        if not self.worth_it(warm):
            return []
        report("packing bound", warm_objective, best_bound(self.bounds).value)
        packing = packing_bound(
            problem,
            self.groups,
            warm_objective,
            time_limit_s=options.time_limit_s,
            seed=options.seed,
            hint=warm,
            lower_bound=best_bound(self.bounds).value,
            gap_limit=options.gap_limit,
            deadline=self.deadline,
        )
        if packing is None:
            return []
        if packing.bound is not None:
            self.bounds.append(packing.bound)
        self.details["packing_deterministic_s"] = packing.deterministic_time_s
        # The search gets its share of what the relaxation left of the time limit.
        self.search_time_s = max(0.0, options.time_limit_s - packing.deterministic_time_s)
        if packing.plan is None:
            return []
        self.details["packing_objective"] = loads_of(problem, packing.plan).objective
        return [packing.plan]

    def cpsat(self, hint: list[Choice] | None, report: ProgressCallback) -> CpSatResult:
        options = self.options
        result = solve_cpsat(
            self.problem,
            self.groups,
            hint,
            time_limit_s=self.search_time_s,
            seed=options.seed,
            lower_bound=best_bound(self.bounds).value,
            gap_limit=options.gap_limit,
            on_progress=report,
            deadline=self.deadline,
        )
        self.details.update(
            cpsat_status=result.status,
            cpsat_exact=result.exact,
            cpsat_variables=result.num_variables,
            cpsat_runs=result.runs,
            cpsat_deterministic_s=result.deterministic_time_s,
            cpsat_wall_s=result.wall_time_s,
        )
        if result.bound is not None:
            self.bounds.append(LowerBound(result.bound, BoundSource.CP_SAT))
        return result


def _best(problem: Problem, candidates: list[list[Choice]]) -> tuple[list[Choice], Loads]:
    """The fastest candidate, ties to the lower peak HBM, then the earlier candidate."""
    scored = [(loads_of(problem, c), i, c) for i, c in enumerate(candidates)]
    loads, _, choices = min(scored, key=lambda item: (item[0].objective, item[0].peak_hbm, item[1]))
    return choices, loads


# --------------------------------------------------------------------------- the plan


def _stop_reason(plan_gap: float, options: PlanOptions, deadline_reached: bool) -> StopReason:
    """Why the search ended. ``time_limit`` whenever the wall clock cut a stage short, even
    if the plan was then proven optimal: the status says how good the plan is, the stop
    reason whether the same request reproduces it."""
    if deadline_reached:
        return StopReason.TIME_LIMIT
    if plan_gap <= OPTIMAL_GAP:
        return StopReason.OPTIMAL
    if plan_gap <= options.gap_limit:
        return StopReason.GAP_LIMIT
    return StopReason.WORK_BUDGET


def _critical_path(problem: Problem, components: np.ndarray) -> float:
    """Sum over the perf components in the total of their max over ranks: every rank waits
    for the slowest at each collective."""
    if not len(components):
        return 0.0
    counted = [
        i
        for i, name in enumerate(PERF_FIELDS)
        if name != "input_dist" or problem.request.options.cost_model is CostModel.SHARDPLAN
    ]
    return float(components[:, counted].max(axis=0).sum())


def rank_io(problem: Problem, choices: list[Choice]) -> list[tuple[int, int]]:
    """(input id bytes, output embedding bytes) each rank's shards buffer per iteration."""
    io = np.zeros((problem.world_size, 2), dtype=np.int64)
    for entry, choice in zip(problem.tables, choices, strict=True):
        for shard, rank in zip(entry.options[choice.option].shards, choice.ranks, strict=True):
            io[rank] += (shard.storage.input_bytes, shard.storage.output_bytes)
    return [(int(i), int(o)) for i, o in io]


def build_plan(
    problem: Problem,
    choices: list[Choice],
    loads: Loads,
    bound: LowerBound,
    deadline_reached: bool = False,
) -> ShardingPlan:
    """The sealed plan of ``choices``. Built as JSON data and validated once: a plan can
    hold hundreds of thousands of shards, and sealing happens after the deadline."""
    tables: dict[str, dict[str, object]] = {}
    components = np.zeros((problem.world_size, len(PERF_FIELDS)))
    vectors: dict[int, np.ndarray] = {}  # shards of one size share one Perf object
    for entry, choice in zip(problem.tables, choices, strict=True):
        option = entry.options[choice.option]
        ranks = [int(rank) for rank in choice.ranks]
        shards = []
        for offsets, shard, rank in zip(option.offsets(), option.shards, ranks, strict=True):
            shards.append({"offsets": list(offsets), "sizes": list(shard.sizes), "rank": rank})
            perf = shard.perf[problem.class_of_rank[rank]]
            vector = vectors.get(id(perf))
            if vector is None:
                vector = vectors[id(perf)] = np.array([getattr(perf, n) for n in PERF_FIELDS])
            components[rank] += vector
        tables[entry.table.name] = {
            "sharding_type": option.sharding_type.value,
            "compute_kernel": option.compute_kernel.value,
            "ranks": ranks,
            "shards": shards,
            "cache_load_factor": option.cache_load_factor,
        }
    rank_stats = [
        {
            "rank": rank,
            "hbm_bytes": int(loads.hbm[rank]),
            "ddr_bytes": int(loads.ddr[rank]),
            "perf": {
                **dict(zip(PERF_FIELDS, map(float, components[rank]), strict=True)),
                "total": float(loads.perf[rank]),
            },
        }
        for rank in range(problem.world_size)
    ]
    objective = loads.objective
    lower = min(bound.value, objective)
    plan_gap = gap(objective, lower)
    report = SolverReport(
        status=SolverStatus.OPTIMAL if plan_gap <= OPTIMAL_GAP else SolverStatus.FEASIBLE,
        objective=objective,
        lower_bound=lower,
        gap=plan_gap,
        lower_bound_source=bound.source,
        critical_path=_critical_path(problem, components),
        stop_reason=_stop_reason(plan_gap, problem.request.options, deadline_reached),
    )
    return seal_plan_data(
        request=problem.request,
        planner_version=PLANNER_VERSION,
        tables=tables,
        rank_stats=rank_stats,
        solver=report.model_dump(mode="json"),
    )
