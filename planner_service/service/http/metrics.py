"""Prometheus metrics, with ``prometheus_client``.

With several uvicorn workers (``shardplan serve --workers N``) the CLI points
``PROMETHEUS_MULTIPROC_DIR`` at a fresh directory before the workers start, and
``/metrics`` then sums every worker's values (``MultiProcessCollector``).
"""

from __future__ import annotations

import os
import time
from enum import StrEnum

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client import multiprocess as prometheus_multiprocess
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class CacheLookup(StrEnum):
    """Where a plan lookup was answered, as ``shardplan_plan_cache_total`` counts it."""

    MEMORY = "memory"  # a fetch served from the in-process cache
    STORE = "store"  # a fetch read from the database
    REQUEST = "request"  # a POST answered by a stored plan for the same request_hash
    SHARED = "shared"  # a POST that joined an identical solve in flight
    MISS = "miss"  # a POST that solved


REQUESTS = Counter(
    "shardplan_http_requests_total",
    "HTTP requests by route and status",
    ["route", "method", "status"],
)
LATENCY = Histogram(
    "shardplan_http_request_duration_seconds",
    "HTTP request latency by route",
    ["route", "method"],
    buckets=(
        0.0005,
        0.001,
        0.0025,
        0.005,
        0.01,
        0.025,
        0.05,
        0.1,
        0.25,
        0.5,
        1,
        2.5,
        5,
        10,
        30,
        60,
    ),
)
SOLVE_SECONDS = Histogram(
    "shardplan_solve_duration_seconds",
    "Wall time of solves in the worker processes, by outcome",
    ["outcome"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300),
)
CACHE = Counter(
    "shardplan_plan_cache_total",
    "Plan lookups by where they were answered: memory (fetch served from the in-process "
    "cache), store (fetch read from the database), request (POST answered by a stored plan "
    "for the same request_hash), shared (POST joined an identical solve in flight), "
    "miss (POST solved)",
    ["result"],
)
QUEUE_DEPTH = Gauge(
    "shardplan_solve_queue_depth",
    "Solves admitted and not finished (running + queued)",
    multiprocess_mode="livesum",
)
REJECTED = Counter("shardplan_solve_rejected_total", "Solves turned away with 503 (pool full)")


def cache_counter(lookup: CacheLookup) -> Counter:
    """The plan-cache counter of ``lookup`` (its label: the enum's value)."""
    return CACHE.labels(lookup.value)


def render() -> tuple[bytes, str]:
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        registry = CollectorRegistry()
        prometheus_multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(), CONTENT_TYPE_LATEST


class MetricsMiddleware:
    """Pure ASGI middleware (no per-request task, unlike BaseHTTPMiddleware): counts every
    HTTP request by its route template and status, and times it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            observe(getattr(route, "path", None) or "unmatched", scope["method"], status, start)


# A request whose client went away before it was answered (nginx's code; no response is
# sent): not a server error, so not a 500.
CLIENT_CLOSED = 499
# Methods counted under their own name; any other is counted as OTHER_METHOD, so that a
# client cannot grow the label set (or this process's memory) by inventing methods.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OTHER_METHOD = "OTHER"
_children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}


def observe(template: str, method: str, status: int, started: float) -> None:
    """Counts one request to the route ``template`` and times it from ``started``
    (``time.perf_counter()``). The labelled children are looked up once per combination:
    templates, methods (``METHODS``) and statuses are few."""
    if method not in METHODS:
        method = OTHER_METHOD
    key = (template, method, status)
    children = _children.get(key)
    if children is None:
        children = REQUESTS.labels(template, method, str(status)), LATENCY.labels(template, method)
        _children[key] = children
    children[0].inc()
    children[1].observe(time.perf_counter() - started)
