"""The planner's HTTP API (FastAPI), installed with ``shardplan[service]``. Nothing outside
this package imports it except ``shardplan serve`` (``app.create_served_app``).

The layout, from the edge in:

- ``app.py``: assembles the app (state, routers, error handlers, middleware) and puts the
  plan-fetch fast path in front of it (``create_served_app``, uvicorn's factory).
- ``routes/<resource>.py``: thin handlers, one router per resource (``plans``, ``solves``,
  ``aliases``, ``check``, ``validate``, ``health``): parse, call one function, render. A
  route module never imports another (``tests/project/test_imports.py``); what two share lives in
  the module that owns it.
- ``deps.py``: every dependency a route declares, as ``Annotated`` aliases (state, jobs,
  the caller's identity, path parameters, ``Prefer: respond-async``).
- ``settings.py``: ``Settings``, the one settings class (SHARDPLAN_* variables).
- ``state.py``: a worker process's state (settings, store, solve pool, plan cache, CPU
  lane) and its life (the app's lifespan).
- ``solver/``: solving requests off the event loop.
    - ``pool.py``: the solve pool: solver processes, admission, watchdog, progress
      (``SolveStage``), outcomes (``SolveOutcome``) and the 503 errors.
    - ``run.py``: solving one request in the pool for a route (stored, or only checked)
      and the problems a solve answers with (503 unavailable, 422 no plan).
    - ``jobs.py``: asynchronous solves: jobs with their statuses (``SolveJobStatus``),
      progress, leases and resumption across processes.
- ``http/``: HTTP mechanics that know nothing of solving.
    - ``problems.py``: RFC 9457 problem+json errors and the app's exception handlers.
    - ``responses.py``: plan and job responses, caching and content negotiation.
    - ``openapi.py``: OpenAPI schemas of bodies the routes decode themselves, and
      ``JsonObject``, the type of JSON fragments at the edge.
    - ``limits.py``: body size and request-size limits (413, 422).
    - ``heads.py``: request-head limits (431), in the HTTP protocol ``shardplan serve``
      runs.
    - ``paging.py``: ``limit``/``after`` query parameters and opaque cursors.
    - ``metrics.py``: Prometheus metrics and the request-counting middleware.
    - ``fetch.py``: a plan's prepared responses and the fast path that serves cached plans.
- ``plan_ids.py``: plan ids in paths and bodies, whole or a unique prefix, resolved against
  the store (404 none, 409 several, 422 malformed).
- ``importing.py``: PUT /v1/plans/{plan_id}: a plan solved elsewhere, checked and stored.
- ``pages.py``: the HTML pages for people (a plan, a job).
- ``cpu.py``: the CPU lane: processes for CPU-bound work other than solving (validation,
  pages).
- ``store.py``: the plan store (plans, aliases, the job table; SQLite or PostgreSQL).
"""
