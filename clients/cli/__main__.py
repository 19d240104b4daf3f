"""``python -m clients.cli``: the ``shardplan`` command without its console script."""

import sys

from clients.cli import main

if __name__ == "__main__":
    sys.exit(main())
