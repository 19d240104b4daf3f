"""When each request was received: the clock its ``options.time_limit_s`` counts on.

``RequestClock`` stamps every HTTP request (``time.monotonic()``) as the app first sees it,
before its body is read, and ``received_at`` reads the stamp back in a route, so a solve's
deadline counts everything the request waited for: reading and decoding its body, inlining
what it names, the solve, storing the plan and answering (docs/service.md, "Time limits").
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

RECEIVED_AT = "shardplan_received_at"


class RequestClock:
    """Pure ASGI middleware, outermost of the app's: stamps the request in its scope's
    ``state`` (what ``Request.state`` reads)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope.setdefault("state", {})[RECEIVED_AT] = time.monotonic()
        await self.app(scope, receive, send)


def received_at(request: Request) -> float:
    """When ``request`` was received (now, for an app run without ``RequestClock``)."""
    stamp = request.scope.get("state", {}).get(RECEIVED_AT)
    return time.monotonic() if stamp is None else float(stamp)
