"""The ``shardplan`` command's exit codes (the package docstring says when each is used)."""

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_DIFFERENT = 1  # diff(1)'s convention: the inputs differ
EXIT_BAD_INPUT = 2
EXIT_NO_PLAN = 3
EXIT_UNAVAILABLE = 4  # the service: no answer after the retries, or it failed
EXIT_INTEGRITY = 5  # a plan whose content is not what its id addresses
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


class CommandFailed(Exception):
    """A command ends with this one-line message on stderr and this exit code (no
    traceback): what went wrong, named, and what to do about it."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code
