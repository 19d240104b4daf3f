"""The bytes of each content coding a plan is stored and served in (the codings themselves,
their names and entity tags, are ``planner_service.plan.encodings``, shared with the
client): made once, when the plan is stored, the same bytes on every replica.

They live with the store, not the vocabulary: the vocabulary imports only pydantic and
numpy (``tests/project/test_imports.py``), and only the service encodes.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass

import zstandard

GZIP_LEVEL = 6
ZSTD_LEVEL = 3


def gzip_plan(data: bytes) -> bytes:
    """The plan's gzip encoding, the same bytes every time for the same plan on the same
    zlib: level 6, mtime 0 (RFC 1952 "no time stamp"), no file name."""
    return gzip.compress(data, compresslevel=GZIP_LEVEL, mtime=0)


def zstd_plan(data: bytes) -> bytes:
    """The plan's zstd encoding (RFC 8878), the same bytes every time for the same plan on
    the same zstd: level 3, one frame with the content size and a checksum of the content
    (so a damaged body fails to decode)."""
    compressor = zstandard.ZstdCompressor(
        level=ZSTD_LEVEL, write_content_size=True, write_checksum=True
    )
    return compressor.compress(data)


@dataclass(frozen=True)
class PlanBodies:
    """A stored plan's representations: its identity bytes and their gzip and zstd
    encodings, and whether it was imported (stored by PUT, made elsewhere: every answer
    that serves it says its solver report is unverified)."""

    identity: bytes
    gzip: bytes
    zstd: bytes
    imported: bool = False

    @classmethod
    def of(cls, data: bytes, *, imported: bool = False) -> PlanBodies:
        return cls(data, gzip_plan(data), zstd_plan(data), imported)

    @property
    def size(self) -> int:
        return len(self.identity) + len(self.gzip) + len(self.zstd)
