"""PUT /v1/plans/{plan_id}: storing a plan solved elsewhere (a bigger machine, an offline
run with a longer time limit) after checking it as the service checks its own.

- Identity: the plan's content address is computed again; it must be both the id in the
  path and the plan's own ``plan_id`` (409 naming the three otherwise).
- Validity: the validator checks the plan against the request (422 listing every
  violation), the check ``shardplan validate`` and ``POST /v1/validate`` make. That
  includes the plan's ``request_hash``, the per-rank totals and the objective recomputed
  with this service's cost model, and a migration section recomputed from the previous
  plan: the request's inline ``options.previous_plan``, or the stored plan its
  ``options.previous_plan_id`` names (422 naming that field when none is stored), inlined
  before the check (``request_and_plan.py``, as for ``POST /v1/validate``), so the
  request stored beside the plan is whole.
- Key: stored by the request's hash under the planner version the plan names
  (``plan.planner_version``), marked imported. Its solver report (status, lower bound, gap)
  is the importer's word: the objective and critical path are recomputed, the bound cannot
  be. So an imported plan is fetched by id or alias, listed with ``imported: true`` and
  answered with ``X-Shardplan-Solver-Report: unverified``, and never handed out as this
  planner's answer to a POST, whatever version it claims.

Decoding and validating take time in proportion to the plan, so they run in the CPU lane
(``cpu.py``), never on the event loop, and the body is bounded by
SHARDPLAN_MAX_BODY_BYTES like every other.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool

from planner_service.plan.api import PlanSummary
from planner_service.plan.canonical import canonical_bytes, plan_id_of
from planner_service.plan.codec import plan_bytes, request_hash
from planner_service.plan.types import Violation
from planner_service.service.http.problems import ProblemError
from planner_service.service.request_and_plan import (
    NeedsPreviousPlan,
    checked_with_previous_plan,
    decode_pair,
)
from planner_service.service.settings import Settings
from planner_service.service.state import ServiceState
from planner_service.service.store import PlanBodies
from planner_service.validate.validator import validate_plan

SHOWN_VIOLATIONS = 5


@dataclass(frozen=True)
class CheckedImport:
    """A decoded import, as the CPU lane sends it back: canonical bytes and their keys."""

    plan_id: str  # the content address, computed here
    claimed_plan_id: str  # what the plan says
    planner_version: str
    request_hash: str
    request: bytes
    plan: bytes
    summary: PlanSummary
    violations: list[Violation]


def check_import(
    body: bytes, path_plan_id: str, settings: Settings, previous_plan: bytes | None
) -> CheckedImport | NeedsPreviousPlan:
    """Runs in a CPU-lane worker: decode within the limits, address, validate (only a plan
    that is what both ids say: a 409 needs no validation, nor the previous plan), with
    ``previous_plan`` (the stored plan the request names by id alone) inline."""
    pair = decode_pair(body, settings, previous_plan)
    request, plan = pair.request, pair.plan
    computed = plan_id_of(plan.model_dump(mode="json"))
    same = computed == plan.plan_id == path_plan_id
    if same and pair.missing is not None:
        return pair.missing
    return CheckedImport(
        plan_id=computed,
        claimed_plan_id=plan.plan_id,
        planner_version=plan.planner_version,
        request_hash=request_hash(request),
        request=canonical_bytes(request),
        plan=plan_bytes(plan),
        summary=PlanSummary.of(plan),
        violations=validate_plan(request, plan) if same else [],
    )


async def import_plan(
    state: ServiceState, path_plan_id: str, body: bytes
) -> tuple[CheckedImport, bool]:
    """Check, then store; returns the import and whether this call stored it (False: the
    same plan, so the same bytes, was stored already)."""
    checked = await checked_with_previous_plan(
        state, check_import, body, path_plan_id, state.settings
    )
    if not checked.plan_id == checked.claimed_plan_id == path_plan_id:
        raise _conflict(path_plan_id, checked)
    if checked.violations:
        raise _invalid(checked.violations)
    store = state.store()
    bodies = await run_in_threadpool(lambda: PlanBodies.of(checked.plan, imported=True))
    inserted = await run_in_threadpool(
        lambda: store.plans.put(
            plan_id=checked.plan_id,
            request_hash=checked.request_hash,
            planner_version=checked.planner_version,
            request=checked.request,
            plan=checked.plan,
            bodies=bodies,
            summary=checked.summary,
            imported=True,
        )
    )
    if inserted:  # else the store's copy, which the planner may have made, is the one served
        state.cache.put(checked.plan_id, bodies)
    return checked, inserted


def _conflict(path_plan_id: str, checked: CheckedImport) -> ProblemError:
    return ProblemError(
        409,
        f"the path names plan {path_plan_id} and the plan says plan_id "
        f"{checked.claimed_plan_id}, but its content hashes to {checked.plan_id}: "
        "PUT a plan at its own content address, unchanged since the planner sealed it "
        "(`shardplan validate` says whether it was changed)",
        title="Plan id mismatch",
        path_plan_id=path_plan_id,
        plan_id=checked.claimed_plan_id,
        computed_plan_id=checked.plan_id,
    )


def _invalid(violations: list[Violation]) -> ProblemError:
    lines = [f"  - {violation.message}" for violation in violations[:SHOWN_VIOLATIONS]]
    if len(violations) > SHOWN_VIOLATIONS:
        lines.append(f"  ... and {len(violations) - SHOWN_VIOLATIONS} more (see violations)")
    return ProblemError(
        422,
        f"the plan breaks its request in {len(violations)} way(s); nothing was stored:\n"
        + "\n".join(lines),
        title="Invalid plan",
        violations=[violation.model_dump(mode="json") for violation in violations],
    )
