"""Commands whose libraries come with an extra (``shardplan plan`` needs OR-Tools,
``shardplan serve`` the service stack) import them inside the command, so that the other
commands work on a core or runtime install, and say which extra to install instead of
showing a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

# A missing module of these is a broken install or a bug, not a missing extra.
OWN_PACKAGES = frozenset({"planner_service", "runtime", "clients"})


class MissingExtraError(Exception):
    """A command's libraries are not installed; the message is one line naming the extra."""


@contextmanager
def needs_extra(command: str, extra: str) -> Iterator[None]:
    """Imports inside this block come with ``shardplan[extra]``."""
    try:
        yield
    except ModuleNotFoundError as error:
        if (error.name or "").partition(".")[0] in OWN_PACKAGES:
            raise
        raise MissingExtraError(
            f"shardplan {command}: this install lacks the {extra!r} extra (no module named "
            f"{error.name!r}): install shardplan with it, e.g. pip install './[{extra}]' in a "
            "checkout (docs/getting-started.md)"
        ) from None
