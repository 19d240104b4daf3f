"""The OpenAPI document's pieces that FastAPI cannot derive: schemas for bodies the routes
decode themselves, and ``JsonObject``, the type of such JSON fragments.

Routes read raw bodies (to refuse duplicate JSON keys and to name every bad field in our
own words), so FastAPI cannot derive their schemas. ``schema_ref(Model)`` registers the
model and its nested models under ``components.schemas`` and returns a ``$ref`` to it;
``document_raw_bodies`` puts them into the generated document. Referencing ``$defs``
inside an inline schema would leave dangling references, which is what this avoids.
"""

from __future__ import annotations

from typing import Any, TypeAlias

from fastapi import FastAPI
from pydantic import BaseModel

from planner_service.plan.types import PlanRequest, ShardingPlan

JsonObject: TypeAlias = dict[str, Any]
"""A JSON object at the HTTP edge whose shape a specification sets, not a model of ours:
an OpenAPI fragment (OpenAPI's), a problem+json document (RFC 9457's, with extensions), a
body not yet parsed. Results inside the service are models."""

REF_TEMPLATE = "#/components/schemas/{model}"
_COMPONENTS: dict[str, JsonObject] = {}
# The example body of POST /v1/plans and POST /v1/check.
REQUEST_EXAMPLE: JsonObject = {
    "topology": {"world_size": 2, "hbm_bytes": 16 * 2**30},
    "tables": [
        {"name": "user_id", "num_embeddings": 1_000_000, "embedding_dim": 128},
        {"name": "item_id", "num_embeddings": 200_000, "embedding_dim": 64},
    ],
    "options": {"time_limit_s": 2.0},
}


class RequestAndPlan(BaseModel):
    """Body of POST /v1/validate and PUT /v1/plans/{plan_id}."""

    request: PlanRequest
    plan: ShardingPlan


def schema_ref(model: type[BaseModel]) -> dict[str, str]:
    schema = model.model_json_schema(ref_template=REF_TEMPLATE)
    _COMPONENTS.update(schema.pop("$defs", {}))
    _COMPONENTS[model.__name__] = schema
    return {"$ref": REF_TEMPLATE.format(model=model.__name__)}


def json_body(model: type[BaseModel], example: JsonObject | None = None) -> JsonObject:
    """``openapi_extra`` for a route whose JSON body is ``model``."""
    content: JsonObject = {"schema": schema_ref(model)}
    if example is not None:
        content["example"] = example
    return {"requestBody": {"required": True, "content": {"application/json": content}}}


def document_raw_bodies(app: FastAPI) -> None:
    """Adds the registered schemas to the app's OpenAPI document when it is generated."""
    generate = app.openapi

    def openapi() -> JsonObject:
        if app.openapi_schema is None:
            app.openapi_schema = _add_components(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _add_components(document: JsonObject) -> JsonObject:
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in _COMPONENTS.items():
        schemas.setdefault(name, schema)
    return document
