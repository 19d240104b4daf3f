"""The plan vocabulary: what a request, a plan and its shards are (``types``), their
canonical JSON and content addresses (``codec``), input errors that name the field
(``errors``), shard geometry (``shards``) and usable capacity per rank (``capacity``).

Imported by every other stage, by the runtime on training workers and by the clients, so it
depends on pydantic and numpy only: nothing from the rest of ``planner_service``, and no
torch, OR-Tools or FastAPI.
"""
