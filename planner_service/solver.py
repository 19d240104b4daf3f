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
from planner_service.bounds import OPTIMAL_GAP, LowerBound, best_bound, proven_within
from planner_service.codec import seal_plan
from planner_service.cpsat import ProgressCallback, solve_cpsat
from planner_service.infeasibility import explain, memory_reasons
from planner_service.packing_bound import OPTION_MIX_SHARE, option_mix_bound, packing_bound
from planner_service.problem import Choice, Loads, Problem, loads_of
from planner_service.types import (
    CostModel,
    Infeasibility,
    ParameterSharding,
    Perf,
    PlanOptions,
    PlanRequest,
    RankStats,
    Shard,
    ShardingPlan,
    SolverReport,
    SolverStatus,
    gap,
)
from planner_service.warm_start import prepare, warm_start

log = logging.getLogger("shardplan.solver")
MIN_CPSAT_TIME_S = 0.05  # below this, the warm start is the answer
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


def solve(request: PlanRequest, *, on_progress: ProgressCallback | None = None) -> SolveOutcome:
    start = time.perf_counter()
    report = on_progress or (lambda stage, best, bound: None)
    report("enumerate", None, None)
    prepared = prepare(request)
    # The LP is solved in floating point: its "infeasible" is no proof, exact byte totals are.
    if prepared.problem is None or (prepared.relaxation_infeasible and memory_reasons(request)):
        infeasibility = explain(request, prepared.table_problems, SolverStatus.INFEASIBLE)
        return SolveOutcome(None, infeasibility, time.perf_counter() - start)
    problem, groups = prepared.problem, prepared.groups
    assert groups is not None and prepared.bounds is not None
    bounds = prepared.bounds
    report("warm start", None, best_bound(bounds).value)
    warm = warm_start(prepared)
    details: dict[str, object] = {"groups": len(groups), "tables": len(problem.tables)}
    if prepared.relaxation_infeasible:  # a bug in the LP, not a proof: search on
        details["lp_relaxation"] = "infeasible"
        log.warning("the LP relaxation found no solution, but the byte totals fit; searching")
    warm_objective = loads_of(problem, warm).objective if warm is not None else None
    if warm_objective is not None:
        details["warm_start_objective"] = warm_objective
    candidates = [warm] if warm is not None else []
    proven_infeasible = False
    options = request.options
    search_time_s = options.time_limit_s
    if warm is not None and _worth_searching(warm_objective, bounds, options):
        assert warm_objective is not None
        mix = option_mix_bound(
            problem,
            groups,
            warm_objective,
            time_limit_s=options.time_limit_s * OPTION_MIX_SHARE,
            seed=options.seed,
        )
        if mix is not None:
            bounds.append(mix)
    if warm is not None and _worth_searching(warm_objective, bounds, options):
        assert warm_objective is not None
        report("packing bound", warm_objective, best_bound(bounds).value)
        packing = packing_bound(
            problem,
            groups,
            warm_objective,
            time_limit_s=options.time_limit_s,
            seed=options.seed,
            hint=warm,
            lower_bound=best_bound(bounds).value,
            gap_limit=options.gap_limit,
        )
        if packing is not None:
            if packing.bound is not None:
                bounds.append(packing.bound)
            if packing.plan is not None:
                candidates.append(packing.plan)
                details["packing_objective"] = loads_of(problem, packing.plan).objective
            details["packing_deterministic_s"] = packing.deterministic_time_s
            # The search gets its share of what the relaxation left of the time limit.
            search_time_s = max(0.0, options.time_limit_s - packing.deterministic_time_s)
    hint, best_objective = None, None
    if candidates:
        hint, hint_loads = _best(problem, candidates)
        best_objective = hint_loads.objective
    if _worth_searching(best_objective, bounds, options):
        result = solve_cpsat(
            problem,
            groups,
            hint,
            time_limit_s=search_time_s,
            seed=options.seed,
            lower_bound=best_bound(bounds).value,
            gap_limit=options.gap_limit,
            on_progress=report,
        )
        details.update(
            cpsat_status=result.status,
            cpsat_exact=result.exact,
            cpsat_variables=result.num_variables,
            cpsat_runs=result.runs,
            cpsat_deterministic_s=result.deterministic_time_s,
            cpsat_wall_s=result.wall_time_s,
        )
        if result.bound is not None:
            bounds.append(LowerBound(result.bound, "cp-sat"))
        if result.choices is not None:
            candidates.append(result.choices)
        proven_infeasible = result.status == "INFEASIBLE" and result.exact
    if not candidates:
        status = SolverStatus.INFEASIBLE if proven_infeasible else SolverStatus.NO_SOLUTION_IN_TIME
        infeasibility = explain(request, [], status)
        return SolveOutcome(None, infeasibility, time.perf_counter() - start, details)
    choices, loads = _best(problem, candidates)
    plan = build_plan(problem, choices, loads, best_bound(bounds))
    return SolveOutcome(plan, None, time.perf_counter() - start, details, rank_io(problem, choices))


def _worth_searching(
    warm_objective: float | None, bounds: list[LowerBound], options: PlanOptions
) -> bool:
    if options.time_limit_s < MIN_CPSAT_TIME_S:
        return False
    if warm_objective is None:
        return True
    return not proven_within(warm_objective, best_bound(bounds).value, options.gap_limit)


def _best(problem: Problem, candidates: list[list[Choice]]) -> tuple[list[Choice], Loads]:
    """The fastest candidate, ties to the lower peak HBM, then the earlier candidate."""
    scored = [(loads_of(problem, c), i, c) for i, c in enumerate(candidates)]
    loads, _, choices = min(scored, key=lambda item: (item[0].objective, item[0].peak_hbm, item[1]))
    return choices, loads


# --------------------------------------------------------------------------- the plan


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
    problem: Problem, choices: list[Choice], loads: Loads, bound: LowerBound
) -> ShardingPlan:
    tables = {}
    components = np.zeros((problem.world_size, len(PERF_FIELDS)))
    for entry, choice in zip(problem.tables, choices, strict=True):
        option = entry.options[choice.option]
        shards = []
        for offsets, shard, rank in zip(option.offsets(), option.shards, choice.ranks, strict=True):
            shards.append(Shard(offsets=offsets, sizes=shard.sizes, rank=rank))
            perf = shard.perf[problem.class_of_rank[rank]]
            components[rank] += [getattr(perf, name) for name in PERF_FIELDS]
        tables[entry.table.name] = ParameterSharding(
            sharding_type=option.sharding_type,
            compute_kernel=option.compute_kernel,
            ranks=list(choice.ranks),
            shards=shards,
            cache_load_factor=option.cache_load_factor,
        )
    rank_stats = [
        RankStats(
            rank=rank,
            hbm_bytes=int(loads.hbm[rank]),
            ddr_bytes=int(loads.ddr[rank]),
            perf=Perf(
                **dict(zip(PERF_FIELDS, map(float, components[rank]), strict=True)),
                total=float(loads.perf[rank]),
            ),
        )
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
    )
    return seal_plan(
        request=problem.request,
        planner_version=PLANNER_VERSION,
        tables=tables,
        rank_stats=rank_stats,
        solver=report,
    )
