"""The ``shardplan`` command's exit codes (the package docstring says when each is used)."""

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_DIFFERENT = 1  # diff(1)'s convention: the inputs differ
EXIT_BAD_INPUT = 2
EXIT_NO_PLAN = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
