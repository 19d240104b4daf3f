"""When this ``shardplan`` process's command started: the clock ``options.time_limit_s``
counts on for ``shardplan plan``. ``clients/cli/__init__.py`` imports this module before
any command module or library, so the limit counts everything the user waits for after
the interpreter's own start: imports (OR-Tools alone is about 0.5 s), reading the
request, the solve, writing the plan (docs/cli.md, "Time limits")."""

from __future__ import annotations

import time

STARTED_AT = time.monotonic()
