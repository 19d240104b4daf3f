"""A training job's plan at startup: every rank gets the same verified plan, or an error
with the reason, within a deadline (see docs/training.md, "Loading the plan at startup").

``load_plan(source)``: rank 0 fetches the plan (from the service through the HTTP client,
``clients.http``: retries, integrity check, local cache; or from a file, whose content
address is checked) and broadcasts its bytes, or its failure, to every rank; with
``every_rank=True`` each rank fetches for itself. Every rank hashes the bytes it got again,
then all ranks compare plan ids. Any rank's failure, a disagreement, or a peer that does
not arrive becomes a ``PlanLoadError`` on every rank that can still be told, naming the
ranks and their reasons. The exchanges run on a gloo group created with
``timeout=deadline_s``, and the fetch has half the deadline, so nothing waits forever.
"""

from __future__ import annotations

import itertools
import os
import re
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from clients.http.errors import PlannerError
from clients.http.integrity import verified_plan
from planner_service.plan.codec import plan_bytes
from planner_service.plan.types import ShardingPlan

if TYPE_CHECKING:
    from clients.http import PlannerClient

__all__ = ["DEFAULT_DEADLINE_S", "PlanLoadError", "load_plan"]

DEFAULT_DEADLINE_S = 300.0
SERVER_ENV = "SHARDPLAN_SERVER"
TOKEN_ENV = "SHARDPLAN_TOKEN"
ALIAS_PREFIX = "alias:"
_PLAN_ID = re.compile(r"[0-9a-f]{64}")
_CALLS = itertools.count()  # every rank calls load_plan in the same order: one key per call


class PlanLoadError(RuntimeError):
    """The plan could not be loaded on every rank, agreed on, by the deadline. ``ranks``
    names the ranks the reason is about (in the process group's numbering)."""

    def __init__(self, message: str, *, ranks: list[int] | None = None) -> None:
        super().__init__(message)
        self.ranks = ranks or []


def load_plan(
    source: str | os.PathLike[str],
    *,
    pg: dist.ProcessGroup | None = None,
    client: PlannerClient | None = None,
    server: str | None = None,
    token: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    every_rank: bool = False,
    deadline_s: float = DEFAULT_DEADLINE_S,
) -> ShardingPlan:
    """The plan ``source`` names, the same on every rank of ``pg`` (default: the default
    group; none initialised: this process alone).

    ``source``: a plan id (64 hex digits), ``alias:NAME`` (both from the service) or a
    plan file's path. The service: ``client``, else one built from ``server`` (default
    ``$SHARDPLAN_SERVER``), ``token`` (default ``$SHARDPLAN_TOKEN``) and ``cache_dir``.
    ``every_rank``: each rank fetches (else rank 0 does and broadcasts). ``deadline_s``:
    how long each exchange between ranks may wait; the fetch gets half of it. Raises
    ``PlanLoadError`` with the reason; uncaught, the worker exits non-zero."""
    if not deadline_s > 0:
        raise ValueError(f"deadline_s = {deadline_s!r}: must be a number of seconds above 0")
    fetch_s = deadline_s / 2

    def fetch() -> bytes:
        return _fetch(source, client, server, token, cache_dir, fetch_s)

    if pg is None and not dist.is_initialized():
        return _verified(_outcome(fetch, fetch_s), source)
    group = pg if pg is not None else dist.group.WORLD
    assert group is not None  # initialised
    return _Exchange(group, deadline_s).load(source, fetch, every_rank, fetch_s)


# ------------------------------------------------------------------------ fetching


def _fetch(
    source: str | os.PathLike[str],
    client: PlannerClient | None,
    server: str | None,
    token: str | None,
    cache_dir: str | os.PathLike[str] | None,
    budget_s: float,
) -> bytes:
    """The plan's canonical bytes, verified; PlanLoadError (or a PlannerError) if not."""
    text = os.fspath(source)
    if isinstance(source, str) and (_PLAN_ID.fullmatch(text) or text.startswith(ALIAS_PREFIX)):
        if client is not None:
            return plan_bytes(_from_service(client, text))
        with _client(server, token, cache_dir, budget_s) as built:
            return plan_bytes(_from_service(built, text))
    try:
        data = Path(text).read_bytes()
    except OSError as error:
        raise PlanLoadError(
            f"cannot read the plan file: {error.strerror or error} (source must be a "
            "plan id of 64 hex digits, alias:NAME or a plan file's path)"
        ) from None
    return plan_bytes(verified_plan(data, source=text, expected_plan_id=None))


def _from_service(client: PlannerClient, source: str) -> ShardingPlan:
    if source.startswith(ALIAS_PREFIX):
        return client.resolve(source.removeprefix(ALIAS_PREFIX)).plan
    return client.get_plan(source)


def _client(
    server: str | None, token: str | None, cache_dir: str | os.PathLike[str] | None, budget_s: float
) -> PlannerClient:
    """A client whose retries fit in ``budget_s``: 3 retries, each attempt's network steps
    bounded by a fifth of it, backoffs by a tenth."""
    from clients.http import PlannerClient

    base = server or os.environ.get(SERVER_ENV)
    if not base:
        raise PlanLoadError(
            f"no planner service to fetch from: pass server= or client=, or set ${SERVER_ENV}"
        )
    return PlannerClient(
        base,
        token=token or os.environ.get(TOKEN_ENV) or None,
        cache_dir=cache_dir,
        timeout_s=budget_s / 5,
        retries=3,
        backoff_s=budget_s / 40,
        max_backoff_s=budget_s / 10,
        max_retry_after_s=budget_s / 10,
    )


def _outcome(fetch: Callable[[], bytes], budget_s: float) -> bytes | str:
    """``fetch()`` run with a hard bound of ``budget_s``: its bytes, or why there are none
    (a daemon thread, so a fetch stuck in a call that ignores its timeouts is left behind)."""
    result: list[bytes | str] = []

    def run() -> None:
        try:
            result.append(fetch())
        except (PlanLoadError, PlannerError, ValueError) as error:  # InputError: bad argument
            result.append(str(error))
        except Exception as error:  # noqa: BLE001 - anything else reaches every rank too
            result.append(f"{type(error).__name__}: {error}")

    worker = threading.Thread(target=run, name="shardplan-load-plan", daemon=True)
    worker.start()
    worker.join(budget_s)
    if not result:
        return f"the fetch did not finish within {budget_s:g} s (half of deadline_s)"
    return result[0]


def _verified(outcome: bytes | str, source: str | os.PathLike[str]) -> ShardingPlan:
    if isinstance(outcome, str):
        raise PlanLoadError(f"cannot load plan {os.fspath(source)!r}: {outcome}")
    return _parse(outcome)


def _parse(data: bytes) -> ShardingPlan:
    """The plan in ``data``, its content address checked again (bytes a peer sent)."""
    try:
        return verified_plan(data, source="plan received", expected_plan_id=None)
    except PlannerError as error:
        raise PlanLoadError(str(error)) from None


# ------------------------------------------------------------------------ exchanging


class _Exchange:
    """The ranks of ``pg`` on a gloo group of their own whose every collective waits at
    most ``deadline_s``; each rank marks in the default store that it arrived, so that a
    timeout can name the ranks that did not."""

    def __init__(self, pg: dist.ProcessGroup, deadline_s: float) -> None:
        self.pg = pg
        self.deadline_s = deadline_s
        self.rank = dist.get_rank(pg)
        self.members = [dist.get_global_rank(pg, r) for r in range(dist.get_world_size(pg))]
        self.key = f"shardplan/load_plan/{next(_CALLS)}"
        self.group: dist.ProcessGroup | None = None

    def load(
        self,
        source: str | os.PathLike[str],
        fetch: Callable[[], bytes],
        every_rank: bool,
        fetch_s: float,
    ) -> ShardingPlan:
        self._arrive()
        # The group stays for the process's life. torch names a group made with local
        # synchronization after its ranks, so a next load_plan's group would take a
        # destroyed one's name, and with it the store keys where that group's ranks had
        # published their (since closed) gloo addresses: a peer reading a stale one fails
        # to connect. While this one lives, torch gives the next a fresh name.
        self.group = self._collective(
            "create the plan-loading group",
            lambda: dist.new_group(
                self.members,
                timeout=timedelta(seconds=self.deadline_s),
                backend="gloo",
                use_local_synchronization=True,
            ),
        )
        mine = _outcome(fetch, fetch_s) if every_rank else self._from_rank_0(source, fetch, fetch_s)
        plan, problem = self._check(mine)
        self._agree(source, plan, problem)
        assert plan is not None
        return plan

    def _from_rank_0(
        self, source: str | os.PathLike[str], fetch: Callable[[], bytes], fetch_s: float
    ) -> bytes | str:
        box: list[Any] = [_outcome(fetch, fetch_s) if self.rank == 0 else None]
        self._collective(
            "receive the plan from rank 0",
            lambda: dist.broadcast_object_list(box, src=self.members[0], group=self.group),
        )
        outcome: bytes | str = box[0]
        if isinstance(outcome, str) and self.rank != 0:
            return f"rank 0 could not load plan {os.fspath(source)!r}: {outcome}"
        return outcome

    @staticmethod
    def _check(outcome: bytes | str) -> tuple[ShardingPlan | None, str | None]:
        if isinstance(outcome, str):
            return None, outcome
        try:
            return _parse(outcome), None
        except PlanLoadError as error:
            return None, str(error)

    def _agree(
        self, source: str | os.PathLike[str], plan: ShardingPlan | None, problem: str | None
    ) -> None:
        mine = (plan.plan_id if plan is not None else None, problem)
        held: list[Any] = [None] * len(self.members)
        self._collective(
            "compare plan ids",
            lambda: dist.all_gather_object(held, mine, group=self.group),
        )
        failed = [(r, why) for r, (_, why) in enumerate(held) if why is not None]
        if failed:
            reasons = "; ".join(f"rank {r}: {why}" for r, why in failed)
            raise PlanLoadError(
                f"rank {self.rank}: plan {os.fspath(source)!r} could not be loaded on ranks "
                f"{[r for r, _ in failed]}: {reasons}",
                ranks=[r for r, _ in failed],
            )
        ids = [plan_id for plan_id, _ in held]
        if len(set(ids)) > 1:
            by_id: dict[str, list[int]] = {}
            for r, plan_id in enumerate(ids):
                by_id.setdefault(plan_id, []).append(r)
            majority = max(by_id.values(), key=len)
            differ = [r for r in range(len(ids)) if r not in majority]
            holds = "; ".join(f"ranks {ranks} hold plan {pid}" for pid, ranks in by_id.items())
            raise PlanLoadError(
                f"rank {self.rank}: the ranks do not hold the same plan: ranks {differ} "
                f"differ ({holds}); every rank must load the same plan",
                ranks=differ,
            )

    # -------------------------------------------------------------------- bounds

    def _arrive(self) -> None:
        store = _store()
        if store is not None:
            try:
                store.set(f"{self.key}/{self.rank}", "1")
            except (RuntimeError, dist.DistError) as error:
                raise PlanLoadError(
                    f"rank {self.rank} cannot reach the job's rendezvous store: {error}"
                ) from None

    def _missing(self) -> list[int] | None:
        """The ranks that have not called load_plan this time, per the store (None: cannot
        tell)."""
        store = _store()
        if store is None:
            return None
        try:
            return [r for r in range(len(self.members)) if not store.check([f"{self.key}/{r}"])]
        except (RuntimeError, dist.DistError):
            return None

    def _collective(self, what: str, run: Callable[[], Any]) -> Any:
        try:
            return run()
        except (RuntimeError, dist.DistError) as error:
            missing = self._missing()
            others = [r for r in range(len(self.members)) if r != self.rank]
            who = (
                f"ranks {missing} never called load_plan"
                if missing
                else f"one of ranks {others} did not take part"
            )
            raise PlanLoadError(
                f"rank {self.rank} could not {what} within deadline_s = {self.deadline_s:g} s: "
                f"{who} (a rank that crashed, hangs before load_plan, or loads plans in "
                f"another order). torch: {error}",
                ranks=missing if missing else others,
            ) from error


def _store() -> dist.Store | None:
    """The default group's store (torch keeps it private; None where it cannot be had)."""
    try:
        store: dist.Store = dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):
        return None
    return store
