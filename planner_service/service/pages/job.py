"""An async solve's page (GET /v1/solves/{job_id}/view): its status and progress, with no
scripts."""

from __future__ import annotations

from html import escape

from planner_service.plan.api import SolveJob
from planner_service.service.pages.style import BASE_STYLE

JOB_REFRESH_S = 2  # a job's page reloads itself this often while the job runs


def render_job_page(job: SolveJob) -> str:
    """An async solve's page (GET /v1/solves/{job_id}/view): its status and progress,
    reloaded every ``JOB_REFRESH_S`` by the browser while it runs (no scripts), and sent
    on to the plan's page once it is done."""
    refresh = ""
    if job.plan_id is not None:
        refresh = f'<meta http-equiv="refresh" content="0; url=/v1/plans/{job.plan_id}/view">'
    elif not job.status.ended:
        refresh = f'<meta http-equiv="refresh" content="{JOB_REFRESH_S}">'

    def number(value: float | None, unit: str) -> str:
        return "" if value is None else f"{value:.6g}{unit}"

    rows = [
        ("status", job.status.value),
        ("stage", job.stage or ""),
        ("objective", number(job.objective, " ms")),
        ("lower bound", number(job.lower_bound, " ms")),
        ("gap", "" if job.gap is None else f"{job.gap:.2%}"),
        ("elapsed", number(job.elapsed_s, " s")),
        ("time limit", number(job.time_limit_s, " s")),
        ("attempts", str(job.attempts)),
    ]
    table = "".join(f"<tr><th>{name}</th><td>{escape(value)}</td></tr>" for name, value in rows)
    outcome = ""
    if job.plan_id is not None:
        outcome = f'<p><a href="/v1/plans/{job.plan_id}/view">the plan</a></p>'
    elif job.problem is not None:
        title = escape(str(job.problem.get("title", "")))
        outcome = f"<h2>{title}</h2><pre>{escape(str(job.problem.get('detail', '')))}</pre>"
    return (
        f'<!doctype html><html><head><meta charset="utf-8">{refresh}'
        f"<title>solve {job.job_id[:12]}</title><style>{BASE_STYLE}</style></head><body>"
        f"<h1>Solve <code>{job.job_id}</code></h1>"
        f'<p class="note">request {job.request_hash}, {escape(job.planner_version)}</p>'
        f"<table>{table}</table>{outcome}</body></html>"
    )
