"""The run encodings of plan schema 2.0, where a table's shards are a split rule and a rank
list instead of one record per shard: rank lists as runs of consecutive ranks, and column
widths as (width, count) runs.

Each encoding has one spelling (``rank_runs``, ``width_runs``), so a layout has one byte
form and one content address; ``rank_runs_problem`` and ``width_runs_problem`` say why
data is not in it, in time linear in the runs, never in the ranks they stand for (a run
``[0, 131071]`` is one item). Plain integers and tuples only: the vocabulary
(``plan.types``) builds its models on these, so this module imports nothing of ours.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TypeAlias

# One rank, or the ranks first..last (both included) written as a pair.
RankRun: TypeAlias = int | tuple[int, int]
# A run of ``count`` consecutive column shards of ``width`` columns each.
WidthRun: TypeAlias = tuple[int, int]
# Consecutive ranks are written as a pair from this many on (two ranks are as short as ints).
MIN_PAIRED_RANKS = 3


def rank_runs(ranks: Iterable[int]) -> list[RankRun]:
    """``ranks`` in their one spelling: each stretch of at least ``MIN_PAIRED_RANKS``
    consecutive ascending ranks as ``(first, last)``, every other rank as itself.

    ``rank_runs([0, 1, 2, 3, 7, 5, 6]) == [(0, 3), 7, 5, 6]``."""
    stretches = _stretches((rank, rank) for rank in ranks)
    return [run for first, last in stretches for run in _spell(first, last)]


def expand_rank_runs(runs: Sequence[RankRun]) -> list[int]:
    """The ranks ``runs`` stand for, in order."""
    ranks: list[int] = []
    for run in runs:
        if isinstance(run, int):
            ranks.append(run)
        else:
            ranks.extend(range(run[0], run[1] + 1))
    return ranks


def rank_count(runs: Sequence[RankRun]) -> int:
    """How many ranks ``runs`` stand for, without listing them."""
    return sum(1 if isinstance(run, int) else run[1] - run[0] + 1 for run in runs)


def rank_bounds(runs: Sequence[RankRun]) -> tuple[int, int]:
    """The lowest and highest rank ``runs`` name (``runs`` not empty)."""
    firsts = [run if isinstance(run, int) else run[0] for run in runs]
    lasts = [run if isinstance(run, int) else run[1] for run in runs]
    return min(firsts), max(lasts)


def rank_positions(runs: Sequence[RankRun], rank: int) -> list[int]:
    """The positions (shard indices) at which ``rank`` appears in the ranks of ``runs``."""
    positions, position = [], 0
    for run in runs:
        first, last = (run, run) if isinstance(run, int) else run
        if first <= rank <= last:
            positions.append(position + rank - first)
        position += last - first + 1
    return positions


def rank_runs_problem(runs: Sequence[RankRun]) -> str | None:
    """Why ``runs`` are not ranks in their one spelling (None: they are)."""
    for run in runs:
        if isinstance(run, int):
            continue
        if run[1] < run[0]:
            return f"the run {list(run)} ends before it starts; runs are [first, last]"
        if run[1] - run[0] + 1 < MIN_PAIRED_RANKS:
            return (
                f"the run {list(run)} names fewer than {MIN_PAIRED_RANKS} ranks; write 1 or 2 "
                "consecutive ranks as single ranks"
            )
    spelled = [run for first, last in _stretches(_spans(runs)) for run in _spell(first, last)]
    if spelled != list(runs):
        return (
            f"consecutive ranks must be one [first, last] run from {MIN_PAIRED_RANKS} ranks "
            f"on and single ranks below; write {_brief(spelled)}"
        )
    return None


def width_runs(widths: Iterable[int]) -> list[WidthRun]:
    """Column widths in their one spelling: ``(width, count)`` for each stretch of equal
    widths. ``width_runs([32, 32, 32, 16]) == [(32, 3), (16, 1)]``."""
    runs: list[WidthRun] = []
    for width in widths:
        if runs and runs[-1][0] == width:
            runs[-1] = (width, runs[-1][1] + 1)
        else:
            runs.append((width, 1))
    return runs


def expand_width_runs(runs: Sequence[WidthRun]) -> list[int]:
    """The width of each column shard, left to right."""
    return [width for width, count in runs for _ in range(count)]


def width_runs_problem(runs: Sequence[WidthRun]) -> str | None:
    """Why ``runs`` are not column widths in their one spelling (None: they are)."""
    for i, (width, count) in enumerate(runs):
        if count < 1:
            return f"the run {[width, count]} has no shards; counts are at least 1"
        if i and runs[i - 1][0] == width:
            return f"runs {i - 1} and {i} are both {width} wide; write them as one run"
    return None


def _spans(runs: Sequence[RankRun]) -> Iterator[tuple[int, int]]:
    for run in runs:
        yield (run, run) if isinstance(run, int) else run


def _stretches(spans: Iterable[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """Spans joined where one starts right after the one before it ends."""
    current: tuple[int, int] | None = None
    for first, last in spans:
        if current is not None and first == current[1] + 1:
            current = (current[0], last)
            continue
        if current is not None:
            yield current
        current = (first, last)
    if current is not None:
        yield current


def _spell(first: int, last: int) -> list[RankRun]:
    if last - first + 1 >= MIN_PAIRED_RANKS:
        return [(first, last)]
    return list(range(first, last + 1))


def _brief(runs: list[RankRun], limit: int = 8) -> str:
    shown = [run if isinstance(run, int) else list(run) for run in runs[:limit]]
    more = f" ... ({len(runs)} runs in all)" if len(runs) > limit else ""
    return f"{shown}{more}"
