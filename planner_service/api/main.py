"""Assembles the FastAPI application; routes live in ``routes/``."""

from __future__ import annotations

from fastapi import FastAPI

from planner_service import __version__
from planner_service.api.routes import health, validate


def create_app() -> FastAPI:
    app = FastAPI(
        title="shardplan planner",
        version=__version__,
        description="Plans embedding-table sharding for DLRM-style models and serves the plans.",
    )
    app.include_router(health.router)
    app.include_router(validate.router)
    return app
