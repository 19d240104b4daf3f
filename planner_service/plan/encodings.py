"""The content codings a stored plan is served in, and the entity tag of each
representation: shared by the service, which stores and serves them, and the client, which
asks for them and revalidates with their tags. The bytes of each coding are made by the
service alone (``planner_service/service/store/encodings.py``: zstandard is not a
vocabulary dependency)."""

from __future__ import annotations

IDENTITY = "identity"
GZIP = "gzip"
ZSTD = "zstd"
# The codings each plan is stored in besides identity, the smallest body first: of codings
# a client weighs alike, the first here is sent.
CODINGS = (ZSTD, GZIP)
ENCODINGS = (IDENTITY, *CODINGS)


def plan_etag(plan_id: str, encoding: str) -> str:
    """The opaque tag of one representation of a plan: the plan_id for its identity bytes,
    ``<plan_id>-<coding>`` for an encoding of them (RFC 9110 §8.8.3: a strong tag differs
    between representations)."""
    return plan_id if encoding == IDENTITY else f"{plan_id}-{encoding}"
