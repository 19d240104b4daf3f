"""Tables from a CSV file: ``shardplan plan REQUEST --tables tables.csv`` and friends.

The first line is a header naming the columns, in any order: ``name``, ``num_embeddings``,
``embedding_dim`` and ``pooling_factor`` are required; ``feature_names`` (``;``-separated),
``data_type`` and ``optimizer`` are optional, and an empty cell in them means the request
format's default. ``pooling_factor`` is one number for every feature of the table, or one
per feature, ``;``-separated. Each later line is a table, as the request format's
``tables[]`` entry it becomes (docs/requests.md, "Tables from CSV"); blank lines are
skipped. Every problem names the file, the line and the column, with the value and what
is accepted, and all of them are reported at once.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from planner_service.plan.errors import FieldProblem, InputError, problems_from_validation_error
from planner_service.plan.types import Table

REQUIRED = ("name", "num_embeddings", "embedding_dim", "pooling_factor")
OPTIONAL = ("feature_names", "data_type", "optimizer")
COLUMNS = REQUIRED + OPTIONAL
LIST_SEPARATOR = ";"
# The request field each column fills, where its name differs.
_FIELDS = {"pooling_factor": "pooling_factors"}
_COLUMN_OF_FIELD = {field: column for column, field in _FIELDS.items()}
_INTEGER = re.compile(r"[0-9]{1,15}")  # more digits than any table has rows are refused


def tables_from_csv(data: bytes, source: str) -> list[dict[str, Any]]:
    """The ``tables`` of a request, as JSON data, from the CSV text ``data``."""
    try:
        text = data.decode("utf-8-sig")  # a spreadsheet's byte-order mark is no column name
    except UnicodeDecodeError as error:
        raise InputError(source, [FieldProblem("", f"not UTF-8 text: {error}")]) from None
    rows = _rows(text, source)
    header = _header(next(rows, None), source)
    tables: list[dict[str, Any]] = []
    problems: list[FieldProblem] = []
    lines: list[int] = []
    for line, cells in rows:
        table, found = _table(line, header, cells)
        problems += found
        if table is not None:
            tables.append(table)
            lines.append(line)
    problems += _repeated(tables, lines)
    if problems:
        raise InputError(source, problems)
    if not tables:
        raise InputError(source, [FieldProblem("", "has a header but no tables")])
    return tables


def _rows(text: str, source: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, stripped cells) of every non-blank line."""
    reader = csv.reader(text.splitlines(), strict=True)
    try:
        for cells in reader:
            if any(cell.strip() for cell in cells):
                yield reader.line_num, [cell.strip() for cell in cells]
    except csv.Error as error:
        problem = FieldProblem(f"line {reader.line_num}", f"not valid CSV: {error}")
        raise InputError(source, [problem]) from None


def _header(first: tuple[int, list[str]] | None, source: str) -> list[str]:
    if first is None:
        raise InputError(source, [FieldProblem("", f"is empty; the header is {','.join(COLUMNS)}")])
    line, header = first
    problems = [
        FieldProblem(
            f"line {line}, column {index + 1}",
            f"unknown column; columns: {', '.join(COLUMNS)}",
            name,
        )
        for index, name in enumerate(header)
        if name not in COLUMNS
    ]
    repeated = sorted({name for name in header if header.count(name) > 1})
    problems += [FieldProblem(f"line {line}", "names a column twice", name) for name in repeated]
    missing = [name for name in REQUIRED if name not in header]
    if missing:
        problems.append(
            FieldProblem(
                f"line {line}",
                f"the header lacks {', '.join(missing)}; it needs {', '.join(REQUIRED)} and "
                f"may have {', '.join(OPTIONAL)}",
            )
        )
    if problems:
        raise InputError(source, problems)
    return header


def _table(
    line: int, header: list[str], cells: list[str]
) -> tuple[dict[str, Any] | None, list[FieldProblem]]:
    """The table of one line, or None and why not."""
    if len(cells) != len(header):
        return None, [
            FieldProblem(
                f"line {line}",
                f"has {len(cells)} cells, but the header names {len(header)} columns",
            )
        ]
    row = dict(zip(header, cells, strict=True))
    table: dict[str, Any] = {"name": row["name"]}
    problems: list[FieldProblem] = []
    for column in ("num_embeddings", "embedding_dim"):
        if _INTEGER.fullmatch(row[column]):
            table[column] = int(row[column])
        else:
            problems.append(_problem(line, column, "must be a whole number (digits only)", row))
    if row.get("feature_names"):
        table["feature_names"] = row["feature_names"].split(LIST_SEPARATOR)
    factors = _numbers(row["pooling_factor"])
    if factors is None:
        problems.append(
            _problem(
                line, "pooling_factor", "must be a number, or one per feature ;-separated", row
            )
        )
    else:
        features = len(table.get("feature_names", [row["name"]]))
        table["pooling_factors"] = factors * features if len(factors) == 1 else factors
    table.update({column: row[column] for column in ("data_type", "optimizer") if row.get(column)})
    if problems:
        return None, problems
    try:
        Table.model_validate(table)
    except ValidationError as error:
        return None, [
            _located(line, problem, row) for problem in problems_from_validation_error(error, Table)
        ]
    return table, []


def _numbers(cell: str) -> list[float] | None:
    try:
        return [float(part) for part in cell.split(LIST_SEPARATOR)]
    except ValueError:
        return None


def _problem(line: int, column: str, message: str, row: dict[str, str]) -> FieldProblem:
    return FieldProblem(f"line {line}, column {column}", message, row[column])


def _located(line: int, problem: FieldProblem, row: dict[str, str]) -> FieldProblem:
    """A problem the request format found in a table, placed at its line and column, with
    the cell as written."""
    field = re.split(r"[.\[]", problem.path, maxsplit=1)[0]
    column = _COLUMN_OF_FIELD.get(field, field)
    if column not in row:
        return FieldProblem(f"line {line}", problem.message, problem.value)
    return FieldProblem(f"line {line}, column {column}", problem.message, row[column])


def _repeated(tables: list[dict[str, Any]], lines: list[int]) -> list[FieldProblem]:
    """A table name or a feature on two lines (the request format refuses both)."""
    problems: list[FieldProblem] = []
    first_table: dict[str, int] = {}
    first_feature: dict[str, int] = {}
    for table, line in zip(tables, lines, strict=True):
        name = table["name"]
        if name in first_table:
            message = f"is the name of the table on line {first_table[name]} too; names are unique"
            problems.append(FieldProblem(f"line {line}, column name", message, name))
        first_table.setdefault(name, line)
        for feature in table.get("feature_names", [name]):
            if feature in first_feature:
                message = (
                    f"feature {feature!r} already looks up the table on line "
                    f"{first_feature[feature]}; each feature looks up one table"
                )
                problems.append(
                    FieldProblem(f"line {line}, column feature_names", message, feature)
                )
            first_feature.setdefault(feature, line)
    return problems
