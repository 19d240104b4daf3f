"""JSON data at the edge: what ``json.loads`` returns and ``json.dumps`` takes, before a
model has validated it or after a model has dumped it (``model_dump(mode="json")``).

Inside the code, documents are models; these aliases mark the few places that handle
the raw data on purpose: decoding before validation, content addresses computed from
the data a plan was read from, and plans of many shards assembled as data and validated
once. The values inside an object are whatever the JSON holds, so they stay ``Any``.
"""

from __future__ import annotations

from typing import Any, TypeAlias

JsonObject: TypeAlias = dict[str, Any]
JsonValue: TypeAlias = JsonObject | list[Any] | str | int | float | bool | None
