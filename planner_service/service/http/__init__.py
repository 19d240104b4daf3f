"""HTTP mechanics shared by the routes, none of which solve: problems, responses, OpenAPI
schemas, limits, paging, metrics and the plan-fetch fast path. See the package map in
``planner_service/service/__init__.py``."""
