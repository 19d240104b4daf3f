"""``shardplan profile put FILE`` and ``shardplan profile get PROFILE_ID``: device profiles
(``shardplan calibrate``'s) on the planner service, so that plan requests can name one by
``options.device_profile_id`` instead of carrying it.

``put`` checks the file first (every bad number, an unknown schema version, a kernel the
device lacks: exit 2 naming the field, nothing sent), stores it at its content address
(``PUT /v1/profiles/{profile_id}``; storing it again changes nothing) and prints its id.
``get`` writes the stored profile, its content address computed again, as its canonical
JSON (stdout adds a newline; ``-o`` writes the file whole or not at all).

Exit 0: done; 2: bad input (an invalid profile file, not a profile id, no such profile on
the service, a token missing or refused); 4: the service unreachable, overloaded or failing
after the retries; 5: the profile received is not what its id addresses (nothing written).
Needs the core install only.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from clients.cli.exits import EXIT_OK
from clients.cli.output import add_output_argument
from clients.cli.remote import add_server_arguments, connected, missing_is_bad_input

if TYPE_CHECKING:
    from clients.http import PlannerClient
    from planner_service.plan.types import DeviceProfile


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "profile",
        help="store a device profile on the service, or get one, by its content address",
        description=__doc__,
    )
    actions = parser.add_subparsers(required=True, metavar="ACTION")
    put = actions.add_parser(
        "put", help="store a profile file; prints its profile_id", description=__doc__
    )
    put.add_argument("file", type=Path, metavar="FILE", help="a device profile (JSON; - is stdin)")
    add_server_arguments(put, server_help="the planner service, e.g. http://planner:8000")
    put.set_defaults(command=run_put)
    get = actions.add_parser("get", help="write a stored profile, verified", description=__doc__)
    get.add_argument("profile_id", metavar="PROFILE_ID", help="a profile id (64 hex digits)")
    add_output_argument(get, "the profile")
    add_server_arguments(get, server_help="the planner service, e.g. http://planner:8000")
    get.set_defaults(command=run_get)


def run_put(args: argparse.Namespace) -> int:
    from clients.cli.files import read_profile

    profile = read_profile(args.file)
    with connected(args, "profile put", document="profile") as client:
        profile_id = client.put_profile(profile)
    print(profile_id)
    return EXIT_OK


def run_get(args: argparse.Namespace) -> int:
    from clients.cli.files import check_content_address

    check_content_address(
        args.profile_id,
        command="shardplan profile get",
        argument="PROFILE_ID",
        accepted="a device profile's id (64 lowercase hex digits)",
    )
    with connected(args, "profile get", document="profile") as client:
        profile = _profile(client, args.profile_id)
    _write(profile, args.output)
    return EXIT_OK


def _profile(client: PlannerClient, profile_id: str) -> DeviceProfile:
    message = f"shardplan profile get: no profile {profile_id} on {client.base_url}"
    with missing_is_bad_input(message):
        return client.get_profile(profile_id)


def _write(profile: DeviceProfile, output: Path | None) -> None:
    from clients.cli.output import emit_canonical
    from planner_service.plan.canonical import canonical_bytes

    emit_canonical(canonical_bytes(profile), output)  # the bytes the service stores, hashed
