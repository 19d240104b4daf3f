"""The planner's HTTP API (FastAPI), installed with ``shardplan[service]``.

``app.create_app`` assembles it; routes live in ``routes/<resource>.py`` and reach the
process's state through the dependencies in ``deps.py``; ``planning.py`` solves (and
stores) a request in the solve pool (``solving.py``); ``settings.py`` reads the
environment. Nothing outside this package imports it except ``shardplan serve``.
"""
