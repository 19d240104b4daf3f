"""OpenAPI schemas for bodies the routes decode themselves.

Routes read raw bodies (to refuse duplicate JSON keys and to name every bad field in our
own words), so FastAPI cannot derive their schemas. ``schema_ref(Model)`` registers the
model and its nested models under ``components.schemas`` and returns a ``$ref`` to it;
``add_components`` puts them into the generated document. Referencing ``$defs`` inside an
inline schema would leave dangling references, which is what this avoids.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

REF_TEMPLATE = "#/components/schemas/{model}"
_COMPONENTS: dict[str, dict[str, Any]] = {}


def schema_ref(model: type[BaseModel]) -> dict[str, str]:
    schema = model.model_json_schema(ref_template=REF_TEMPLATE)
    _COMPONENTS.update(schema.pop("$defs", {}))
    _COMPONENTS[model.__name__] = schema
    return {"$ref": REF_TEMPLATE.format(model=model.__name__)}


def json_body(model: type[BaseModel], example: Any = None) -> dict[str, Any]:
    """``openapi_extra`` for a route whose JSON body is ``model``."""
    content: dict[str, Any] = {"schema": schema_ref(model)}
    if example is not None:
        content["example"] = example
    return {"requestBody": {"required": True, "content": {"application/json": content}}}


def add_components(document: dict[str, Any]) -> dict[str, Any]:
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in _COMPONENTS.items():
        schemas.setdefault(name, schema)
    return document
