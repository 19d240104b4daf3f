"""``shardplan calibrate``: measure this machine (FBGEMM's kernels, the runtime's
collectives at the world sizes it can run, the runtime's own work) within ``--budget-s``
and write the device profile the ``calibrated`` cost model reads (docs/cost-model.md,
"Calibrating for your hardware"). Needs the runtime install (``shardplan[runtime]``).

Exit 0: the profile is written (to ``-o`` or stdout); 2: bad input, refused before anything
is spawned (a budget outside [10, 3600] s, a world size the machine cannot run, an output
path that cannot be written), or the runtime extra is missing; 1: a stage failed (a rank
that raised, died or hung; measurements too few to fit), named on stderr.
"""

from __future__ import annotations

import argparse
import json
import time

from clients.cli.exits import EXIT_BAD_INPUT, EXIT_OK, CommandFailed
from clients.cli.extras import needs_extra
from clients.cli.output import add_output_argument, emit
from clients.cli.progress import StageProgress

EXIT_FAILED = 1
DEFAULT_BUDGET_S = 180.0
DEVICES = ("cpu", "cuda")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "calibrate",
        help="measure this machine and write a device profile for cost_model 'calibrated'",
        description=__doc__,
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=DEFAULT_BUDGET_S,
        help="seconds the whole calibration may take, ranks included, in [10, 3600] (default: 180)",
    )
    parser.add_argument("--device", choices=DEVICES, default="cpu", help="default: cpu")
    parser.add_argument(
        "--world-sizes",
        metavar="N,N,...",
        help="world sizes to time the collectives at (default: cpu 2, and 4 on 4 or more "
        "cores; cuda every GPU, none with one)",
    )
    parser.add_argument("--name", help="the profile's name (default: HOSTNAME-DEVICE)")
    add_output_argument(parser, "the profile")
    parser.add_argument("--seed", type=int, default=0, help="orders the grids (default: 0)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads per rank (default: 1)"
    )
    parser.set_defaults(command=run)


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()  # the budget counts importing torch and FBGEMM too
    if not 10.0 <= args.budget_s <= 3600.0:  # NaN fails this too
        raise CommandFailed(
            f"shardplan calibrate: --budget-s {args.budget_s:g} is outside [10, 3600] seconds",
            EXIT_BAD_INPUT,
        )
    worlds = _world_sizes(args.world_sizes)
    emit(_profile_json(args, worlds, started), args.output)
    return EXIT_OK


def _profile_json(args: argparse.Namespace, worlds: tuple[int, ...] | None, started: float) -> str:
    """The profile (pretty, keys sorted, for people), or a one-line failure: exit 2 for
    settings the machine cannot run (before anything is spawned), 1 for a failed stage."""
    with needs_extra("calibrate", "runtime"):
        from runtime.calibrate.fit import DegenerateFitError
        from runtime.calibrate.profile import (
            CalibrateRefused,
            CalibrateSettings,
            calibrate,
            check_settings,
            default_world_sizes,
        )
        from runtime.calibrate.ranks import RankFailedError
        from runtime.calibrate.timing import Budget
    from planner_service.plan.types import ComputeDevice

    device = ComputeDevice(args.device)
    settings = CalibrateSettings(
        budget_s=args.budget_s,
        device=device,
        world_sizes=worlds if worlds is not None else default_world_sizes(device),
        name=args.name or f"{_hostname()}-{device.value}",
        seed=args.seed,
        threads=args.threads,
    )
    try:
        check_settings(settings)
    except CalibrateRefused as error:
        raise CommandFailed(f"shardplan calibrate: {error}", EXIT_BAD_INPUT) from None
    with StageProgress("calibrating") as progress:
        try:
            profile = calibrate(settings, progress.update, Budget(args.budget_s, started=started))
        except (RankFailedError, DegenerateFitError) as error:
            raise CommandFailed(f"shardplan calibrate: {error}", EXIT_FAILED) from None
    return json.dumps(profile.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


def _world_sizes(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    from clients.cli.numbers import parse_count, parse_list

    return tuple(parse_list(text, "--world-sizes", parse_count))


def _hostname() -> str:
    import socket

    return socket.gethostname().split(".")[0] or "machine"
