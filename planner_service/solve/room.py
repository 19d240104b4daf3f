"""Making room on a rank when memory is fragmented: the construction's (``construct.py``)
way out when a table fits on no rank although all ranks together still have the memory.

Every option of a table needs some HBM on each rank it touches (at a batch of 4,096 per rank
on 1,024 ranks, about 2 GiB of buffers even for a table of 10 rows), so a pass that has
filled every rank to within that of its capacity cannot place the rest, with a terabyte free
in total (issue 37: 5,384 tables on 1,024 ranks, 233 tables left, every rank with under
2 GiB free). ``Demotions`` moves one placed whole table to a kernel of its own that needs
less HBM on the same rank (``fused`` to ``fused_uvm_caching``, say), on the rank where that
costs the least time, until the table fits. Deterministic: ties go to the lower rank, then
the lower table index.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner_service.costs.options import Placement, ShardingOption
from planner_service.solve.placement import GroupIndex, State
from planner_service.solve.problem import Choice, Problem

# Ranks (the freest in HBM first) searched for a table to demote, per table that fits
# nowhere: a demotion frees tens of GiB, so the freest ranks are the ones that need least.
RANKS_SEARCHED = 64


@dataclass(frozen=True)
class Demotion:
    """Table ``table`` on ``rank`` moved to its option ``option``, which frees HBM there."""

    table: int
    rank: int
    option: int
    load_after: float


class Demotions:
    """The whole single-shard tables placed so far, by rank, and the demotions they allow."""

    def __init__(self, problem: Problem, groups: GroupIndex) -> None:
        self.problem = problem
        self.linked = groups.linked
        self.on_rank: dict[int, list[int]] = {}
        self._lighter: dict[int, tuple[int, ...]] = {}  # by id of the option placed

    def placed(self, t: int, choice: Choice) -> None:
        """Note a table's placement (only whole tables on one rank can be demoted)."""
        option = self.problem.tables[t].options[choice.option]
        if len(choice.ranks) == 1 and t not in self.linked and _movable(option):
            self.on_rank.setdefault(choice.ranks[0], []).append(t)

    def make_room(
        self, state: State, choices: list[Choice | None], hbm_bytes: int, allowed: set[int]
    ) -> bool:
        """Demote one placed table so that some rank of ``allowed`` has ``hbm_bytes`` free:
        the demotion that leaves its rank the least loaded. False when none does."""
        free = self.problem.hbm_cap - state.hbm
        ranks = [r for r in np.argsort(-free, kind="stable").tolist() if r in allowed]
        best: Demotion | None = None
        for rank in ranks[:RANKS_SEARCHED]:
            found = self._best_on(state, choices, rank, hbm_bytes - int(free[rank]))
            if found is not None and (best is None or found.load_after < best.load_after):
                best = found
        if best is None:
            return False
        self._apply(state, choices, best)
        return True

    def _best_on(
        self, state: State, choices: list[Choice | None], rank: int, missing_bytes: int
    ) -> Demotion | None:
        problem = self.problem
        ddr_free = int(problem.ddr_cap[rank] - state.ddr[rank])
        cls = int(problem.class_of_rank[rank])
        best: Demotion | None = None
        for t in self.on_rank.get(rank, ()):
            current = choices[t]
            assert current is not None
            now = problem.costs(problem.tables[t].options[current.option])
            for index in self._lighter_options(t, current.option):
                then = problem.costs(problem.tables[t].options[index])
                if int(now.hbm[0] - then.hbm[0]) < missing_bytes:
                    continue
                if int(then.ddr[0] - now.ddr[0]) > ddr_free:
                    continue
                load = float(state.perf[rank] - now.cost[0, cls] + then.cost[0, cls])
                if best is None or load < best.load_after:
                    best = Demotion(t, rank, index, load)
        return best

    def _lighter_options(self, t: int, current: int) -> tuple[int, ...]:
        """The table's whole-table options that need less HBM than option ``current``."""
        options = self.problem.tables[t].options
        key = id(options[current])
        found = self._lighter.get(key)
        if found is None:
            hbm = self.problem.costs(options[current]).hbm_total
            found = tuple(
                i
                for i, option in enumerate(options)
                if _movable(option)
                and len(option.shards) == 1
                and self.problem.costs(option).hbm_total < hbm
            )
            self._lighter[key] = found
        return found

    def _apply(self, state: State, choices: list[Choice | None], demotion: Demotion) -> None:
        problem, t, rank = self.problem, demotion.table, demotion.rank
        current = choices[t]
        assert current is not None
        old = problem.costs(problem.tables[t].options[current.option])
        new = problem.costs(problem.tables[t].options[demotion.option])
        cls = int(problem.class_of_rank[rank])
        state.perf[rank] += new.cost[0, cls] - old.cost[0, cls]
        state.hbm[rank] += new.hbm[0] - old.hbm[0]
        state.ddr[rank] += new.ddr[0] - old.ddr[0]
        state.free_hbm += old.hbm_total - new.hbm_total
        state.free_bytes += old.hbm_total + old.ddr_total - new.hbm_total - new.ddr_total
        state.max_perf = float(state.perf.max())
        choices[t] = Choice(demotion.option, (rank,))


def _movable(option: ShardingOption) -> bool:
    return option.placement is Placement.PER_SHARD
