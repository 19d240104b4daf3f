"""shardplan's clients: the ``shardplan`` command line (``clients.cli``). Imports no torch,
and needs the solver or the service stack only for the commands that run them."""
