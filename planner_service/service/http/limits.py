"""Input limits: body size (413, enforced before the body is read into a route) and the
size of a plan request, or of a request and a plan in one body (422 naming the field, the
value and the limit). A plan inside a request (``options.previous_plan``) and an imported
plan are held to the limits of the requests this service plans: their world size and
their number of tables."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import TypeVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from planner_service.plan.codec import load_json, parse_plan, parse_request
from planner_service.plan.errors import FieldProblem, InputError
from planner_service.plan.types import PlanRequest, ShardingPlan
from planner_service.service.http.openapi import JsonObject
from planner_service.service.http.problems import ProblemError
from planner_service.service.settings import Settings

M = TypeVar("M")


def decode_plan_request(body: bytes, settings: Settings, *, source: str = "body") -> PlanRequest:
    """Parse a PlanRequest from a request body and apply the service's limits."""
    document = load_json(body, source)
    too_many = raw_request_limits(document, settings)
    if too_many:
        raise InputError(source, too_many)
    request = parse_request(body, source=source)
    problems = [*request_limits(request, settings), *time_limit(request, settings)]
    if problems:
        raise InputError(source, problems)
    return request


def raw_request_limits(document: object, settings: Settings, at: str = "") -> list[FieldProblem]:
    """The tables of a request and of its inline previous plan counted on the raw document
    (any JSON value), before a single table is validated."""
    if not isinstance(document, dict):
        return []
    options = document.get("options")
    previous = options.get("previous_plan") if isinstance(options, dict) else None
    counted = [(f"{at}tables", document.get("tables"))]
    if isinstance(previous, dict):
        counted.append((f"{at}options.previous_plan.tables", previous.get("tables")))
    problems = [tables_limit(tables, settings, path) for path, tables in counted]
    return [problem for problem in problems if problem is not None]


def request_limits(request: PlanRequest, settings: Settings, at: str = "") -> list[FieldProblem]:
    """The world sizes of a request and of its inline previous plan (a plan this service
    could not have made is no plan to re-plan from)."""
    world = request.topology.world_size
    problems = world_size_limit(f"{at}topology.world_size", world, settings)
    previous = request.options.previous_plan
    if previous is not None:
        path = f"{at}options.previous_plan.world_size"
        problems += world_size_limit(path, previous.world_size, settings)
    return problems


def decode_request_and_plan(body: bytes, settings: Settings) -> tuple[PlanRequest, ShardingPlan]:
    """Both documents, within the service's limits; every problem in either is reported at
    once, by its path in the body (``request.tables[0].name``, ``plan.world_size``)."""
    document = load_json(body, source="body")
    if not isinstance(document, dict) or set(document) != {"request", "plan"}:
        problem = FieldProblem(
            "", 'expected a JSON object with exactly the keys "request" and "plan"'
        )
        raise InputError("body", [problem])
    too_many = raw_request_limits(document["request"], settings, at="request.")
    raw_plan = document["plan"]
    plan_tables = raw_plan.get("tables") if isinstance(raw_plan, dict) else None
    too_many += filter(None, [tables_limit(plan_tables, settings, "plan.tables")])
    if too_many:
        raise InputError("body", too_many)
    problems: list[FieldProblem] = []
    request = _part(parse_request, document, "request", problems)
    plan = _part(parse_plan, document, "plan", problems)
    if request is not None:
        problems += request_limits(request, settings, at="request.")
    if plan is not None:
        problems += world_size_limit("plan.world_size", plan.world_size, settings)
    if problems or request is None or plan is None:
        raise InputError("body", problems)
    return request, plan


def _part(
    parse: Callable[..., M], document: JsonObject, key: str, problems: list[FieldProblem]
) -> M | None:
    """``document[key]`` parsed, or None with its problems added under ``key``."""
    try:
        return parse(json.dumps(document[key]), source=key)
    except InputError as error:
        problems += [
            dataclasses.replace(problem, path=_under(key, problem.path))
            for problem in error.problems
        ]
        return None


def _under(key: str, path: str) -> str:
    if not path:
        return key
    return f"{key}{path}" if path.startswith("[") else f"{key}.{path}"


def tables_limit(tables: object, settings: Settings, path: str = "tables") -> FieldProblem | None:
    """Checked on the raw document (``tables`` any JSON value: a request's list, a plan's
    object), before a single table is validated."""
    if isinstance(tables, list | dict) and len(tables) > settings.max_tables:
        return FieldProblem(
            path,
            f"this service plans at most {settings.max_tables} tables per request "
            f"(SHARDPLAN_MAX_TABLES); got {len(tables)}",
        )
    return None


def world_size_limit(path: str, world_size: int, settings: Settings) -> list[FieldProblem]:
    if world_size <= settings.max_world_size:
        return []
    message = (
        f"must be at most {settings.max_world_size} on this service (SHARDPLAN_MAX_WORLD_SIZE)"
    )
    return [FieldProblem(path, message, world_size)]


def time_limit(request: PlanRequest, settings: Settings) -> list[FieldProblem]:
    if request.options.time_limit_s <= settings.max_time_limit_s:
        return []
    return [
        FieldProblem(
            "options.time_limit_s",
            f"must be at most {settings.max_time_limit_s:g} s on this service "
            "(SHARDPLAN_MAX_TIME_LIMIT_S); plan longer solves with the `shardplan plan` CLI",
            request.options.time_limit_s,
        )
    ]


class BodyLimitMiddleware:
    """Refuse request bodies over ``max_bytes`` with 413 before any route reads them: by
    Content-Length when given, by counting when the body is chunked."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = None
        for key, value in scope["headers"]:
            if key == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await self._refuse(send, 400, f"Content-Length {value!r} is not a number")
                    return
        if declared is not None:
            if declared > self.max_bytes:
                await self._too_large(send, f"{declared} bytes")
                return
            await self.app(scope, receive, send)
            return
        # No Content-Length (chunked): read it here, up to the limit, then replay it.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, receive, send)  # disconnect: let the app see it
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(send, f"more than {self.max_bytes} bytes")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return dict(await receive())

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send, size: str) -> None:
        await self._refuse(
            send,
            413,
            f"the request body is {size}; this service accepts at most {self.max_bytes} bytes "
            "(SHARDPLAN_MAX_BODY_BYTES)",
        )

    @staticmethod
    async def _refuse(send: Send, status: int, detail: str) -> None:
        response = ProblemError(status, detail).response()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": response.raw_headers,
            }
        )
        await send({"type": "http.response.body", "body": response.body})
