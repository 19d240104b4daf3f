"""Serving a stored plan's bytes: every response ``GET /v1/plans/{plan_id}`` can give for a
plan, prepared once when the plan enters the in-memory cache, and the ASGI fast path that
sends them to a fetch that hits the cache.

A training job's ranks all fetch one immutable plan at startup. Once the plan is cached,
answering such a fetch is choosing bytes: the encoding from ``Accept-Encoding`` (memoized,
bounded in bytes: fleets send few distinct headers), the representation's ETag against
``If-None-Match``, then one send of headers and one of a body prepared beforehand. No
routing, no dependency injection, no JSON, no database, and nothing allocated in
proportion to the plan. A fetch the fast path does not answer (a cache miss, reads behind
tokens, a refused encoding, a malformed id) goes to the FastAPI route, which answers with
the same prepared responses.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from planner_service.plan.encodings import GZIP, IDENTITY, ZSTD, plan_etag
from planner_service.service.http import metrics
from planner_service.service.http.responses import (
    IMMUTABLE,
    JSON,
    NO_CACHE,
    SOLVER_REPORT_HEADER,
    UNVERIFIED,
    etag_matches,
    negotiate_encoding,
)
from planner_service.service.store import PlanBodies

PLAN_ROUTE = "/v1/plans/{plan_id}"
_PREFIX = "/v1/plans/"
_PLAN_ID = re.compile(r"[0-9a-f]{64}")
_PATH_LENGTH = len(_PREFIX) + 64
Headers = list[tuple[bytes, bytes]]


@dataclass(frozen=True, slots=True)
class Representation:
    """One encoding of a plan: its body, its ETag's opaque tag, and the headers of a 200
    and of a 304 for it."""

    encoding: str
    etag: str
    body: bytes
    ok_headers: Headers
    not_modified_headers: Headers


@dataclass(frozen=True, slots=True)
class PlanResponses:
    """A plan's bytes and every representation of it, ready to send."""

    bodies: PlanBodies
    representations: dict[str, Representation]

    @classmethod
    def of(cls, plan_id: str, bodies: PlanBodies) -> PlanResponses:
        """Every representation's headers, saying on each that the solver report is
        unverified when the plan was imported."""
        encoded = {IDENTITY: bodies.identity, GZIP: bodies.gzip, ZSTD: bodies.zstd}
        said: Headers = [_UNVERIFIED] if bodies.imported else []
        return cls(
            bodies,
            {
                coding: _representation(plan_id, coding, body, said)
                for coding, body in encoded.items()
            },
        )

    @property
    def imported(self) -> bool:
        return self.bodies.imported

    @property
    def size(self) -> int:
        return self.bodies.size

    def answer(self, encoding: str, if_none_match: str | None) -> tuple[int, Headers, bytes]:
        """(status, headers, body) for a fetch that negotiated ``encoding``."""
        chosen = self.representations[encoding]
        if etag_matches(if_none_match, chosen.etag):
            return 304, chosen.not_modified_headers, b""
        return 200, chosen.ok_headers, chosen.body


def revalidated(headers: Headers, plan_id: str, *named: tuple[bytes, bytes]) -> Headers:
    """A plan's prepared headers for an answer under a name whose plan can change (an
    alias, which moves; an id prefix, which a plan stored later can make ambiguous):
    ``no-cache`` instead of immutable, the plan named by ``X-Shardplan-Plan-Id``, then
    ``named``."""
    return [
        *((key, value) for key, value in headers if key != b"cache-control"),
        (b"cache-control", NO_CACHE.encode()),
        (b"x-shardplan-plan-id", plan_id.encode()),
        *named,
    ]


class PreparedResponse(Response):
    """A route's answer from prepared headers and body, sent as they are."""

    def __init__(self, status: int, headers: Headers, body: bytes) -> None:
        self.status_code = status
        self.raw_headers = list(headers)  # a copy: the prepared list is shared
        self.body = body
        self.background = None


_UNVERIFIED = (SOLVER_REPORT_HEADER.lower().encode(), UNVERIFIED.encode())


def _representation(plan_id: str, encoding: str, body: bytes, said: Headers) -> Representation:
    etag = plan_etag(plan_id, encoding)
    common: Headers = [
        (b"etag", f'"{etag}"'.encode()),
        (b"cache-control", IMMUTABLE.encode()),
        (b"vary", b"Accept-Encoding"),
        *said,
    ]
    ok = [
        (b"content-type", JSON.encode()),
        (b"content-length", str(len(body)).encode()),
        *common,
    ]
    if encoding != IDENTITY:
        ok.append((b"content-encoding", encoding.encode()))
    return Representation(encoding, etag, body, ok, common)


# The memo of negotiated encodings holds at most MEMO_ENTRIES headers of at most
# MEMO_KEY_CHARS each (1,024 x 256: 256 KiB and the entries' overhead): bounded in bytes, as
# a memo keyed by what clients send must be. Real headers are short ("gzip, deflate, br,
# zstd" is 23 characters); a longer one is negotiated each time, never kept.
MEMO_ENTRIES = 1024
MEMO_KEY_CHARS = 256


def negotiated(accept_encoding: str | None) -> str | None:
    """``negotiate_encoding``, memoized for headers of a fleet's usual size: a fleet's
    clients send a handful of distinct headers, so after the first of each this is a
    dictionary lookup."""
    if accept_encoding is not None and len(accept_encoding) > MEMO_KEY_CHARS:
        return negotiate_encoding(accept_encoding)
    return _memoized(accept_encoding)


@functools.lru_cache(maxsize=MEMO_ENTRIES)
def _memoized(accept_encoding: str | None) -> str | None:
    return negotiate_encoding(accept_encoding)


def fetch_headers(headers: Iterable[tuple[bytes, bytes]]) -> tuple[str | None, str | None]:
    """``Accept-Encoding`` and ``If-None-Match`` from ASGI raw headers, each list header
    given more than once joined with ", " (RFC 9110 §5.3)."""
    accept: str | None = None
    if_none_match: str | None = None
    for name, value in headers:
        if name == b"accept-encoding":
            text = value.decode("latin-1")
            accept = text if accept is None else f"{accept}, {text}"
        elif name == b"if-none-match":
            text = value.decode("latin-1")
            if_none_match = text if if_none_match is None else f"{if_none_match}, {text}"
    return accept, if_none_match


class CachedPlans(Protocol):
    """Where the fast path finds a plan's prepared responses (``state.PlanCache``)."""

    def get(self, plan_id: str) -> PlanResponses | None: ...


class PlanFetchFastPath:
    """Pure ASGI middleware, outermost: answers ``GET``/``HEAD /v1/plans/{plan_id}`` for a
    cached plan from its prepared responses, counting it in the same metrics as the route
    would; everything else passes through untouched."""

    def __init__(self, app: ASGIApp, cache: CachedPlans, *, open_reads: bool) -> None:
        self.app = app
        self.cache = cache
        self.open_reads = open_reads  # reads behind tokens go through the route's check
        self._memory = metrics.cache_counter(metrics.CacheLookup.MEMORY)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if (
            len(path) == _PATH_LENGTH
            and self.open_reads
            and scope["type"] == "http"
            and scope["method"] in ("GET", "HEAD")
            and path.startswith(_PREFIX)
            and _PLAN_ID.fullmatch(path, len(_PREFIX))
        ):
            started = time.perf_counter()
            cached = self.cache.get(path[len(_PREFIX) :])
            if cached is not None:
                accept, if_none_match = fetch_headers(scope["headers"])
                encoding = negotiated(accept)
                if encoding is not None:
                    status, headers, body = cached.answer(encoding, if_none_match)
                    start = {"type": "http.response.start", "status": status, "headers": headers}
                    await send(start)
                    if scope["method"] == "HEAD":
                        body = b""
                    await send({"type": "http.response.body", "body": body})
                    self._memory.inc()
                    metrics.observe(PLAN_ROUTE, scope["method"], status, started)
                    return
        await self.app(scope, receive, send)
