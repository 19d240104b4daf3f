"""Request hashes, sealed plans, and safe decoding of requests and plans.

- ``request_hash``: sha256 of the canonical request (``plan.canonical``) after
  normalisation: memory capacities rounded to whole MiB (a few bytes of jitter in reported
  memory must not change it), tables sorted by name, rank overrides by rank, constraint
  groups sorted, and a previous plan or device profile given inline named by its id only
  (so a request that names them by id, for the service to fill in, hashes alike).
- ``seal_plan_data``: a plan assembled from its parts and stamped with its ``plan_id``
  (``canonical.plan_id_of``: sha256 of the canonical plan with every field except
  ``plan_id`` itself); ``plan_bytes``: the canonical bytes it is stored and served as.

Decoding never pickles, rejects duplicate JSON keys (which ``json`` would silently
collapse), and checks ``schema_version`` (``plan.schema_version``) before reading anything
else.
"""

from __future__ import annotations

import itertools
import json
import weakref
from collections.abc import Iterator
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from planner_service.plan.canonical import canonical_bytes, sha256_hex
from planner_service.plan.errors import (
    FieldProblem,
    InputError,
    json_path,
    problems_from_validation_error,
)
from planner_service.plan.json_data import JsonObject, JsonValue
from planner_service.plan.schema_version import (
    SCHEMA_VERSION,
    check_schema_version,
)
from planner_service.plan.types import (
    MAX_JSON_DEPTH,
    MAX_PLAN_BYTES,
    DeviceProfile,
    PlanRequest,
    ShardingPlan,
    rank_stats_columns,
)
from planner_service.plan.units import MiB

M = TypeVar("M", bound=BaseModel)


# --------------------------------------------------------------------------- requests

_CAPACITY_FIELDS = ("hbm_bytes", "ddr_bytes")


def request_hash(request: PlanRequest) -> str:
    """Identity of a request: equal for requests that must get the same plan."""
    return sha256_hex(canonical_bytes(normalised_request(request)))


def normalised_request(request: PlanRequest) -> JsonObject:
    """The request as JSON data in the form that is hashed (see module docstring)."""
    data = request.model_dump(mode="json")
    topology = data["topology"]
    _round_capacities(topology)
    topology["rank_overrides"].sort(key=lambda override: override["rank"])
    for override in topology["rank_overrides"]:
        _round_capacities(override)
    constraints = data["constraints"]
    constraints["dense_bytes_per_rank"] = _round_to_mib(constraints["dense_bytes_per_rank"])
    for field in ("colocate", "separate"):
        constraints[field] = sorted(sorted(group) for group in constraints[field])
    data["tables"].sort(key=lambda table: table["name"])
    previous = data["options"].pop("previous_plan", None)
    if previous is not None:  # inline or from the store: the same plan, the same request
        data["options"]["previous_plan_id"] = previous["plan_id"]
    # Inline or from the store, the same profile: PlanOptions filled in its id.
    data["options"].pop("device_profile", None)
    return data


def _round_capacities(record: JsonObject) -> None:
    for field in _CAPACITY_FIELDS:
        if record.get(field) is not None:
            record[field] = _round_to_mib(record[field])


def _round_to_mib(num_bytes: int) -> int:
    return (num_bytes + MiB // 2) // MiB * MiB


# --------------------------------------------------------------------------- plans


def seal_plan_data(
    *,
    request: PlanRequest,
    planner_version: str,
    tables: dict[str, JsonObject],
    rank_stats: list[JsonObject],
    solver: JsonObject,
    migration: JsonObject | None = None,
) -> ShardingPlan:
    """Assemble a plan for ``request`` from its parts as JSON data and stamp it with its
    content address: a plan of many shards is validated once, at the end, instead of once
    per object and again when sealed. ``tables`` are runs (schema 2.0)."""
    return seal_plan_body(
        request_hash=request_hash(request),
        world_size=request.topology.world_size,
        planner_version=planner_version,
        tables=tables,
        rank_stats=rank_stats,
        solver=solver,
        migration=migration,
    )


def seal_plan_body(
    *,
    request_hash: str,
    world_size: int,
    planner_version: str,
    tables: dict[str, JsonObject],
    rank_stats: list[JsonObject],
    solver: JsonObject,
    migration: JsonObject | None = None,
    schema_version: str = SCHEMA_VERSION,
) -> ShardingPlan:
    """``seal_plan_data`` given the request's hash and world size, at ``schema_version``
    (a 1.x one takes tables as shard lists: ``plan.compact.expand_plan``'s).
    ``rank_stats``: one object per rank, written as columns from 2.0 on."""
    compact = not schema_version.startswith(("0.", "1."))
    body = {
        "schema_version": schema_version,
        "request_hash": request_hash,
        "planner_version": planner_version,
        "world_size": world_size,
        "tables": {name: tables[name] for name in sorted(tables)},
        "rank_stats": rank_stats_columns(rank_stats) if compact else rank_stats,
        "solver": solver,
    }
    if migration is not None:
        body["migration"] = migration
    hashed = canonical_bytes(body)
    plan_id = sha256_hex(hashed)
    if min(body) > "plan_id":
        # ``plan_id`` sorts first, so the sealed document is the hashed one with the id put
        # in front: one serialisation of a plan of many shards, not two.
        document = b'{"plan_id":"' + plan_id.encode() + b'",' + hashed[1:]
    else:  # a key sorts before it ("migration")
        document = canonical_bytes({**body, "plan_id": plan_id})
    plan = ShardingPlan.model_validate_json(document)
    remember_plan_bytes(plan, document)
    return plan


def remember_plan_bytes(plan: ShardingPlan, document: bytes) -> None:
    """Keep ``document``, the canonical bytes of ``plan`` (sealed here, or received and
    checked to be them), as what ``plan_bytes`` returns for it while it lives."""
    key = id(plan)
    _SEALED[key] = (weakref.ref(plan, lambda _: _SEALED.pop(key, None)), document)


# Plans sealed in this process, weakly, with their canonical bytes (dropped with the plan),
# so that storing or printing a plan just sealed does not serialise it again.
_SEALED: dict[int, tuple[weakref.ref[ShardingPlan], bytes]] = {}


def plan_bytes(plan: ShardingPlan) -> bytes:
    """The bytes a plan is stored and served as."""
    sealed = _SEALED.get(id(plan))
    if sealed is not None and sealed[0]() is plan:
        return sealed[1]
    return canonical_bytes(plan)


# --------------------------------------------------------------------------- decoding


def parse_request(data: bytes | str, *, source: str = "request") -> PlanRequest:
    """Decode and validate a PlanRequest, or raise InputError listing every problem."""
    load_json(data, source)
    return _validate(PlanRequest, data, source)


def parse_profile(data: bytes | str, *, source: str = "profile") -> DeviceProfile:
    """Decode and validate a DeviceProfile (``shardplan calibrate``'s), or raise InputError
    listing every problem: a NaN or infinite number, one negative or over its bound, an
    unknown schema version, a kernel missing for the device."""
    load_json(data, source)
    return _validate(DeviceProfile, data, source)


def parse_plan(data: bytes | str, *, source: str = "plan") -> ShardingPlan:
    """Decode a stored plan, refusing schema versions this code cannot read."""
    return parse_plan_document(data, source=source)[0]


def parse_plan_document(
    data: bytes | str, *, source: str = "plan"
) -> tuple[ShardingPlan, JsonObject]:
    """``parse_plan``, and the JSON data the plan was read from: what ``plan_id_of``
    hashes to check a received plan without serializing the model again."""
    document = load_json(data, source)
    if isinstance(document, dict):
        check_schema_version(document.get("schema_version"), source=source)
    plan = _validate(ShardingPlan, data, source)
    assert isinstance(document, dict)  # a ShardingPlan was read from it
    return plan, document


def load_json(data: bytes | str, source: str) -> JsonValue:
    """Decode JSON, refusing duplicate keys, nesting deeper than ``MAX_JSON_DEPTH`` and
    integers too long to convert; errors are InputErrors naming ``source``."""
    depth = json_depth(data)
    if depth > MAX_JSON_DEPTH:
        raise InputError(source, [_too_deep(depth)])
    try:
        return json.loads(data, object_pairs_hook=_reject_duplicate_keys)
    except _DuplicateKeyError as error:
        raise InputError(source, [FieldProblem("", str(error))]) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputError(source, [FieldProblem("", f"not valid JSON: {error}")]) from None
    except RecursionError:  # not expected after json_depth; never a 500 if it happens
        raise InputError(source, [_too_deep(depth)]) from None
    except ValueError:  # int() refused a number of more than 4,300 digits
        raise InputError(source, _long_numbers(data)) from None


def json_depth(data: bytes | str) -> int:
    """How deep arrays and objects nest in a JSON text, found without parsing it (so
    without recursion), in time linear in its length and in C loops but the last: escapes
    are dropped, everything but quotes and brackets is dropped, the parts between quote
    pairs (strings) are cut out, and the brackets left are counted (0.3 s for 27 MiB,
    less than json.loads takes)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    structure = unescaped.translate(None, _NOT_STRUCTURE)
    brackets = b"".join(structure.split(b'"')[::2])
    return max(itertools.accumulate(brackets, _nest, initial=0))


_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'"[]{}')))


def _nest(depth: int, bracket: int) -> int:
    return depth + 1 if bracket in _OPENING else depth - 1


_OPENING = frozenset(b"[{")


def _too_deep(depth: int) -> FieldProblem:
    return FieldProblem(
        "",
        f"arrays and objects nest {depth} deep; shardplan documents nest at most "
        f"{MAX_JSON_DEPTH} (MAX_JSON_DEPTH)",
        depth,
    )


class _DuplicateKeyError(ValueError):
    pass


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> JsonObject:
    result: JsonObject = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKeyError(f"key {key!r} appears twice in one JSON object")
        result[key] = value
    return result


def _long_numbers(data: bytes | str) -> list[FieldProblem]:
    """Where the integers too long for int() are: looked for only once json.loads refused."""
    try:
        document = json.loads(data, parse_int=_LongInteger.parse)
    except ValueError as error:
        return [FieldProblem("", f"not valid JSON: {error}")]
    problems = [
        FieldProblem(
            json_path(loc),
            f"an integer of {number.digits} digits is too long to read; no field accepts "
            f"more than {_MAX_FIELD_DIGITS} digits",
            number,
        )
        for loc, number in _long_integers(document, ())
    ]
    return problems or [FieldProblem("", "not valid JSON")]


_MAX_FIELD_DIGITS = len(str(MAX_PLAN_BYTES))
_MAX_PARSED_DIGITS = 4_300  # Python's default limit on int(str) (sys.get_int_max_str_digits)


class _LongInteger:
    """Stands in for an integer json.loads cannot convert, so its path can be reported."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.digits = len(text.lstrip("-"))

    @classmethod
    def parse(cls, text: str) -> int | _LongInteger:
        return int(text) if len(text) <= _MAX_PARSED_DIGITS else cls(text)

    def __repr__(self) -> str:
        return f"{self.text[:12]}... ({self.digits} digits)"


Loc = tuple[int | str, ...]


def _long_integers(node: object, loc: Loc) -> Iterator[tuple[Loc, _LongInteger]]:
    """Every stand-in in a decoded document (at most MAX_JSON_DEPTH deep), with its place."""
    if isinstance(node, _LongInteger):
        yield loc, node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _long_integers(value, (*loc, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _long_integers(value, (*loc, index))


def _validate(model: type[M], data: bytes | str, source: str) -> M:
    try:
        return model.model_validate_json(data)
    except ValidationError as error:
        raise InputError(source, problems_from_validation_error(error, model)) from None
