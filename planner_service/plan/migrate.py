"""Migrating from one plan to another: the regions that move between ranks
(``plan.transfers.plan_transfers``), summed per pair of ranks and per rank, for ``shardplan
migrate`` and its JSON form (docs/reading-plans.md, "Bytes that move between ranks").

What an element weighs: the new plan's request gives each table's data type and
optimizer; without it, weights are 4-byte fp32 and the optimizer is ``sgd`` (no state). An
``optimizer`` given here replaces every table's, as the runtime's fused optimizer does
when it is configured for all tables at once.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from planner_service.plan.codec import request_hash
from planner_service.plan.errors import FieldProblem, InputError
from planner_service.plan.order import natural_sorted
from planner_service.plan.transfers import (
    ASSUMED_ELEMENT_BYTES,
    Element,
    ElementBytes,
    Transfer,
    plan_transfers,
)
from planner_service.plan.types import OptimizerType, PlanRequest, RankMoves, ShardingPlan

# The JSON form's version: it changes when a field changes meaning or goes away.
MIGRATE_VERSION = 1


@dataclass(frozen=True)
class Pair:
    """What one rank sends one other rank: its regions, in plan order."""

    src: int
    dst: int
    transfers: tuple[Transfer, ...]

    @property
    def bytes(self) -> int:
        return sum(transfer.bytes for transfer in self.transfers)

    @property
    def tables(self) -> list[str]:
        return list(dict.fromkeys(transfer.table for transfer in self.transfers))


@dataclass(frozen=True)
class Migration:
    old: ShardingPlan
    new: ShardingPlan
    transfers: list[Transfer]  # plan_transfers' order
    from_request: bool  # data types (and optimizers, unless overridden) from the request
    optimizer: OptimizerType | None  # the override, if any

    @property
    def moved_bytes(self) -> int:
        return sum(transfer.bytes for transfer in self.transfers)

    @property
    def moved_elements(self) -> int:
        return sum(transfer.elements for transfer in self.transfers)

    @property
    def tables_moved(self) -> list[str]:
        return list(dict.fromkeys(transfer.table for transfer in self.transfers))

    @property
    def tables_added(self) -> list[str]:
        return natural_sorted(self.new.tables.keys() - self.old.tables.keys())

    @property
    def tables_removed(self) -> list[str]:
        return natural_sorted(self.old.tables.keys() - self.new.tables.keys())

    @property
    def world_size(self) -> int:
        return max(self.old.world_size, self.new.world_size)

    def pairs(self) -> list[Pair]:
        """Every (sending, receiving) pair of ranks with bytes between them, most bytes
        first (then in rank order)."""
        grouped: dict[tuple[int, int], list[Transfer]] = defaultdict(list)
        for transfer in self.transfers:
            grouped[transfer.src, transfer.dst].append(transfer)
        pairs = [Pair(src, dst, tuple(found)) for (src, dst), found in grouped.items()]
        return sorted(pairs, key=lambda pair: (-pair.bytes, pair.src, pair.dst))

    def sent(self) -> dict[int, int]:
        """Bytes each rank sends (ranks that send nothing are absent)."""
        totals: dict[int, int] = defaultdict(int)
        for transfer in self.transfers:
            totals[transfer.src] += transfer.bytes
        return dict(totals)

    def received(self) -> dict[int, int]:
        """Bytes each rank receives (ranks that receive nothing are absent)."""
        totals: dict[int, int] = defaultdict(int)
        for transfer in self.transfers:
            totals[transfer.dst] += transfer.bytes
        return dict(totals)


def migrate(
    old: ShardingPlan,
    new: ShardingPlan,
    request: PlanRequest | None = None,
    optimizer: OptimizerType | None = None,
) -> Migration:
    """The regions that move from ``old`` to ``new``; ``request`` must be the one ``new``
    was planned from (its hash is the plan's ``request_hash``), else InputError."""
    if request is not None and request_hash(request) != new.request_hash:
        message = (
            f"is not the request the new plan was made from (its request_hash is "
            f"{new.request_hash}); pass the request file NEW was planned from, or leave "
            "--request out for 4-byte weights"
        )
        raise InputError(
            "--request", [FieldProblem("request_hash", message, request_hash(request))]
        )
    elements = elements_for(new, request, optimizer)
    transfers = plan_transfers(old, new.tables, elements=elements)
    return Migration(old, new, transfers, request is not None, optimizer)


def elements_for(
    plan: ShardingPlan, request: PlanRequest | None, optimizer: OptimizerType | None
) -> dict[str, Element]:
    """Each of ``plan``'s tables' ``Element`` (module docstring)."""
    tables = {table.name: table for table in request.tables} if request else {}
    elements = {}
    for name in plan.tables:
        table = tables.get(name)
        weight = table.data_type.size_bytes if table else ASSUMED_ELEMENT_BYTES
        state = optimizer or (table.optimizer if table else OptimizerType.SGD)
        elements[name] = Element(weight, state)
    return elements


# --------------------------------------------------------------------------- JSON


class _Document(BaseModel):
    """Base of the migration document's parts: values, written in field order."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class PlanHeader(_Document):
    """What the document shows of each plan."""

    plan_id: str
    world_size: int
    tables: int

    @classmethod
    def of(cls, plan: ShardingPlan) -> PlanHeader:
        return cls(plan_id=plan.plan_id, world_size=plan.world_size, tables=len(plan.tables))


class Region(_Document):
    """One ``Transfer``'s rectangle of its table (``[start, end)`` rows and columns)."""

    rows: tuple[int, int]
    cols: tuple[int, int]
    bytes: int


class PairTable(_Document):
    """What one pair of ranks moves of one table."""

    table: str
    bytes: int
    regions: list[Region]


class PairEntry(_Document):
    """What one rank sends one other rank (``Pair``), table by table in plan order."""

    src: int
    dst: int
    bytes: int
    tables: list[PairTable]

    @classmethod
    def of(cls, pair: Pair) -> PairEntry:
        tables: dict[str, list[Transfer]] = defaultdict(list)
        for transfer in pair.transfers:
            tables[transfer.table].append(transfer)
        return cls(
            src=pair.src,
            dst=pair.dst,
            bytes=pair.bytes,
            tables=[_pair_table(name, transfers) for name, transfers in tables.items()],
        )


def _pair_table(name: str, transfers: list[Transfer]) -> PairTable:
    regions = [Region(rows=t.rows, cols=t.cols, bytes=t.bytes) for t in transfers]
    return PairTable(table=name, bytes=sum(t.bytes for t in transfers), regions=regions)


class MigrateDocument(_Document):
    """The stable JSON form of a migration (docs/reading-plans.md, "Bytes that move
    between ranks"): every pair of ranks with every region, and every rank's totals."""

    version: int
    old: PlanHeader
    new: PlanHeader
    element_bytes: ElementBytes
    optimizer: OptimizerType | Literal["request"]
    moved_bytes: int
    moved_elements: int
    tables_moved: list[str]
    tables_added: list[str]
    tables_removed: list[str]
    pairs: list[PairEntry]
    ranks: list[RankMoves]


def migrate_document(migration: Migration) -> MigrateDocument:
    """The JSON form of ``migration`` (``MigrateDocument``)."""
    sent, received = migration.sent(), migration.received()
    return MigrateDocument(
        version=MIGRATE_VERSION,
        old=PlanHeader.of(migration.old),
        new=PlanHeader.of(migration.new),
        element_bytes=(
            ElementBytes.REQUEST if migration.from_request else ElementBytes.ASSUMED_FP32
        ),
        optimizer=_optimizer_source(migration),
        moved_bytes=migration.moved_bytes,
        moved_elements=migration.moved_elements,
        tables_moved=migration.tables_moved,
        tables_added=migration.tables_added,
        tables_removed=migration.tables_removed,
        pairs=[PairEntry.of(pair) for pair in migration.pairs()],
        ranks=[
            RankMoves(rank=rank, sent_bytes=sent.get(rank, 0), received_bytes=received.get(rank, 0))
            for rank in range(migration.world_size)
        ],
    )


def _optimizer_source(migration: Migration) -> OptimizerType | Literal["request"]:
    """The override, else "request" where the request gives each table's, else sgd."""
    if migration.optimizer is not None:
        return migration.optimizer
    return "request" if migration.from_request else OptimizerType.SGD
