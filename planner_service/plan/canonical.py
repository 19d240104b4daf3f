"""Canonical JSON and content addresses: the one byte form of a document that is hashed,
stored and served, and the sha256 that names a plan by its content.

Canonical JSON is ``json.dumps`` of the model's JSON-mode dump with sorted keys, no
whitespace, UTF-8, no NaN/inf and ``-0.0`` written as ``0.0``. Python writes every float
as the shortest text that reads back to the same double, so the same value always gives
the same bytes, and the same bytes always give the same value. A plan's ``plan_id`` is the
sha256 of its canonical JSON with every field except ``plan_id`` itself.

The vocabulary (``types.PlanOptions`` checks an inline previous plan's id) and the codec
both use these, so they live apart from both and import neither.
"""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel

from planner_service.plan.json_data import JsonObject, JsonValue


def canonical_bytes(value: BaseModel | JsonValue) -> bytes:
    """Canonical JSON bytes of a model or of plain JSON data."""
    data = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
    text = _dumps(data)
    # ``-0.0`` is the only float written differently from its canonical form, and it can
    # only be in the text where it is a float or inside a string; so the document (a plan:
    # up to millions of shards) is walked to normalise floats only when the text has it.
    if "-0.0" in text:
        text = _dumps(_normalise_floats(data))
    return text.encode("utf-8")


def _dumps(data: JsonValue) -> str:
    return json.dumps(
        data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _normalise_floats(data: JsonValue) -> JsonValue:
    if isinstance(data, float):
        return 0.0 if data == 0.0 else data
    if isinstance(data, dict):
        return {key: _normalise_floats(value) for key, value in data.items()}
    if isinstance(data, list):
        return [_normalise_floats(value) for value in data]
    return data


def plan_id_of(body: JsonObject) -> str:
    """The content address of a plan body (its JSON data without ``plan_id``)."""
    return sha256_hex(canonical_bytes({k: v for k, v in body.items() if k != "plan_id"}))
