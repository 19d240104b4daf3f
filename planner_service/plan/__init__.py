"""The plan vocabulary: what a request, a plan and its shards are (``types``), their
canonical JSON and content addresses (``canonical``), the schema versions read and written
(``schema_version``), request hashes, sealing and safe decoding (``codec``), input errors
that name the field (``errors``), plan ids as people type them, whole or a unique prefix
(``plan_ids``), shard geometry (``shards``), the run encodings of schema 2.0's tables
(``runs``) and the conversion between a table's shard list and its runs (``compact``),
usable capacity per rank
(``capacity``), the bytes that move between ranks when a plan changes (``transfers``), the
diff of two plans (``diff``) and the migration between them (``migrate``).

Imported by every other stage, by the runtime on training workers and by the clients, so it
depends on pydantic and numpy only: nothing from the rest of ``planner_service``, and no
torch, OR-Tools or FastAPI. No two of its modules import each other (tests/project/test_imports.py).
"""
