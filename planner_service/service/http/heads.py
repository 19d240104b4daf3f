"""Request-head limits: the HTTP protocol ``shardplan serve`` runs (uvicorn's httptools
protocol, bounded), which answers 431 to a header field or a request head over its limit
before the request reaches the app.

uvicorn's httptools protocol takes headers of any size (a 16 MB header was served 200, and
600 distinct 1 MB ``Accept-Encoding`` values grew a worker by 586 MiB, issue 36); its h11
protocol bounds them but answers 400 and is slower. Here the request line and every header
are counted as the parser hands them over, and bytes that arrive while a head is still
incomplete are counted as they arrive, so a connection never holds more than the limit
plus one read (``READ_BYTES``) of an unfinished head.

What a client over a limit sees: a 431 problem+json naming the limit and its variable,
``Connection: close``, and the end of the connection once it stops sending or
``LINGER_S`` has passed (until then what it sends is read and dropped, so that the 431 is
not lost to a reset while it is still sending). It is counted in
``shardplan_http_requests_total{route="unmatched",status="431"}``.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from planner_service.plan.units import size
from planner_service.service.http import metrics
from planner_service.service.http.problems import ProblemError
from planner_service.service.settings import Settings

TOO_LARGE = HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE
# The most asyncio's and uvloop's transports read at once (256 KiB).
READ_BYTES = 256 * 1024
LINGER_S = 2.0
FIELD_SEPARATORS = len(": \r\n")


@dataclass(frozen=True)
class HeadLimits:
    """The per-header and whole-head limits, in bytes."""

    header_bytes: int
    head_bytes: int

    def header_problem(self, name: bytes, field_bytes: int) -> str | None:
        """Why one header field of ``field_bytes`` (name and value) is refused, if it is."""
        if field_bytes <= self.header_bytes:
            return None
        shown = name[:64].decode("latin-1")
        return (
            f"the header {shown!r} is {field_bytes:,} bytes (name and value); this service "
            f"accepts at most {_bytes(self.header_bytes)} per header "
            "(SHARDPLAN_MAX_HEADER_BYTES)"
        )

    def head_problem(self, head_bytes: int) -> str | None:
        """Why a request line and headers of ``head_bytes`` in all are refused, if they are."""
        if head_bytes <= self.head_bytes:
            return None
        return (
            f"the request line and headers are more than {self.head_bytes:,} bytes; this "
            f"service accepts at most {_bytes(self.head_bytes)} in all "
            "(SHARDPLAN_MAX_REQUEST_HEAD_BYTES)"
        )


def _bytes(limit: int) -> str:
    return f"{limit:,} bytes ({size(limit)})"


@functools.cache
def served_limits() -> HeadLimits:
    """This process's limits, read once: every ``shardplan serve`` worker reads the same
    environment (``settings.py``)."""
    settings = Settings.from_env()
    return HeadLimits(settings.max_header_bytes, settings.max_request_head_bytes)


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with ``served_limits()`` on every request head.

    A refused request goes no further: the parser's later callbacks for it (the end of
    its headers, its body) do nothing, so the app never sees it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = served_limits()
        self.head_bytes = 0  # of the head being parsed: the URL and the headers handed over
        self.unparsed_bytes = 0  # received while the head was incomplete
        self.in_head = True
        self.heads_begun = 0
        self.refused = False

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return  # read and dropped until the client closes or LINGER_S passes
        in_head, begun = self.in_head, self.heads_begun
        super().data_received(data)
        if self.refused or not (in_head and self.in_head and begun == self.heads_begun):
            return
        # All of ``data`` belonged to the head still incomplete; the parser holds it.
        self.unparsed_bytes += len(data)
        self._check(self.limits.head_problem(self.unparsed_bytes))

    def on_message_begin(self) -> None:
        if self.refused:
            return
        super().on_message_begin()
        self.head_bytes = self.unparsed_bytes = 0
        self.in_head = True
        self.heads_begun += 1

    def on_url(self, url: bytes) -> None:
        if self.refused:
            return
        self.head_bytes += len(url)
        if self._check(self.limits.head_problem(self.head_bytes)):
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.refused:
            return
        field_bytes = len(name) + len(value)
        self.head_bytes += field_bytes + FIELD_SEPARATORS
        problem = self.limits.header_problem(name, field_bytes)
        if self._check(problem or self.limits.head_problem(self.head_bytes)):
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self.in_head = False
        if not self.refused:
            super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self.refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self.refused:
            super().on_message_complete()

    def _check(self, problem: str | None) -> bool:
        """True to go on; else answers 431 with ``problem`` and refuses the connection."""
        if problem is None:
            return True
        self.refused = True
        self.transport.write(_refusal(problem))
        if self.transport.can_write_eof():
            self.transport.write_eof()  # the answer, then the end; reading goes on
        self.loop.call_later(LINGER_S, self.transport.close)
        metrics.observe("unmatched", _method(self), TOO_LARGE.value, time.perf_counter())
        return False


def _method(protocol: HttpToolsProtocol) -> str:
    try:
        return protocol.parser.get_method().decode("ascii", "replace")
    except Exception:  # noqa: BLE001 (httptools raises before the method is parsed)
        return metrics.OTHER_METHOD


def _refusal(detail: str) -> bytes:
    """The 431 problem+json, as bytes on the wire."""
    response = ProblemError(TOO_LARGE.value, detail).response()
    lines = [f"HTTP/1.1 {TOO_LARGE.value} {TOO_LARGE.phrase}".encode()]
    lines += [name + b": " + value for name, value in response.raw_headers]
    lines.append(b"connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + bytes(response.body)
