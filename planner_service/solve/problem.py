"""The placement problem the solvers share: tables with their fitted options, rank
capacities, and the arithmetic of placing an option's shards on ranks.

A solution is one ``Choice`` per table: which option, and the rank of every shard. Rank
loads (time, HBM, DDR) are always recomputed from choices in floating point, so every
solver's answer is scored the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from planner_service.costs.calibrated import fixed_perf
from planner_service.costs.options import DeviceClasses, Placement, ShardingOption, TableOptions
from planner_service.plan.capacity import Capacity
from planner_service.plan.types import PlanRequest, ShardingType, Topology
from planner_service.solve.deadline import Deadline


@dataclass(frozen=True, slots=True)
class Choice:
    """A table's decision: ``option`` (index into its options) and each shard's rank."""

    option: int
    ranks: tuple[int, ...]


class OptionCosts:
    """An option's shard costs as arrays: ``cost[s, c]`` is shard ``s``'s perf total on a
    rank of device class ``c``; ``hbm[s]``, ``ddr[s]`` its bytes.

    Arrays are built when first read; the totals and bounds (``work``, ``largest_shard``,
    ``hbm_total``, ``ddr_total``) come from the option's runs of equal shards without them.
    Preparing 5,384 distinct shapes on 1,024 ranks asks the totals of some 53,000 options
    and the arrays of few: building every option's arrays took seconds of a 10 s limit
    (issue 37)."""

    def __init__(self, option: ShardingOption, classes: DeviceClasses) -> None:
        self.option = option
        self.classes = classes
        # Summed over the runs once: the local search asks it some 40,000 times a second.
        self.num_shards = option.num_shards
        self._on_ranks: np.ndarray | None = None
        self._on_hosts: np.ndarray | None = None
        self._local_on_hosts: np.ndarray | None = None
        self._local_work_on_hosts: np.ndarray | None = None
        # On one device class a shard costs the same on every rank: the per-rank views of
        # its costs are broadcasts, not copies (at 10,000 x 4,096 the copies of every
        # option tried held gigabytes; issue 37).
        self._one_class = len(classes.specs) == 1

    @cached_property
    def cost(self) -> np.ndarray:
        # Built per run of equal shards and repeated (numpy), not shard by shard.
        return np.repeat(
            np.array([[p.total for p in e.perf] for e, _ in self.option.runs], dtype=float),
            self._counts,
            axis=0,
        )

    @cached_property
    def hbm(self) -> np.ndarray:
        runs = self.option.runs
        return np.repeat(np.array([e.storage.hbm_bytes for e, _ in runs], np.int64), self._counts)

    @cached_property
    def ddr(self) -> np.ndarray:
        runs = self.option.runs
        return np.repeat(np.array([e.storage.ddr_bytes for e, _ in runs], np.int64), self._counts)

    @cached_property
    def first_shard(self) -> tuple[int, int, list[float]]:
        """The first shard's HBM, DDR and cost per device class, as Python numbers (for
        ``placement.FewRanks``)."""
        return int(self.hbm[0]), int(self.ddr[0]), self.cost[0].tolist()

    @cached_property
    def fixed_cost(self) -> np.ndarray | None:
        """A fixed option's cost per shard on its own rank (shard ``i`` on rank ``i``)."""
        if self.option.placement is not Placement.FIXED:
            return None
        if self._one_class:
            return self.cost[:, 0]
        class_of_rank = np.asarray(self.classes.class_of_rank)
        return self.cost[np.arange(self.option.num_shards), class_of_rank]

    @property
    def _counts(self) -> list[int]:
        return [count for _, count in self.option.runs]

    def on_ranks(self, problem: Problem) -> np.ndarray:
        """``cost`` per shard on every rank (shard x rank), worked out once per option."""
        if self._on_ranks is None:
            if self._one_class:
                self._on_ranks = np.broadcast_to(
                    self.cost[:, :1], (self.num_shards, len(problem.class_of_rank))
                )
            else:
                self._on_ranks = self.cost[:, problem.class_of_rank]
        return self._on_ranks

    def on_hosts(self, problem: Problem) -> np.ndarray:
        """``cost`` per shard on every rank of the host grid (shard x host x local rank),
        worked out once per option."""
        if self._on_hosts is None:
            if self._one_class:
                self._on_hosts = np.broadcast_to(
                    self.cost[:, :1, None], (self.num_shards, *problem.host_grid.shape)
                )
            else:
                self._on_hosts = self.cost[:, problem.class_of_rank[problem.host_grid]]
        return self._on_hosts

    def local_on_hosts(self, problem: Problem) -> np.ndarray:
        """``cost`` of shard ``i`` on local rank ``i`` of every host (host x local rank): a
        table-row-wise option's shards on each host, worked out once per option."""
        if self._local_on_hosts is None:
            local = np.arange(problem.local_world_size)
            on_hosts = self.cost[:, problem.class_of_rank[problem.host_grid]]
            local_on_hosts = on_hosts[local, :, local].T
            # Summed as built (this layout's order of additions), then, on one device
            # class, kept as a view of one host's costs: every host's are the same.
            self._local_work_on_hosts = local_on_hosts.sum(axis=1)
            if self._one_class:
                local_on_hosts = np.broadcast_to(self.cost[local, 0], local_on_hosts.shape)
            self._local_on_hosts = local_on_hosts
        return self._local_on_hosts

    def local_work_on_hosts(self, problem: Problem) -> np.ndarray:
        """Per host, the work of the option's shard ``i`` on each local rank ``i``."""
        if self._local_work_on_hosts is None:
            self.local_on_hosts(problem)
        assert self._local_work_on_hosts is not None
        return self._local_work_on_hosts

    @cached_property
    def hbm_total(self) -> int:
        return sum(e.storage.hbm_bytes * count for e, count in self.option.runs)

    @cached_property
    def ddr_total(self) -> int:
        return sum(e.storage.ddr_bytes * count for e, count in self.option.runs)

    @cached_property
    def hbm_largest(self) -> int:
        """The most HBM bytes of any one shard."""
        return max((e.storage.hbm_bytes for e, count in self.option.runs if count), default=0)

    @cached_property
    def ddr_largest(self) -> int:
        """The most DDR bytes of any one shard."""
        return max((e.storage.ddr_bytes for e, count in self.option.runs if count), default=0)

    @cached_property
    def min_cost(self) -> np.ndarray:
        """Each shard's cost on the fastest class it could run on (fixed: on its rank)."""
        if self.fixed_cost is not None:
            return self.fixed_cost
        return self.cost.min(axis=1)

    @cached_property
    def work(self) -> float:
        """Total milliseconds the option adds over all ranks, at best."""
        runs = self._least_per_run()
        if runs is None:
            return float(self.min_cost.sum())
        return sum(cost * count for cost, count in runs)

    @cached_property
    def largest_shard(self) -> float:
        """Cost of its most expensive shard, at best; no plan can beat this for the table."""
        return self._shard_cost(max)

    @cached_property
    def smallest_shard(self) -> float:
        """Cost of its cheapest shard, at best."""
        return self._shard_cost(min)

    def _shard_cost(self, pick: Callable[..., float]) -> float:
        runs = self._least_per_run()
        costs = self.min_cost.tolist() if runs is None else [cost for cost, count in runs if count]
        return float(pick(costs, default=0.0))

    def _least_per_run(self) -> list[tuple[float, int]] | None:
        """Each run's least cost per shard with its count, or None when that depends on
        the shard's position (a fixed option on ranks of several device classes)."""
        if self.option.placement is Placement.FIXED and len(self.classes.specs) > 1:
            return None
        return [(min(p.total for p in e.perf), count) for e, count in self.option.runs]


@dataclass
class Problem:
    """Everything fixed about one planning request."""

    request: PlanRequest
    tables: list[TableOptions]
    capacities: list[Capacity]
    classes: DeviceClasses

    def __post_init__(self) -> None:
        self.topology: Topology = self.request.topology
        self.world_size = self.topology.world_size
        self.local_world_size = self.topology.num_local_ranks
        self.num_hosts = self.topology.num_hosts
        self.hbm_cap = np.array([c.hbm_bytes for c in self.capacities], dtype=np.int64)
        self.ddr_cap = np.array([c.ddr_bytes for c in self.capacities], dtype=np.int64)
        # All ranks together, as Python ints: 2**53 bytes on 1,024+ ranks overflow int64.
        self.hbm_total = sum(c.hbm_bytes for c in self.capacities)
        self.ddr_total = sum(c.ddr_bytes for c in self.capacities)
        self.class_of_rank = np.asarray(self.classes.class_of_rank, dtype=np.int64)
        self.every_rank = tuple(range(self.world_size))  # an option fixed on every rank
        self.allowed: list[tuple[int, ...]] = self._allowed_ranks()
        self._costs: dict[int, OptionCosts] = {}
        # Row h: the ranks of host h, in order (hosts are consecutive ranks, so the grid
        # is a reshape of the rank axis: placement reshapes per-rank arrays the same way).
        self.host_grid = np.arange(self.num_hosts * self.local_world_size).reshape(
            self.num_hosts, self.local_world_size
        )

    def _allowed_ranks(self) -> list[tuple[int, ...]]:
        """Each table's allowed ranks, one shared tuple per distinct rank set (so that
        ``group_tables`` keys on its identity): 10,000 tables on 4,096 ranks built a tuple
        of every rank per table and hashed each, 3.9 s before any search."""
        constraints = self.request.constraints
        shared: dict[tuple[int, ...], tuple[int, ...]] = {}
        allowed = []
        for entry in self.tables:
            ranks = constraints.for_table(entry.table.name).ranks
            if not ranks:
                allowed.append(self.every_rank)
                continue
            pinned = tuple(sorted(set(ranks)))
            allowed.append(shared.setdefault(pinned, pinned))
        return allowed

    def costs(self, option: ShardingOption) -> OptionCosts:
        """Cost arrays of an option, shared by every table with the same option object."""
        found = self._costs.get(id(option))
        if found is None:
            found = OptionCosts(option, self.classes)
            self._costs[id(option)] = found
        return found

    def host_ranks(self, host: int) -> range:
        return self.topology.host_ranks(host)


@dataclass(frozen=True)
class Loads:
    """What a set of choices puts on each rank."""

    perf: np.ndarray
    hbm: np.ndarray
    ddr: np.ndarray

    @classmethod
    def zeros(cls, world_size: int) -> Loads:
        """Nothing on any rank."""
        return cls(
            np.zeros(world_size), np.zeros(world_size, np.int64), np.zeros(world_size, np.int64)
        )

    @property
    def objective(self) -> float:
        return float(self.perf.max()) if len(self.perf) else 0.0

    @property
    def peak_hbm(self) -> int:
        return int(self.hbm.max()) if len(self.hbm) else 0

    def fits(self, problem: Problem) -> bool:
        return bool((self.hbm <= problem.hbm_cap).all() and (self.ddr <= problem.ddr_cap).all())


def loads_of(problem: Problem, choices: list[Choice]) -> Loads:
    loads = Loads.zeros(problem.world_size)
    for entry, choice in zip(problem.tables, choices, strict=True):
        option = entry.options[choice.option]
        add_choice(problem, option, choice.ranks, loads.perf, loads.hbm, loads.ddr)
    return loads


def add_choice(
    problem: Problem,
    option: ShardingOption,
    ranks: tuple[int, ...],
    perf: np.ndarray,
    hbm: np.ndarray,
    ddr: np.ndarray,
) -> None:
    """Add ``option`` with its shards on ``ranks`` onto the per-rank ``perf``, ``hbm`` and
    ``ddr`` arrays, in place: each shard's cost on its rank's device class, and its bytes."""
    costs = problem.costs(option)
    idx = np.asarray(ranks, dtype=np.int64)
    np.add.at(perf, idx, costs.cost[np.arange(costs.num_shards), problem.class_of_rank[idx]])
    np.add.at(hbm, idx, costs.hbm)
    np.add.at(ddr, idx, costs.ddr)


# Among options that cost the same on every shard, the one with the freest placement wins:
# a whole table is simplest; column shards anywhere include column shards on one host; on a
# single host, table-row-wise is row-wise.
_PREFERENCE = {
    ShardingType.TABLE_WISE: 0,
    ShardingType.COLUMN_WISE: 1,
    ShardingType.TABLE_COLUMN_WISE: 2,
    ShardingType.ROW_WISE: 0,
    ShardingType.TABLE_ROW_WISE: 1,
    ShardingType.DATA_PARALLEL: 0,
}


def without_equivalents(
    tables: list[TableOptions], request: PlanRequest, deadline: Deadline | None = None
) -> list[TableOptions]:
    """Drop options that cost exactly what a freer option of the table costs (decided once
    per distinct option tuple: tables of one shape share them). Under the calibrated model
    two sharding types are alike only if their fixed costs are too. Raises ``OutOfTime``
    once ``deadline`` is passed by its slack (``Deadline.preparation_check``)."""
    deadline = deadline or Deadline.never()
    decided: dict[tuple[int, ...], tuple[ShardingOption, ...]] = {}
    fixed = {kind: fixed_perf(request, (kind,)).total for kind in ShardingType}
    result = []
    check = deadline.preparation_check()
    for entry in tables:
        check()
        key = tuple(map(id, entry.options))
        if key not in decided:
            decided[key] = _distinct_options(entry.options, request.topology, fixed)
        result.append(TableOptions(entry.table, decided[key]))
    return result


def _distinct_options(
    options: tuple[ShardingOption, ...], topology: Topology, fixed: dict[ShardingType, float]
) -> tuple[ShardingOption, ...]:
    kept: dict[tuple[object, ...], ShardingOption] = {}
    for option in options:
        key = (*_equivalence_key(option, topology), fixed[option.sharding_type])
        incumbent = kept.get(key)
        if (
            incumbent is None
            or _PREFERENCE[option.sharding_type] < _PREFERENCE[incumbent.sharding_type]
        ):
            kept[key] = option
    survivors = set(map(id, kept.values()))
    return tuple(o for o in options if id(o) in survivors)


def _equivalence_key(option: ShardingOption, topology: Topology) -> tuple[object, ...]:
    kind = option.sharding_type
    single_host = topology.num_hosts == 1
    if kind is ShardingType.ROW_WISE or (kind is ShardingType.TABLE_ROW_WISE and single_host):
        family = "rows"
    elif kind in (
        ShardingType.TABLE_WISE,
        ShardingType.COLUMN_WISE,
        ShardingType.TABLE_COLUMN_WISE,
    ):
        family = "free"
    else:
        family = kind.value
    shards = tuple(
        (s.sizes, tuple(p.total for p in s.perf), s.storage, count) for s, count in option.runs
    )
    return (family, option.compute_kernel, option.cache_load_factor, shards)


@dataclass(frozen=True)
class Group:
    """Tables the solver may treat as interchangeable: the same option objects, the same
    allowed ranks, and in no colocate or separate group (those stay singletons)."""

    members: tuple[int, ...]
    options: tuple[ShardingOption, ...]
    allowed: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.members)


def group_tables(problem: Problem) -> list[Group]:
    constraints = problem.request.constraints
    linked = {name for group in (*constraints.colocate, *constraints.separate) for name in group}
    groups: dict[object, list[int]] = {}
    for t, entry in enumerate(problem.tables):
        if entry.table.name in linked:
            key: object = ("single", t)
        else:
            key = (tuple(map(id, entry.options)), id(problem.allowed[t]))
        groups.setdefault(key, []).append(t)
    return [
        Group(tuple(members), problem.tables[members[0]].options, problem.allowed[members[0]])
        for members in groups.values()
    ]
