"""The validator's rules for a plan's ``migration`` section: it is there exactly when the
request re-plans from a previous plan, names that plan, and says what moving from it
costs as ``plan.transfers`` recomputes it from the previous plan's shards and this plan's.

A plan's own model checks that its migration adds up (per-rank sums, ranks in range); only
the previous plan can say whether the sums are the moves. With the previous plan inline
(``options.previous_plan``) every number is recomputed; with only its id, the caller that
holds the store inlines it first (the service does, for an import), else only the id is
compared.
"""

from __future__ import annotations

from collections.abc import Iterator

from planner_service.plan.transfers import migration_section, plan_moves
from planner_service.plan.types import (
    Migration,
    PlanRequest,
    ShardingPlan,
    Violation,
    ViolationCode,
)
from planner_service.plan.units import size

_MIGRATION_FIELDS = ("moved_bytes", "tables_moved", "max_moved_bytes", "move_cost_ms_per_gib")


def check_migration(request: PlanRequest, plan: ShardingPlan) -> Iterator[Violation]:
    """Every way ``plan.migration`` is not what re-planning ``request`` gives."""
    options = request.options
    previous = options.previous_plan
    previous_id = previous.plan_id if previous is not None else options.previous_plan_id
    migration = plan.migration
    if migration is None or previous_id is None:
        if migration is not None or previous_id is not None:
            yield _one_without_other(migration, previous_id)
        return
    if migration.previous_plan_id != previous_id:
        yield _violation(
            f"migration.previous_plan_id is {migration.previous_plan_id}, but the request "
            f"re-plans from plan {previous_id}; a plan's migration is from its request's "
            "previous plan"
        )
        return
    if previous is None:
        return  # only the id: nothing here to recompute the moves from
    moves = plan_moves(previous, plan.tables, request)
    expected = migration_section(
        moves, previous_id, options.max_moved_bytes, options.move_cost_ms_per_gib
    )
    yield from _differences(migration, expected)
    cap = options.max_moved_bytes
    if cap is not None and expected.moved_bytes > cap:
        yield _violation(
            f"the plan moves {size(expected.moved_bytes)} ({expected.moved_bytes} bytes) from "
            f"plan {previous_id}, more than options.max_moved_bytes {size(cap)} ({cap} bytes)"
        )


def _one_without_other(migration: Migration | None, previous_id: str | None) -> Violation:
    if migration is not None:
        return _violation(
            f"the plan has a migration section from plan {migration.previous_plan_id}, but "
            "its request re-plans from no previous plan (options.previous_plan_id); a plan "
            "has one only when its request names the plan it replaces"
        )
    return _violation(
        f"the request re-plans from plan {previous_id}, but the plan has no migration "
        "section; the planner writes one into every plan re-planned from a previous one"
    )


def _differences(migration: Migration, expected: Migration) -> Iterator[Violation]:
    """One violation per field the plan states otherwise than recomputed."""
    for field in _MIGRATION_FIELDS:
        stated, recomputed = getattr(migration, field), getattr(expected, field)
        if stated != recomputed:
            yield _violation(
                f"migration.{field} is {stated}; recomputed from the previous plan's shards "
                f"and this plan's it is {recomputed}"
            )
    if migration.ranks != expected.ranks:
        stated_ranks = {moves.rank: moves for moves in migration.ranks}
        for moves in expected.ranks:
            if stated_ranks.pop(moves.rank, None) != moves:
                yield _violation(
                    f"migration.ranks says otherwise of rank {moves.rank}, which recomputed "
                    f"sends {moves.sent_bytes} and receives {moves.received_bytes} bytes",
                    rank=moves.rank,
                )
        for rank in stated_ranks:
            yield _violation(
                f"migration.ranks lists rank {rank}, which recomputed sends and receives nothing",
                rank=rank,
            )


def _violation(message: str, *, rank: int | None = None) -> Violation:
    return Violation(code=ViolationCode.MIGRATION, message=message, rank=rank)
