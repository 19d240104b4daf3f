"""Train a DLRM-style click model with its embedding tables sharded by a plan from the
shardplan service (see README.md next to this file, and docs/training.md).

    python examples/dlrm/train.py --print-request --world-size 2 > dlrm-request.json
    torchrun --nproc_per_node 2 examples/dlrm/train.py --plan alias:dlrm-example \\
        --server http://127.0.0.1:8000
    python examples/dlrm/train.py --reference --world-size 2    # unsharded, one process
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from tables import TableSpec, planning_request

OPTIMIZERS = ("sgd", "rowwise_adagrad", "adagrad", "adam")
# Learning rates at which the default configuration's loss falls steadily in 100 steps.
DEFAULT_LR = {"sgd": 0.3, "rowwise_adagrad": 0.01, "adagrad": 0.01, "adam": 0.01}


def positive(kind: type[int] | type[float]) -> Callable[[str], float | int]:
    def parse(text: str) -> float | int:
        try:
            value = kind(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number above 0")
        return value

    return parse


def widths(text: str) -> list[int]:
    """``"128,64"``: hidden layer widths; ``""``: none."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give integer widths, e.g. 128,64") from None
    if any(value <= 0 for value in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every width must be above 0")
    return values


EPILOG = """\
The plan: --plan alias:NAME or a plan id (64 hex digits) is fetched from the planner
service, --server or $SHARDPLAN_SERVER (its token: $SHARDPLAN_TOKEN); anything else is a
plan file. Every rank loads the same verified plan, or every rank stops with the reason.

Exit codes: 0 trained (or printed the request, or ran the reference); 1 a rank could not
start (no plan, a plan for other tables or another world size) or failed; 2 bad
arguments (no --plan, or a plan to fetch but no service named)."""

SERVER_ENV = "SHARDPLAN_SERVER"
PLAN_ID_DIGITS = 64


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="DLRM on synthetic Criteo-shaped clicks, tables sharded by a shardplan plan.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = p.add_argument_group("what to do (default: train, one process per rank)")
    mode.add_argument(
        "--print-request",
        action="store_true",
        help="print the planning request for this configuration and --world-size, and exit",
    )
    mode.add_argument(
        "--reference",
        action="store_true",
        help="run the job's steps in one process without sharding, for --world-size ranks",
    )
    mode.add_argument(
        "--world-size",
        type=positive(int),
        default=2,
        help="ranks the request and the reference are for (the job takes torchrun's; default: 2)",
    )
    plan = p.add_argument_group("the plan")
    plan.add_argument(
        "--plan",
        metavar="SOURCE",
        help="alias:NAME, a plan id or a plan file (required to train)",
    )
    plan.add_argument(
        "--server",
        metavar="URL",
        help=f"the planner service to fetch the plan from (default: ${SERVER_ENV})",
    )
    plan.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="keep fetched plans here; a restart while the service is down uses them",
    )
    plan.add_argument(
        "--deadline-s",
        type=positive(float),
        default=120.0,
        metavar="S",
        help="the longest any rank waits for the plan or for its peers (default: 120)",
    )
    model = p.add_argument_group("model and data (--print-request needs the job's)")
    model.add_argument(
        "--features",
        choices=("pooled", "sequence"),
        default="pooled",
        help="pooled: one id per sample per feature, summed; sequence: 0..--max-ids ids, "
        "averaged (default: pooled)",
    )
    model.add_argument(
        "--scale",
        type=positive(float),
        default=0.01,
        help="rows of each table: max(1, ceil(Criteo Kaggle cardinality * scale)) (default: 0.01)",
    )
    model.add_argument(
        "--embedding-dim",
        type=positive(int),
        default=16,
        metavar="N",
        help="every table's embedding dimension (default: 16)",
    )
    model.add_argument(
        "--max-ids",
        type=positive(int),
        default=3,
        metavar="N",
        help="sequence features: 0..N ids per sample (default: 3)",
    )
    model.add_argument(
        "--bottom-mlp",
        type=widths,
        default=[64],
        metavar="W,W,...",
        help="hidden widths of the dense features' MLP (default: 64)",
    )
    model.add_argument(
        "--top-mlp",
        type=widths,
        default=[128, 64],
        metavar="W,W,...",
        help="hidden widths of the MLP over the interactions (default: 128,64)",
    )
    training = p.add_argument_group("training")
    training.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        default="sgd",
        help="the tables' fused optimizer; the dense part takes torch's SGD, Adagrad "
        "(for both adagrads) or Adam (default: sgd)",
    )
    training.add_argument(
        "--lr",
        type=positive(float),
        help="learning rate of the tables and the dense part (default: "
        + ", ".join(f"{name} {lr:g}" for name, lr in DEFAULT_LR.items())
        + ")",
    )
    training.add_argument(
        "--batch-size", type=positive(int), default=256, help="samples per rank (default: 256)"
    )
    training.add_argument(
        "--steps", type=positive(int), default=100, help="training steps (default: 100)"
    )
    training.add_argument(
        "--seed", type=int, default=0, help="seeds the model, the teacher and the data (default: 0)"
    )
    training.add_argument(
        "--metrics-out",
        type=Path,
        metavar="DIR",
        help="write each rank's results (losses, examples/s) to DIR/rank{r}.json",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.lr is None:
        args.lr = DEFAULT_LR[args.optimizer]
    spec = TableSpec(args.features, args.scale, args.embedding_dim, args.optimizer, args.max_ids)
    if args.print_request:
        request = planning_request(spec, world_size=args.world_size, batch_size=args.batch_size)
        print(json.dumps(request, indent=2))
        return 0
    if args.reference and args.optimizer != "sgd":
        p.error(f"--reference runs --optimizer sgd only (got {args.optimizer!r})")
    if not args.reference and not args.plan:
        p.error("--plan is required to train: alias:NAME, a plan id or a plan file")
    if not args.reference and _fetched(args.plan):
        args.server = args.server or os.environ.get(SERVER_ENV, "").strip()
        if not args.server:
            return _no_server(args.plan)
    import job  # torch and FBGEMM: training needs them, printing a request does not

    return job.reference(args) if args.reference else job.run(args)


def _fetched(source: str) -> bool:
    """Whether ``--plan`` names a plan on the service (as ``runtime.load_plan`` reads it)."""
    is_id = len(source) == PLAN_ID_DIGITS and all(c in "0123456789abcdef" for c in source)
    return is_id or source.startswith("alias:")


def _no_server(source: str) -> int:
    """Exit 2 before any rank starts, with one line (from one rank per host under
    torchrun, whose every worker runs this): the plan is fetched, but from where?"""
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print(
            f"train.py: --plan {source} is fetched from the planner service: pass "
            f"--server URL or set ${SERVER_ENV}",
            file=sys.stderr,
        )
    return 2


if __name__ == "__main__":
    sys.exit(main())
