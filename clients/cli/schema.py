"""``shardplan schema``: the JSON Schemas of requests and plans."""

from __future__ import annotations

import argparse
import json

from clients.cli.exits import EXIT_OK

MODELS = {"request": "PlanRequest", "plan": "ShardingPlan"}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("schema", help="print the JSON Schemas of requests and plans")
    parser.add_argument("--model", choices=sorted(MODELS), help="print only this one")
    parser.set_defaults(command=run)


def run(args: argparse.Namespace) -> int:
    from planner_service.plan import types

    names = [MODELS[args.model]] if args.model else sorted(MODELS.values())
    schemas = {name: getattr(types, name).model_json_schema() for name in names}
    print(json.dumps(schemas, indent=2, sort_keys=True))
    return EXIT_OK
