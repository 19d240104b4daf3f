"""Reading the commands' input files (``-`` is stdin) and writing their output files, with
failures as ``InputError``s that name the path, the option and what to change."""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path

from planner_service.plan.canonical import plan_id_of
from planner_service.plan.codec import parse_plan, parse_profile, parse_request
from planner_service.plan.errors import FieldProblem, InputError
from planner_service.plan.types import DeviceProfile, PlanRequest, ShardingPlan

STDIN = Path("-")


def source_name(path: Path) -> str:
    return "<stdin>" if path == STDIN else str(path)


def read_input(path: Path) -> bytes:
    try:
        return sys.stdin.buffer.read() if path == STDIN else path.read_bytes()
    except OSError as error:
        raise InputError(
            str(path), [FieldProblem("", f"cannot read file: {error.strerror}")]
        ) from None


def read_verified_plan(path: Path) -> ShardingPlan:
    """A plan whose content still has its ``plan_id``: an edited or truncated file is an
    InputError here, not a wrong answer later."""
    source = source_name(path)
    plan = parse_plan(read_input(path), source=source)
    content_id = plan_id_of(plan.model_dump(mode="json"))
    if content_id != plan.plan_id:
        message = (
            f"does not match the plan's content (sha256 {content_id}): the file was edited or "
            "damaged after the plan was made; make or fetch it again"
        )
        raise InputError(source, [FieldProblem("plan_id", message, plan.plan_id)])
    return plan


def read_profile(path: Path) -> DeviceProfile:
    """A device profile file (``shardplan calibrate``'s), checked: every bad number, an
    unknown schema version or a missing kernel is an InputError naming its field."""
    return parse_profile(read_input(path), source=source_name(path))


def read_plan_pair(
    old: Path, new: Path, request: Path | None, command: str
) -> tuple[ShardingPlan, ShardingPlan, PlanRequest | None]:
    """Two verified plans to compare (at most one from stdin), and the new plan's request
    when a path is given (``shardplan diff`` and ``shardplan migrate``)."""
    if old == new == STDIN:
        problem = FieldProblem("new", "only one of old and new can be - (stdin)", "-")
        raise InputError(command, [problem])
    plans = read_verified_plan(old), read_verified_plan(new)
    if request is None:
        return (*plans, None)
    return (*plans, parse_request(read_input(request), source=source_name(request)))


def check_writable(path: Path, option: str) -> None:
    """Fail as writing ``path`` would, but before a long solve rather than after it, and
    without leaving a file behind."""
    try:
        if path.exists():
            path.open("ab").close()
        else:
            tempfile.TemporaryFile(dir=path.parent).close()
    except OSError as error:
        raise cannot_write(path, option, error) from None


def write_atomically(path: Path, option: str, data: bytes) -> None:
    """``data`` at ``path`` whole or not at all (a temporary file renamed over it), so a
    reader never sees half a plan, with the permissions a plain write would give it (an
    existing file's, else the umask's); something that is not a regular file
    (``/dev/stdout``, a pipe) is written in place."""
    from clients.http.cache import write_atomically as replace

    try:
        if path.exists() and not path.is_file():
            path.write_bytes(data)
        else:
            replace(path, data, mode=_file_mode(path))
    except OSError as error:
        raise cannot_write(path, option, error) from None


def _file_mode(path: Path) -> int:
    """``path``'s permission bits, or those a new file gets (0o666 less the umask)."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def check_content_address(text: str, *, command: str, argument: str, accepted: str) -> None:
    """InputError naming ``argument`` unless ``text`` is 64 lowercase hex digits (a sha256
    content address); ``accepted`` says what the argument takes."""
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise InputError(command, [FieldProblem(argument, f"must be {accepted}", text)])


def cannot_write(path: Path, option: str, error: OSError) -> InputError:
    reason = f"{error.strerror} (choose another path)"
    if isinstance(error, FileNotFoundError | NotADirectoryError | FileExistsError):
        reason = f"{path.parent} is not a directory (create it, or choose another path)"
    return InputError(str(path), [FieldProblem(option, f"cannot write: {reason}")])
