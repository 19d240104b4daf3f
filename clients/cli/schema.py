"""``shardplan schema``: the JSON Schemas of requests and plans (one document, keyed by
the model's name: PlanRequest, ShardingPlan).

Exit 0: written; 2: bad input (an output path that cannot be written)."""

from __future__ import annotations

import argparse
import json

from clients.cli.exits import EXIT_OK
from clients.cli.output import add_output_argument, emit

MODELS = {"request": "PlanRequest", "plan": "ShardingPlan"}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "schema", help="print the JSON Schemas of requests and plans", description=__doc__
    )
    parser.add_argument("--model", choices=sorted(MODELS), help="print only this one")
    add_output_argument(parser, "the schemas")
    parser.set_defaults(command=run)


def run(args: argparse.Namespace) -> int:
    from planner_service.plan import types

    names = [MODELS[args.model]] if args.model else sorted(MODELS.values())
    schemas = {name: getattr(types, name).model_json_schema() for name in names}
    emit(json.dumps(schemas, indent=2, sort_keys=True) + "\n", args.output)
    return EXIT_OK
