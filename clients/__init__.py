"""shardplan's clients: the ``shardplan`` command line (and, with the service, the HTTP
client). Imports no torch."""
