"""Plan a request end to end, one stage per module:

    enumerate, fit, estimate (``costs/``) -> prepare: problem and LP (``prepare.py``,
    ``bounds/lp.py``) -> construct (``construct.py``) -> improve (``improve.py``) ->
    bound: option mix, packing (``bounds/``) -> search (``cpsat/``) -> emit (``emit.py``),
    or explain why there is no plan (``explain.py``)

``solve`` is the one entry point the CLI and the service call. It returns either a sealed
``ShardingPlan`` (which passes ``validate.validator.validate_plan``) or an
``Infeasibility`` explaining why no plan exists and what would fix it, plus the wall time,
which is kept out of the plan so that the same request always yields byte-identical plans.
"""

from __future__ import annotations

import copy
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from planner_service.costs.calibrated import fixed_perf
from planner_service.plan.errors import FieldProblem, InputError
from planner_service.plan.transfers import migration_section
from planner_service.plan.types import (
    BoundSource,
    Infeasibility,
    InfeasibilityCode,
    InfeasibilityReason,
    PlanOptions,
    PlanRequest,
    ShardingPlan,
    ShardingType,
    SolverStatus,
)
from planner_service.solve.bounds.configuration import (
    Instance,
    Progress,
    configuration_bound,
    instance_of,
    memory_tight,
)
from planner_service.solve.bounds.host_levels import HOST_LEVELS_WALL_SHARE, host_level_bound
from planner_service.solve.bounds.option_mix import OPTION_MIX_SHARE, option_mix_bound
from planner_service.solve.bounds.packing import packing_bound
from planner_service.solve.bounds.simple import (
    OPTIMAL_GAP,
    LowerBound,
    best_bound,
    proven_within,
)
from planner_service.solve.collector import paused_collector
from planner_service.solve.cpsat.search import (
    CpSatResult,
    CpSatStatus,
    ProgressCallback,
    solve_cpsat,
)
from planner_service.solve.deadline import AfterSolve, Deadline, OutOfTime
from planner_service.solve.emit import build_plan, rank_io
from planner_service.solve.explain import explain, explanation_time_s, memory_reasons
from planner_service.solve.fixed_costs import (
    Variant,
    bound_with_fixed_costs,
    fixed_cost_exclusions,
    types_of,
)
from planner_service.solve.incremental import (
    Moves,
    best_within,
    incremental_plan,
    kept_choices,
    moves_of_plan,
    over_cap,
    revert_towards_previous,
)
from planner_service.solve.prepare import Prepared, prepare, raise_bound, warm_start
from planner_service.solve.problem import Choice, Loads, Problem, loads_of

log = logging.getLogger("shardplan.solver")
MIN_CPSAT_TIME_S = 0.05  # below this, the warm start is the answer
# Re-planning from a previous plan: the share of the time limit kept from the search for
# putting the fastest plan's tables back where they were (``incremental.py``).
REVERT_SHARE = 0.1
# Sealing a plan (its per-rank loads, then building, hashing and validating its JSON) after
# the search. Schema 2.0 writes tables as runs, so only the per-rank loads still visit
# every shard: measured on the idle 2-core machine, 0.16 s for 290,060 shards of 5,384
# tables on 1,024 ranks and 0.53 s for 2,079,165 shards of 10,000 tables on 4,096 ranks
# (shard lists took 2.2 s for 315,524 shards under load). About three times the per-shard
# share and twice the per-table share, for a loaded machine. The search stops this much
# before the deadline (a plan's shard count barely varies).
SEAL_S_PER_SHARD = 0.5e-6
SEAL_S_PER_TABLE = 40e-6


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
    given, replaces that clock: tests and relaxed re-solves pass ``Deadline.never()``).
    The cyclic garbage collector is paused throughout (``collector.py``): on 5,384
    memory-tight tables of distinct shapes over 1,024 ranks its passes over the prepared
    problem took 1.8 s of a 10 s limit, one of them (0.5 s) while sealing the plan, after
    the search had stopped, so the answer came at 10.7 s; a 60 s solve there leaves no
    cycle for it to collect."""
    with paused_collector():
        return _solve(request, on_progress, deadline)


def _solve(
    request: PlanRequest, on_progress: ProgressCallback | None, deadline: Deadline | None
) -> SolveOutcome:
    start = time.perf_counter()
    deadline = deadline or Deadline.for_time_limit(request.options.time_limit_s)
    # The answer's deadline, for explaining a request without a plan; the search keeps the
    # explanation's time before it until a plan exists (then it keeps the seal's instead).
    answer = copy.copy(deadline)
    explaining_s = explanation_time_s(len(request.tables))
    deadline.reserve(explaining_s)
    report = on_progress or (lambda stage, best, bound: None)
    report("enumerate", None, None)
    try:
        prepared = prepare(request, deadline)
    except OutOfTime:
        return SolveOutcome(None, _unprepared(request), time.perf_counter() - start)
    if prepared.problem is None or _proven_infeasible(request, prepared, deadline):
        infeasibility = explain(
            request, prepared.table_problems, SolverStatus.INFEASIBLE, answer, prepared.fitted
        )
        return SolveOutcome(None, infeasibility, time.perf_counter() - start)
    raise_bound(prepared, deadline)
    assert prepared.problem is not None
    moves = _moves(prepared.problem, request)
    exclusions = [frozenset()] if moves is not None else fixed_cost_exclusions(prepared.problem)
    # Each variant of the calibrated model's fixed costs searches with its share of the
    # time (and of the deterministic budget, so that equal requests give equal plans).
    share = 1.0 / len(exclusions)
    options = request.options
    if len(exclusions) > 1:
        options = options.model_copy(update={"time_limit_s": options.time_limit_s * share})
    search = _Search(
        prepared, options, deadline.share(share) if share < 1 else deadline, explaining_s
    )
    incremental = incremental_plan(search.problem, moves, deadline) if moves else None
    after_search = copy.copy(deadline)  # the reverting stage's, past the search's
    if moves is not None:
        deadline.reserve(REVERT_SHARE * request.options.time_limit_s)
    candidates = search.run(report) + ([incremental] if incremental is not None else [])
    if not candidates:
        status = (
            SolverStatus.INFEASIBLE
            if search.proven_infeasible
            else SolverStatus.NO_SOLUTION_IN_TIME
        )
        infeasibility = explain(request, [], status, answer, prepared.fitted)
        return SolveOutcome(None, infeasibility, time.perf_counter() - start, search.details)
    migration = None
    problem = search.problem
    variants = [Variant(frozenset(), problem, bound=best_bound(search.bounds))]
    if moves is None:
        choices, loads = _best(search.problem, candidates, search.loads)
        variants[0].choices = choices
        variants += _restricted_variants(request, options, exclusions[1:], deadline)
        best = min((v for v in variants if v.choices is not None), key=lambda v: v.total(request))
        assert best.problem is not None and best.choices is not None
        problem, choices = best.problem, best.choices
        loads = search.loads(choices) if problem is search.problem else loads_of(problem, choices)
    else:
        kept = kept_choices(search.problem, moves)
        fastest = _best(search.problem, candidates, search.loads)[0]
        # Sealing, and counting the moves of the plan chosen, come after it.
        after_search.reserve(2 * _seal_time_s(search.problem, deadline.after, fastest))
        candidates.append(
            revert_towards_previous(search.problem, moves, fastest, kept, after_search)
        )
        deadline.reached |= after_search.reached
        picked = best_within(search.problem, moves, candidates)
        if picked.choices is None or picked.loads is None:
            assert moves.cap is not None
            infeasibility = over_cap(moves.cap, picked.least_moved)
            return SolveOutcome(None, infeasibility, time.perf_counter() - start, search.details)
        choices, loads = picked.choices, picked.loads
        migration = migration_section(
            moves_of_plan(search.problem, moves.previous, choices),
            moves.previous.plan_id,
            moves.cap,
            request.options.move_cost_ms_per_gib,
        )
        search.details["incremental_objective"] = (
            loads_of(search.problem, incremental).objective if incremental else None
        )
    fixed = fixed_perf(request, types_of(problem, choices))
    plan = build_plan(
        problem,
        choices,
        loads,
        bound_with_fixed_costs(request, variants),
        deadline.reached,
        migration=migration,
        fixed_costs=fixed,
    )
    io = rank_io(problem, choices)
    return SolveOutcome(plan, None, time.perf_counter() - start, search.details, io)


def _proven_infeasible(request: PlanRequest, prepared: Prepared, deadline: Deadline) -> bool:
    """Whether exact byte totals prove what the LP found: it is solved in floating point,
    so its "infeasible" is no proof. Totals cut by the deadline prove nothing."""
    if not prepared.relaxation_infeasible:
        return False
    try:
        return bool(memory_reasons(request, prepared.fitted, deadline))
    except OutOfTime:
        return False


def _unprepared(request: PlanRequest) -> Infeasibility:
    """No plan because the time limit ended before the problem was even built: say so with
    the numbers, at once (explaining would need the same preparation)."""
    options = request.options
    reason = InfeasibilityReason(
        code=InfeasibilityCode.TIMED_OUT,
        message=(
            f"preparing the request's {len(request.tables)} tables on "
            f"{request.topology.world_size} ranks (enumerating, pricing and fitting their "
            f"sharding options) did not finish within options.time_limit_s = "
            f"{options.time_limit_s:g} s, which counts from the command's start or the "
            "request's arrival (imports, reading and decoding the request too), so no plan "
            "was searched for; give a longer time_limit_s, or fewer tables (or tables that "
            "share shapes)"
        ),
    )
    return Infeasibility(status=SolverStatus.NO_SOLUTION_IN_TIME, reasons=[reason])


def _restricted_variants(
    request: PlanRequest,
    options: PlanOptions,
    exclusions: list[frozenset[ShardingType]],
    deadline: Deadline,
) -> list[Variant]:
    """The calibrated model's plans without some sharding types (``fixed_costs.py``), each
    searched in its share of what is left of the time."""
    variants = []
    for i, excluded in enumerate(exclusions):
        own = deadline.share(1.0 / (len(exclusions) - i))
        try:
            prepared = prepare(request, own, exclude=excluded)
        except OutOfTime:  # fewer variants only weaken the bound (``fixed_costs.py``)
            deadline.reached = True
            break
        if prepared.problem is None:  # some table has only excluded types
            variants.append(Variant(excluded, None, None))
            continue
        raise_bound(prepared, own)
        search = _Search(prepared, options, own)
        candidates = search.run(lambda stage, best, bound: None)
        variant = Variant(excluded, search.problem, best_bound(search.bounds))
        if candidates:
            variant.choices = _best(search.problem, candidates)[0]
        variants.append(variant)
        deadline.reached |= own.reached
    return variants


class _Search:
    """The stages after preparing, sharing the request's bounds (each stage adds the bound
    it proves), its deadline and the details reported beside the plan."""

    def __init__(
        self,
        prepared: Prepared,
        options: PlanOptions,
        deadline: Deadline,
        explaining_s: float = 0.0,
    ) -> None:
        assert prepared.problem is not None and prepared.groups is not None
        assert prepared.bounds is not None
        self.prepared = prepared
        self.problem, self.groups, self.bounds = prepared.problem, prepared.groups, prepared.bounds
        self.options = options
        self.deadline = deadline
        self.details: dict[str, object] = {
            "groups": len(self.groups),
            "tables": len(self.problem.tables),
        }
        self.search_time_s = options.time_limit_s
        self.proven_infeasible = False
        self.explaining_s = explaining_s  # kept before the deadline while no plan exists
        # Each plan's loads, computed once: on 5,384 tables (291,000 shards) a computation
        # takes 50 ms, and the stages after the local search asked for the same plan's nine
        # times, past its deadline (a 10 s limit answered in 10.58 s).
        self._loads: dict[int, tuple[list[Choice], Loads]] = {}
        self.configuration: Instance | None = None
        if memory_tight(self.problem, self.groups):
            self.configuration = instance_of(self.problem, self.groups)

    def run(self, report: ProgressCallback) -> list[list[Choice]]:
        """Every plan the stages find: the warm start (construct, improve), the packing
        relaxation's, and CP-SAT's."""
        report("warm start", None, best_bound(self.bounds).value)

        # Sealing the plan takes time that grows with its shards: kept once a plan exists,
        # beyond what is kept already for explaining why there is none.
        def seal(choices: list[Choice]) -> float:
            sealing_s = _seal_time_s(self.problem, self.deadline.after, choices)
            return max(0.0, sealing_s - self.explaining_s)

        bounds_s = OPTION_MIX_SHARE * self.options.time_limit_s  # its share, after
        background = self.configuration_in_background(bounds_s)
        try:
            warm = warm_start(self.prepared, self.deadline, seal, bounds_s)
            if background is not None:  # it ends where the local search had to (sealing kept)
                background.deadline.end_with(self.deadline, bounds_s)
            candidates = [warm] if warm is not None else []
            if warm is not None:
                self.details["warm_start_objective"] = self.loads(warm).objective
                candidates += self.relaxations(warm, report, background)
        finally:  # done, not wanted, or the solve failed: it never outlives the solve
            if background is not None:
                background.abandon()
        if self.prepared.relaxation_infeasible:  # a bug in the LP, not a proof: search on
            self.details["lp_relaxation"] = "infeasible"
            log.warning("the LP relaxation found no solution, but the byte totals fit; searching")
        hint = _best(self.problem, candidates, self.loads)[0] if candidates else None
        if self.worth_it(hint):
            result = self.cpsat(hint, report)
            if result.choices is not None:
                candidates.append(result.choices)
            self.proven_infeasible = result.status is CpSatStatus.INFEASIBLE and result.exact
        return candidates

    def loads(self, plan: list[Choice]) -> Loads:
        """``loads_of`` the plan, once per plan (the stages never change a plan's list)."""
        known = self._loads.get(id(plan))
        if known is None or known[0] is not plan:
            known = (plan, loads_of(self.problem, plan))
            self._loads[id(plan)] = known
        return known[1]

    def worth_it(self, plan: list[Choice] | None) -> bool:
        """Whether searching on could still improve ``plan``: time is left, and the plan is
        not proven within the gap limit yet."""
        return self.worth_it_below(self.loads(plan).objective if plan is not None else math.inf)

    def relaxations(
        self, warm: list[Choice], report: ProgressCallback, background: Background | None = None
    ) -> list[list[Choice]]:
        """The option-mix, host-level and packing relaxations: their bounds, and the
        packing plan."""
        options, problem = self.options, self.problem
        warm_objective = self.loads(warm).objective
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
        if background is not None:
            # Its deadline is the local search's: what it proved by then counts even when
            # no time is left for more; it is abandoned only once the plan needs no bound.
            bound = best_bound(self.bounds).value
            if proven_within(warm_objective, bound, options.gap_limit):
                background.abandon()
            else:
                self.configuration_bound(background, warm_objective, report)
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
        best = warm_objective
        if packing is not None and packing.plan is not None:
            best = min(best, self.loads(packing.plan).objective)
        self.host_levels(best)
        if packing is None:
            self.details["packing"] = "skipped"
            return []
        self.details["packing"] = "ran"
        if packing.bound is not None:
            self.bounds.append(packing.bound)
        self.details["packing_deterministic_s"] = packing.deterministic_time_s
        # The search gets its share of what the relaxation left of the time limit.
        self.search_time_s = max(0.0, options.time_limit_s - packing.deterministic_time_s)
        if packing.plan is None:
            return []
        self.details["packing_objective"] = loads_of(problem, packing.plan).objective
        return [packing.plan]

    def configuration_in_background(self, bounds_s: float) -> Background | None:
        """The configuration bound (``bounds/configuration.py``) on memory-tight requests
        with few shard sizes, started beside the warm start: its solvers (GLOP, CP-SAT,
        SCIP) release the GIL, so on a machine with two cores it costs the local search
        little (5,384 tables on 1,024 ranks: about 10 s to prove 5.7% over the other
        bounds, more than a 10 s limit could spare it). It stops where the local search
        does, at the latest."""
        if self.configuration is None:
            return None
        stage = copy.copy(self.deadline)
        stage.reached = False
        stage.reserve(bounds_s)
        instance, lower = self.configuration, best_bound(self.bounds).value
        progress = Progress()
        return Background(
            lambda: configuration_bound(
                self.problem, self.groups, lower, math.inf, stage, instance, progress=progress
            ),
            stage,
            progress.cancel,
        )

    def configuration_bound(
        self, background: Background, upper: float, report: ProgressCallback
    ) -> None:
        """Wait for the configuration bound and add it to the bounds."""
        report("configuration bound", upper, best_bound(self.bounds).value)
        found = background.result()
        self.deadline.reached |= background.deadline.reached
        self.details["configuration"] = "ran"
        if found is not None:
            self.bounds.append(LowerBound(min(found.value, upper), found.source))

    def worth_it_below(self, objective: float) -> bool:
        """``worth_it`` for a plan of ``objective`` (inf: no plan yet)."""
        if self.options.time_limit_s < MIN_CPSAT_TIME_S:
            return False
        bound = best_bound(self.bounds).value
        if math.isfinite(objective) and proven_within(objective, bound, self.options.gap_limit):
            return False
        return not self.deadline.expired()

    def host_levels(self, upper: float) -> None:
        """The host-level bound (``bounds/host_levels.py``), after the packing relaxation:
        the packing search starts from the bounds it started from before this bound
        existed (its floor steers its search, so its plans stay as they were), and CP-SAT
        gets the higher floor."""
        if self.options.time_limit_s < MIN_CPSAT_TIME_S or self.deadline.expired():
            return
        stage = Deadline(self.deadline.cap_s(math.inf, HOST_LEVELS_WALL_SHARE))
        # Its branching on whole numbers stops once the plan is proven within the gap
        # limit (by it or by the bounds before it): it could go on for seconds on a plan
        # no bound needs to prove further. Settling each host's level is quick and runs.
        target = upper * (1 - max(OPTIMAL_GAP, self.options.gap_limit))
        if best_bound(self.bounds).value >= target:
            target = 0.0
        levels = host_level_bound(self.problem, self.groups, upper, target=target, deadline=stage)
        if levels is not None:
            self.bounds.append(levels)

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


class Background:
    """A bound computed in a thread beside the search, until ``deadline`` (or ``cancel``,
    which stops it at once)."""

    def __init__(
        self,
        work: Callable[[], LowerBound | None],
        deadline: Deadline,
        cancel: Callable[[], None] | None = None,
    ) -> None:
        self.deadline = deadline
        self._cancel = cancel
        self._found: LowerBound | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(work,), daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[], LowerBound | None]) -> None:
        try:
            self._found = work()
        except BaseException as error:  # raised again in the thread that waits for it
            self._error = error

    def result(self) -> LowerBound | None:
        """The bound, once the thread is done (by its deadline at the latest)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._found

    @property
    def alive(self) -> bool:
        """Whether its thread still runs."""
        return self._thread.is_alive()

    def abandon(self) -> None:
        """Stop the thread and wait for it: nothing of it may outlive the solve (a solver
        still running in a thread when the interpreter exits aborts the process)."""
        self.deadline.end_now()
        if self._cancel is not None:
            self._cancel()
        self._thread.join()


def _moves(problem: Problem, request: PlanRequest) -> Moves | None:
    """The moved-bytes accounting of an incremental request (``incremental.py``)."""
    options = request.options
    if options.previous_plan is None:
        if options.previous_plan_id is not None:
            problem_ = FieldProblem(
                "options.previous_plan_id",
                "names a stored plan, which only the service can look up; give the plan "
                "itself as options.previous_plan (shardplan plan --previous-plan FILE)",
                options.previous_plan_id,
            )
            raise InputError("request", [problem_])
        return None
    return Moves(problem, options.previous_plan, options)


def _best(
    problem: Problem,
    candidates: list[list[Choice]],
    loads: Callable[[list[Choice]], Loads] | None = None,
) -> tuple[list[Choice], Loads]:
    """The fastest candidate, ties to the lower peak HBM, then the earlier candidate.
    ``loads``: the candidates' loads, when known already (``_Search.loads``)."""
    of = loads or (lambda choices: loads_of(problem, choices))
    scored = [(of(c), i, c) for i, c in enumerate(candidates)]
    best, _, choices = min(scored, key=lambda item: (item[0].objective, item[0].peak_hbm, item[1]))
    return choices, best


def _seal_time_s(problem: Problem, after: AfterSolve, choices: list[Choice]) -> float:
    """What sealing the plan of ``choices`` will take, by its shard count, and what the
    caller does with it after (``after``)."""
    shards = sum(
        len(entry.options[c.option].shards)
        for entry, c in zip(problem.tables, choices, strict=True)
    )
    sealing_s = shards * SEAL_S_PER_SHARD + len(choices) * SEAL_S_PER_TABLE
    return sealing_s + after.time_s(shards, len(choices), problem.world_size)
