"""The wall-clock side of ``options.time_limit_s``.

A solve has two budgets. The *work budget* is deterministic: every CP-SAT run gets a share
of the time limit in deterministic seconds, and the heuristics stop at fixed round
counts, so the same request gives the same plan in every process and on every machine.
The *deadline* is wall clock: enumeration to sealed plan must end within ``time_limit_s``
plus a small slack (``finish_slack_s``), on a loaded machine too. Every stage checks it
and stops with its best result so far when it passes; CP-SAT and GLOP get what is left of
it as their wall-clock limit.

A deadline that cut anything short is *reached*; the plan's solver report then says its
search stopped at ``time_limit`` (not reproducible: another run may get further), rather
than at ``optimal``, ``gap_limit`` or ``work_budget`` (reproducible).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

# What a solve may run past its time limit: max(5%, 0.25 s). Sealing the plan happens in
# this slack, so the search itself stops at the limit.
FINISH_SLACK_FRACTION = 0.05
FINISH_SLACK_MIN_S = 0.25
# A wall-clock limit this close to the deadline counts as the deadline: CP-SAT and GLOP
# stop on it a little early or late.
EXPIRY_TOLERANCE_S = 0.002
# Preparing a problem looks at the clock once per this many tables: on 100,000 tables of
# distinct shapes (1 to 2 ms each) about once a second, and never on a request of fewer.
PREPARATION_CHECK_EVERY = 512
# A strict deadline's (``Deadline.strict``) preparation looks at the clock this often: its
# work is optional, so it stops at the deadline, within a few milliseconds.
STRICT_CHECK_EVERY = 8


def finish_slack_s(time_limit_s: float) -> float:
    """How far past ``time_limit_s`` a solve may end: max(5%, 0.25 s)."""
    return max(FINISH_SLACK_FRACTION * time_limit_s, FINISH_SLACK_MIN_S)


@dataclass(frozen=True)
class AfterSolve:
    """What the caller of ``solve`` does with the plan before its user has the answer
    (writing it to a file, storing and sending it), in seconds per shard, per table and per
    rank of the plan: the search stops that much earlier, as it does for sealing the plan,
    so the answer is out within the time limit. Figures are the callers' measured
    estimates. A plan's bytes (schema 2.0) follow its tables and ranks, not its shards."""

    s_per_shard: float = 0.0
    s_per_table: float = 0.0
    s_per_rank: float = 0.0

    def time_s(self, shards: int, tables: int, ranks: int = 0) -> float:
        return shards * self.s_per_shard + tables * self.s_per_table + ranks * self.s_per_rank


NOTHING_AFTER = AfterSolve()


class OutOfTime(Exception):
    """A stage ran out of time while building its model, before it had anything to give."""


class Deadline:
    """An instant on the monotonic clock that a solve's search must stop by."""

    def __init__(
        self,
        seconds: float,
        *,
        grace_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        after: AfterSolve = NOTHING_AFTER,
        strict: bool = False,
    ) -> None:
        self._clock = clock
        self._end = clock() + max(0.0, seconds)
        self._grace_s = grace_s
        self._strict = strict
        self.after = after
        self.reached = False

    @classmethod
    def for_time_limit(
        cls, time_limit_s: float, *, spent_s: float = 0.0, after: AfterSolve = NOTHING_AFTER
    ) -> Deadline:
        """A solve's deadline: the search stops at ``time_limit_s``; the first plan may
        take half the finishing slack beyond it (a plan a little late beats no plan).
        ``spent_s``: what the answer has used of its time limit already (a command's
        imports and reading its request; a service reading and decoding the body, inlining
        what it names, parsing it in the solver process). ``after``: what the caller
        does with the plan once ``solve`` returns it."""
        return cls(time_limit_s - spent_s, grace_s=finish_slack_s(time_limit_s) / 2, after=after)

    @classmethod
    def never(cls) -> Deadline:
        """No wall-clock limit: for callers (tests, relaxed re-solves) that want only the
        deterministic budget."""
        return cls(float("inf"))

    def strict(self) -> Deadline:
        """This deadline for optional work (the explanation's fix searches): no grace for a
        first plan and no finishing slack, so preparing a request stops at the deadline
        itself, and the clock is read every ``STRICT_CHECK_EVERY`` tables. The caller
        records its expiry here with ``reached`` if it needs to."""
        strict = copy.copy(self)
        strict._grace_s, strict._strict, strict.reached = 0.0, True, False
        return strict

    def remaining_s(self) -> float:
        return max(0.0, self._end - self._clock())

    def expired(self) -> bool:
        """Whether the deadline has passed; a caller that stops because of it has been cut
        short, so this records that the deadline was reached."""
        if self._end - self._clock() <= EXPIRY_TOLERANCE_S:
            self.reached = True
            return True
        return False

    def end_now(self) -> None:
        """Pass the deadline at once: a stage running in another thread that is no longer
        wanted stops at its next look at the clock."""
        self._end = -math.inf

    def end_with(self, other: Deadline, before_s: float = 0.0) -> None:
        """End ``before_s`` before ``other`` ends now (for a stage in another thread, whose
        deadline was copied before ``other`` kept time for what comes after it)."""
        self._end = min(self._end, other._end - max(0.0, before_s))

    def reserve(self, seconds: float) -> None:
        """Keep ``seconds`` before the deadline for work after the search (sealing the
        plan): the search stages now stop that much earlier."""
        self._end -= max(0.0, seconds)

    def allows(self, estimate_s: float) -> bool:
        """Whether work expected to take ``estimate_s`` can finish before the deadline; a
        caller that skips it because of that has been cut short, as with ``expired``."""
        if self._end - self._clock() - estimate_s <= EXPIRY_TOLERANCE_S:
            self.reached = True
            return False
        return True

    def check(self) -> None:
        """For model building: raise ``OutOfTime`` once the deadline has passed."""
        if self.expired():
            raise OutOfTime

    def preparation_check(self) -> Callable[[], None]:
        """For preparing the problem (enumerating, fitting, pricing every table), which
        any plan needs: a check to call once per table that raises ``OutOfTime`` only once
        the deadline has passed by more than the finishing slack, max(twice the grace,
        ``FINISH_SLACK_MIN_S``). A small request past its deadline is still prepared and
        gets its (late) plan; 100,000 tables of distinct shapes, which take minutes, stop
        within the slack. The clock is read every ``PREPARATION_CHECK_EVERY`` tables."""
        calls = 0
        every = STRICT_CHECK_EVERY if self._strict else PREPARATION_CHECK_EVERY

        def check() -> None:
            nonlocal calls
            calls += 1
            if calls % every == 0 and self.overrun():
                raise OutOfTime

        return check

    def overrun(self) -> bool:
        """Whether the deadline has passed by more than the finishing slack, max(twice
        the grace, ``FINISH_SLACK_MIN_S``): what must be done for any answer stops then."""
        slack_s = 0.0 if self._strict else max(2 * self._grace_s, FINISH_SLACK_MIN_S)
        if self._clock() > self._end + slack_s:
            self.reached = True
            return True
        return False

    def past_grace(self) -> bool:
        """Whether even the grace for a first plan has run out (see ``for_time_limit``)."""
        if self._end + self._grace_s - self._clock() <= EXPIRY_TOLERANCE_S:
            self.reached = True
            return True
        return False

    def cap_s(self, budget_s: float, share: float = 1.0) -> float:
        """A wall-clock limit for one stage: ``budget_s``, but at most ``share`` of what is
        left of the deadline (so later stages keep some)."""
        return max(0.0, min(budget_s, self.remaining_s() * share))

    def share(self, fraction: float) -> Deadline:
        """A deadline for one stage: ``fraction`` of what is left of this one, on the same
        clock (never: never). Whoever catches its expiry records it here with
        ``reached``."""
        if math.isinf(self._end):
            return self
        return Deadline(
            self.remaining_s() * fraction, clock=self._clock, after=self.after, strict=self._strict
        )

    def note_stop(self, limit_s: float, wall_s: float) -> None:
        """Record a stage that ran ``wall_s`` under a wall-clock limit of ``limit_s``: if it
        used the whole limit, the limit (not its own work budget) stopped it."""
        if wall_s >= limit_s - EXPIRY_TOLERANCE_S:
            self.reached = True
