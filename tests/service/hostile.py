"""Hostile inputs for the service and the decoders: numbers at and past every documented
maximum, bodies nested too deep, numbers too long to convert. Each once gave a 500 or held
a solver for minutes (issue 18, section 2); each must now be a 422 that names the field,
the value and the limit. Shared by the in-process and the real-server tests.

On the wire (issue 36): request heads over their limits (431 naming the limit), and
clients that go away mid-body on every route that reads one (499, never a 500). In the
bodies (issue 36, items 5 and 8): text no store keeps alike (a NUL PostgreSQL refused
with a 503), an inline previous plan past the service's world size, an import re-planned
from a plan that is not stored, and a validation against one (item 8)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from planner_service.plan.canonical import canonical_bytes, plan_id_of
from planner_service.plan.codec import parse_request, request_hash
from tests.support import builders
from tests.support.builders import request, table

DEEP = 1_000  # json.loads recursed past Python's limit here (900 gave a 422)
LONG_DIGITS = 4_301  # one past int()'s 4,300-digit limit: a ValueError, not a number
BANDWIDTHS = (
    "hbm_bw_bytes_per_s",
    "ddr_bw_bytes_per_s",
    "hbm_to_ddr_bw_bytes_per_s",
    "intra_host_bw_bytes_per_s",
    "inter_host_bw_bytes_per_s",
)


@dataclass(frozen=True)
class Hostile:
    """A request body, the JSON path its 422 must name, and text its message must hold
    (the limit or what is accepted)."""

    name: str
    body: bytes
    path: str
    says: str


def valid_request() -> dict[str, Any]:
    return {
        "topology": {"world_size": 2},
        "tables": [table("t0", rows=1000, dim=16)],
        "options": {"time_limit_s": 1.0},
    }


def _with(path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    document = valid_request()
    node: Any = document
    for key in path[:-1]:
        node = node[key] if isinstance(key, int) or key in node else node.setdefault(key, {})
    node[path[-1]] = value
    return document


def _case(name: str, path: tuple[str | int, ...], value: Any, path_text: str, says: str) -> Hostile:
    return Hostile(name, json.dumps(_with(path, value)).encode(), path_text, says)


def request_cases() -> list[Hostile]:
    """Hostile PlanRequest documents (the bodies of POST /v1/plans and /v1/check)."""
    all_slow = valid_request()
    all_slow["topology"].update({field: 1e-300 for field in BANDWIDTHS})
    dim = ("tables", 0, "embedding_dim")
    cases = [
        _case(f"embedding_dim {v}", dim, v, "tables[0].embedding_dim", "65536")
        for v in (10**8, 2**40, 2**63, 10**30)
    ]
    cases += [
        _case(
            "hbm_bytes 10**30",
            ("topology", "hbm_bytes"),
            10**30,
            "topology.hbm_bytes",
            "9007199254740992",
        ),
        _case(
            "ddr_bytes 2**64",
            ("topology", "ddr_bytes"),
            2**64,
            "topology.ddr_bytes",
            "9007199254740992",
        ),
        _case(
            "override hbm_bytes 10**30",
            ("topology", "rank_overrides"),
            [{"rank": 0, "hbm_bytes": 10**30}],
            "topology.rank_overrides[0].hbm_bytes",
            "9007199254740992",
        ),
        _case(
            "num_embeddings 10**4000",
            ("tables", 0, "num_embeddings"),
            10**4000,
            "tables[0].num_embeddings",
            "1099511627776",
        ),
        _case(
            "pooling_factors 1e308",
            ("tables", 0, "pooling_factors"),
            [1e308],
            "tables[0].pooling_factors[0]",
            "1000000",
        ),
        _case(
            "hbm_bw 5e-324",
            ("topology", "hbm_bw_bytes_per_s"),
            5e-324,
            "topology.hbm_bw_bytes_per_s",
            "1000000",
        ),
        Hostile(
            "every bandwidth 1e-300",
            json.dumps(all_slow).encode(),
            "topology.inter_host_bw_bytes_per_s",
            "1000000",
        ),
        _case(
            "bandwidth 1e17",
            ("topology", "ddr_bw_bytes_per_s"),
            1e17,
            "topology.ddr_bw_bytes_per_s",
            "10000000000000000",
        ),
        _case(
            "world_size 10**7", ("topology", "world_size"), 10**7, "topology.world_size", "131072"
        ),
        _case("batch_size 2**40", ("batch_size",), 2**40, "batch_size", "16777216"),
        _case(
            "batch_sizes 2**40",
            ("tables", 0, "batch_sizes"),
            [2**40],
            "tables[0].batch_sizes[0]",
            "16777216",
        ),
        _case(
            "time_limit_s 1e9", ("options", "time_limit_s"), 1e9, "options.time_limit_s", "86400"
        ),
        _case("seed 2**31", ("options", "seed"), 2**31, "options.seed", "2147483647"),
        _case(
            "min_partition 10**9",
            ("constraints", "tables"),
            {"t0": {"min_partition": 10**9}},
            "constraints.tables.t0.min_partition",
            "65536",
        ),
        _case(
            "constraint ranks repeated",
            ("constraints", "tables"),
            {"t0": {"ranks": [1, 1, 1]}},
            "constraints.tables.t0.ranks",
            "more than once",
        ),
        _case(
            "feature_names 4097",
            ("tables", 0, "feature_names"),
            [f"f{i}" for i in range(4097)],
            "tables[0].feature_names",
            "4096",
        ),
        _case(
            "dense_bytes_per_rank 2**60",
            ("constraints", "dense_bytes_per_rank"),
            2**60,
            "constraints.dense_bytes_per_rank",
            "9007199254740992",
        ),
    ]
    world_size = body_cases(
        lambda value: b'{"topology": {"world_size": ' + value + b"}}", "topology.world_size"
    )
    return cases + world_size + text_cases() + previous_plan_cases()


def text_cases() -> list[Hostile]:
    """Names no store keeps alike (issue 36, item 5): PostgreSQL answered 503 to a NUL."""
    name = ("tables", 0, "name")
    return [
        _case("table name with NUL", name, "t\u0000", "tables[0].name", "U+0000"),
        _case("table name with U+202E", name, "t\u202e0", "tables[0].name", "U+202E"),
        _case("table name with a leading space", name, " t0", "tables[0].name", "white space"),
    ]


def previous_plan_cases() -> list[Hostile]:
    """An inline previous plan this service could not have made (issue 36, item 8): its
    world size over SHARDPLAN_MAX_WORLD_SIZE (moved bytes were computed from it)."""
    _, plan = valid_pair()
    wide = resealed(plan, world_size=131_072)
    return [
        _case(
            "previous_plan world_size 131072",
            ("options", "previous_plan"),
            wide,
            "options.previous_plan.world_size",
            "SHARDPLAN_MAX_WORLD_SIZE",
        )
    ]


def resealed(plan: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """``plan`` changed and given its new content address, as a forger would."""
    forged = {**json.loads(json.dumps(plan)), **changes}
    forged["plan_id"] = plan_id_of(forged)
    return forged


def unknown_previous_import() -> tuple[str, Hostile]:
    """An import re-planned from a plan no store holds, its migration claiming moves from
    it (issue 36, item 8: it was stored): the plan's id, and the body."""
    req_doc, plan = valid_pair()
    unknown = "e" * 64
    req_doc["options"]["previous_plan_id"] = unknown
    plan["solver"]["stop_reason"] = "optimal"
    migration = {
        "previous_plan_id": unknown,
        "moved_bytes": 0,
        "tables_moved": 0,
        "ranks": [],
        "max_moved_bytes": None,
        "move_cost_ms_per_gib": None,
    }
    forged = resealed(
        plan,
        migration=migration,
        request_hash=request_hash(parse_request(json.dumps(req_doc))),
    )
    body = json.dumps({"request": req_doc, "plan": forged}).encode()
    path = "request.options.previous_plan_id"
    return forged["plan_id"], Hostile("previous_plan_id not stored", body, path, "no plan")


def body_cases(wrap: Callable[[bytes], bytes], path: str) -> list[Hostile]:
    """Bodies broken below any model, with ``wrap`` placing the bad value at ``path``:
    nested too deep, or a number too long to read. Every route with a JSON body gets these."""
    deep = b"[" * DEEP + b"]" * DEEP
    return [
        Hostile(f"nested {DEEP} deep", wrap(deep), "", "at most 64"),
        Hostile(f"a {LONG_DIGITS}-digit number", wrap(b"7" * LONG_DIGITS), path, "4301 digits"),
    ]


def validate_cases() -> list[Hostile]:
    """POST /v1/validate bodies: each hostile request beside a valid plan (the path gains
    ``request.``), a plan too wide for the service, and an unreadable schema version."""
    req_doc, plan_doc = valid_pair()
    plan_bytes = json.dumps(plan_doc).encode()
    cases = [
        Hostile(
            case.name,
            b'{"plan": ' + plan_bytes + b', "request": ' + case.body + b"}",
            f"request.{case.path}",
            case.says,
        )
        for case in request_cases()
        if case.path.startswith(("tables", "topology.", "batch", "options", "constraints"))
        and "digit" not in case.name
    ]
    cases += body_cases(
        lambda value: (
            b'{"plan": '
            + plan_bytes
            + b', "request": {"topology": {"world_size": '
            + value
            + b"}}}"
        ),
        "request.topology.world_size",
    )
    long_version = {**plan_doc, "schema_version": "1." + "1" * LONG_DIGITS}
    wide_plan = {**plan_doc, "world_size": 100_000}
    huge = {
        "request": _with(("topology", "world_size"), 10**7),
        "plan": {**plan_doc, "world_size": 10**7},
    }
    cases += [
        Hostile(
            "schema_version of 4301 digits",
            json.dumps({"request": req_doc, "plan": long_version}).encode(),
            "plan.schema_version",
            "must be a string like",
        ),
        Hostile(
            "plan world_size over the service's limit",
            json.dumps({"request": req_doc, "plan": wide_plan}).encode(),
            "plan.world_size",
            "SHARDPLAN_MAX_WORLD_SIZE",
        ),
        Hostile(
            "request and plan world_size 10**7",
            json.dumps(huge).encode(),
            "plan.world_size",
            "131072",
        ),
    ]
    return cases


def alias_cases() -> list[Hostile]:
    """PUT /v1/aliases/{name} bodies: a comment with a NUL was PostgreSQL's 503 (item 5)."""
    comment = json.dumps({"plan_id": "0" * 64, "comment": "a\u0000b"}).encode()
    return [
        *body_cases(lambda value: b'{"plan_id": ' + value + b"}", "plan_id"),
        Hostile("comment with NUL", comment, "comment", "U+0000"),
    ]


def profile_cases() -> list[Hostile]:
    """PUT /v1/profiles/{profile_id} bodies."""
    return body_cases(lambda value: b'{"runtime": {"step_ms": ' + value + b"}}", "runtime.step_ms")


def valid_pair() -> tuple[dict[str, Any], dict[str, Any]]:
    """A request and a valid plan for it, as JSON data."""
    req = request([table("t0", rows=1000, dim=16)], world_size=2)
    plan = builders.plan(req, {"t0": builders.table_wise(req, "t0", 0)})
    return json.loads(req.model_dump_json()), json.loads(canonical_bytes(plan))


_FORGED_ID, _UNKNOWN_PREVIOUS = unknown_previous_import()
ROUTES = {
    "POST /v1/plans": request_cases,
    "POST /v1/check": request_cases,
    "POST /v1/validate": lambda: [*validate_cases(), _UNKNOWN_PREVIOUS],
    f"PUT /v1/plans/{'0' * 64}": validate_cases,
    f"PUT /v1/plans/{_FORGED_ID}": lambda: [_UNKNOWN_PREVIOUS],
    "PUT /v1/aliases/hostile": alias_cases,
    f"PUT /v1/profiles/{'0' * 64}": profile_cases,
}


def every_case() -> list[tuple[str, Hostile]]:
    return [(route, case) for route, cases in ROUTES.items() for case in cases()]


# --------------------------------------------------------------------------- the wire

BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
HALF_BODY = b"{"  # of the 1,000 bytes a half-sent request declares


def half_sent(port: int, route: str) -> None:
    """``route`` ("METHOD /path") with ``Content-Length: 1000``, one byte of its body, and
    the connection closed: a client that went away mid-body (issue 36's ``nc -q1``)."""
    method, path = route.split(" ")
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(head + HALF_BODY)
        time.sleep(0.2)  # the request reaches the route, waiting for the rest of its body


def oversized_heads(header_bytes: int, head_bytes: int) -> list[tuple[str, dict[str, str], str]]:
    """(name, headers, the variable its 431 must name) for a head over each limit: one
    header, a huge one (16 MiB was once served 200), and many headers each within the
    per-header limit."""
    value = header_bytes - len("x-big")
    many = head_bytes // (header_bytes // 2) + 1
    return [
        ("one header one byte over", {"x-big": "a" * (value + 1)}, "SHARDPLAN_MAX_HEADER_BYTES"),
        # Refused while it arrives, before it ends: by the whole head's limit.
        (
            "16 MiB Accept-Encoding",
            {"accept-encoding": "b" * 16 * 2**20},
            "SHARDPLAN_MAX_REQUEST_HEAD_BYTES",
        ),
        (
            "headers over the head",
            {f"x-{i}": "c" * (header_bytes // 2) for i in range(many)},
            "SHARDPLAN_MAX_REQUEST_HEAD_BYTES",
        ),
    ]
