"""User-facing input errors: every problem names the field (as a JSON path), the value and
what would be accepted. Shared by the CLI (exit code 2) and the service (HTTP 422)."""

from __future__ import annotations

import math
import types
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails


class _NoValue(Enum):
    """No value to show (a missing field); an enum, so it stays itself across pickling."""

    NO_VALUE = "no value"


_NO_VALUE = _NoValue.NO_VALUE
_MAX_VALUE_CHARS = 80


@dataclass(frozen=True)
class FieldProblem:
    """One thing wrong with an input: where (JSON path), what was given, and why."""

    path: str
    message: str
    value: Any = _NO_VALUE

    def as_dict(self) -> dict[str, str]:
        """JSON-safe form for API responses; the value is shown as text, as in ``render``."""
        result = {"path": self.path, "message": self.message}
        if self.value is not _NO_VALUE:
            result["value"] = _short_repr(self.value)
        return result

    def render(self) -> str:
        where = self.path or "(document)"
        if self.value is _NO_VALUE:
            return f"{where}: {self.message}"
        return f"{where} = {_short_repr(self.value)}: {self.message}"


class InputError(ValueError):
    """An input document that cannot be used, with every problem found in it."""

    def __init__(self, source: str, problems: list[FieldProblem]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(self.render())

    def __reduce__(self) -> tuple[type[InputError], tuple[str, list[FieldProblem]]]:
        """Pickled as its source and problems (it is raised in worker processes too)."""
        return type(self), (self.source, self.problems)

    def render(self) -> str:
        lines = [f"{self.source}: {problem.render()}" for problem in self.problems]
        return "\n".join(lines)


class _Shown:
    """A value shown by a summary (a list too long to quote): its repr is the summary."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def json_path(loc: tuple[int | str, ...]) -> str:
    """``('tables', 0, 'name')`` -> ``tables[0].name``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def problems_from_validation_error(
    error: ValidationError, model: type[BaseModel]
) -> list[FieldProblem]:
    """Turn pydantic's errors into FieldProblems with paths and accepted values."""
    problems = []
    for item in error.errors(include_url=False):
        loc = _without_union_tags(tuple(item["loc"]))
        message = _message(item, model, loc)
        value = item.get("input", _NO_VALUE)
        if item["type"] == "too_long":
            value = _Shown(f"[{len(value)} items]")
        elif item["type"] in {"missing", "json_invalid"} or isinstance(value, dict | list):
            value = _NO_VALUE
        path = json_path(loc)
        context = item.get("ctx") or {}
        if "field_path" in context:  # a model's own check names the field below it
            path = _below(path, str(context["field_path"]))
            value = context.get("field_value", _NO_VALUE)
        problems.append(FieldProblem(path, message, value))
    return problems


# The tags of a plan table's two forms (``types.TableSharding``): pydantic puts the tag of
# the form it validated in an error's location, after ``tables`` and the table's name; a
# user's document has no such level, so paths leave it out.
SHARD_LIST_TAG = "shard list"
RUNS_TAG = "shard runs"
_UNION_TAGS = frozenset({SHARD_LIST_TAG, RUNS_TAG})


def _without_union_tags(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    return tuple(
        part
        for i, part in enumerate(loc)
        if not (part in _UNION_TAGS and i >= 2 and loc[i - 2] == "tables")
    )


def _below(path: str, relative: str) -> str:
    if not path or not relative or relative.startswith("["):
        return path + relative
    return f"{path}.{relative}"


def _message(item: ErrorDetails, model: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    kind = item["type"]
    if kind == "extra_forbidden":
        parent = _model_at(model, loc[:-1])
        accepted = ", ".join(parent.model_fields) if parent else "see `shardplan schema`"
        return f"unknown field; accepted fields here: {accepted}"
    if kind == "missing":
        return "required field is missing"
    message = str(item["msg"])
    return message.removeprefix("Value error, ")


def _model_at(root: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model class found by walking ``loc`` from ``root`` through field annotations."""
    current: Any = root
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = field.annotation
        else:
            args = typing.get_args(current)
            if not args:
                return None
            current = args[-1]  # list[X] -> X, dict[K, V] -> V
    current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """Strip ``Annotated`` and ``X | None`` down to the interesting type."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                return annotation
            annotation = members[0]
        else:
            return annotation


def _short_repr(value: Any) -> str:
    if isinstance(value, int) and value.bit_length() > _LONG_INT_BITS:
        return _long_int_repr(value)
    text = repr(value)
    if len(text) > _MAX_VALUE_CHARS:
        return text[: _MAX_VALUE_CHARS - 3] + "..."
    return text


_LONG_INT_BITS = 256  # about 77 digits: the most that fits the shortened value anyway


def _long_int_repr(value: int) -> str:
    """Leading digits and the length of an integer, without converting all of it to text
    (which is quadratic in its length and refused past 4,300 digits)."""
    digits = math.floor((value.bit_length() - 1) * math.log10(2)) + 1
    shift = max(0, digits - 12)
    leading = abs(value) // 10**shift
    if len(str(leading)) > 12:  # the estimate was one digit short
        digits, leading = digits + 1, leading // 10
    sign = "-" if value < 0 else ""
    return f"{sign}{leading}... ({digits} digits)"
