"""When the client tries again, and how long it waits first.

Retried: connection errors (refused, reset, timed out: ``httpx.TimeoutException``,
``httpx.NetworkError``, ``httpx.RemoteProtocolError``) and the statuses that mean "not
now" (429, 502, 503, 504). Never retried: any other status, above all a 4xx about the
input, which the same input would get again.

Retrying is safe for every call this client makes. ``POST /v1/plans`` is content
addressed: the same request gets the same stored plan, and a solve whose caller went away
still stores its plan for the retry. ``PUT /v1/plans/{id}`` stores a plan once by its id.
``PUT /v1/aliases/{name}`` leaves the alias where it was asked to point, though a retry
after a lost answer can add a second, identical entry to the alias's history. The others
only read (``/v1/check`` and ``/v1/validate`` store nothing).

Waits use exponential backoff with full jitter: before retry n, a wait drawn uniformly
from [0, min(max_backoff_s, backoff_s * 2^(n-1))], so that many clients turned away
together do not come back together. A ``Retry-After`` (seconds or an HTTP date) replaces
that: the wait is what the service asked for, capped at ``max_retry_after_s``, plus up to
``backoff_s`` of jitter.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

RETRY_STATUSES = frozenset({429, 502, 503, 504})
_RETRY_ERRORS = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


@dataclass(frozen=True)
class RetryPolicy:
    """``retries`` retries after the first attempt (so ``retries + 1`` attempts at most)."""

    retries: int = 4
    backoff_s: float = 0.5
    max_backoff_s: float = 10.0
    max_retry_after_s: float = 60.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("retries", "backoff_s", "max_backoff_s", "max_retry_after_s"):
            value = getattr(self, name)
            if not value >= 0:  # also refuses NaN
                raise ValueError(f"{name} = {value!r}: must be at least 0")

    def delay_s(self, retry: int, retry_after_s: float | None = None) -> float:
        """The wait before retry number ``retry`` (1 for the first retry)."""
        if retry_after_s is not None:
            return min(retry_after_s, self.max_retry_after_s) + self.rng.uniform(0, self.backoff_s)
        ceiling = min(self.max_backoff_s, self.backoff_s * 2 ** min(retry - 1, 64))
        return self.rng.uniform(0, ceiling)


def is_retryable(outcome: httpx.Response | httpx.RequestError) -> bool:
    if isinstance(outcome, httpx.Response):
        return outcome.status_code in RETRY_STATUSES
    return isinstance(outcome, _RETRY_ERRORS)


def retry_after_s(response: httpx.Response) -> float | None:
    """The response's ``Retry-After`` in seconds from now; None when absent or unreadable."""
    value = response.headers.get("retry-after", "").strip()
    if not value:
        return None
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
