"""The least an ASGI app under uvicorn can do to answer a plan fetch: ``serve_bench``'s
floor. It holds one plan's three encodings in memory (read from ``$FLOOR_PLAN_DIR``:
``identity``, ``gzip``, ``zstd``) and answers every request with the one whose name first
appears in ``Accept-Encoding``: no routing, no negotiation rules, no ETags, no metrics.

    uvicorn --factory benchmarks.serve_floor:create --port N
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

CODINGS = (b"zstd", b"gzip")


def create() -> Any:
    folder = Path(os.environ["FLOOR_PLAN_DIR"])
    answers = {}
    for name in (b"identity", *CODINGS):
        body = (folder / name.decode()).read_bytes()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        if name != b"identity":
            headers.append((b"content-encoding", name))
        answers[name] = ({"type": "http.response.start", "status": 200, "headers": headers},
                         {"type": "http.response.body", "body": body})  # fmt: skip

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        accept = next((value for key, value in scope["headers"] if key == b"accept-encoding"), b"")
        chosen = next((name for name in CODINGS if name in accept), b"identity")
        start, body = answers[chosen]
        await send(start)
        await send(body)

    return app
