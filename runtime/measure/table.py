"""A ``MeasureReport`` as the table ``shardplan measure`` prints: per rank a measured row
(the step's median and 90th percentile, then its interquartile mean by part) and the plan's
predicted row, then the job's step beside the plan's largest
predicted total."""

from __future__ import annotations

from runtime.measure.report import TIMED_PARTS, MeasureReport, Part, RankMeasurement

COLUMNS = ("rank", "", "median", "p90", "step", *(part.value for part in Part), "error")
NONE = "-"


def milliseconds(value: float | None) -> str:
    """Three significant digits below 10 ms (the predicted parts are often microseconds),
    two decimals up to 1000 ms, whole milliseconds beyond."""
    if value is None:
        return NONE
    if abs(value) < 10:
        return f"{value:#.3g}"
    return f"{value:.2f}" if abs(value) < 1000 else f"{value:.0f}"


def percent(value: float | None) -> str:
    return NONE if value is None else f"{value:+.1%}"


def rank_rows(rank: RankMeasurement) -> list[list[str]]:
    """The measured row and the predicted row of one rank."""
    iqm = rank.iqm
    measured = [str(rank.rank), "measured", milliseconds(rank.step_median_ms)]
    measured += [milliseconds(rank.step_p90_ms), milliseconds(iqm.step_ms)]
    measured += [milliseconds(iqm.part_ms(part)) for part in Part] + [""]
    predicted = rank.predicted
    if predicted is None:
        return [measured, ["", "predicted", *[NONE] * (len(COLUMNS) - 2)]]
    row = ["", "predicted", NONE, NONE, milliseconds(predicted.total_ms)]
    row += [milliseconds(predicted.part_ms(part)) if part in TIMED_PARTS else NONE for part in Part]
    return [measured, [*row, percent(rank.relative_error)]]


def aligned(rows: list[list[str]]) -> list[str]:
    """Text left-aligned in the first two columns, numbers right-aligned after them."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.ljust(width) if i < 2 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def render_table(report: MeasureReport) -> str:
    settings, machine = report.settings, report.machine
    threads = f", {settings.threads} thread(s) per rank" if settings.device.value == "cpu" else ""
    head = [
        f"plan {report.plan_id[:12]} on {report.world_size} rank(s): {settings.device.value}, "
        f"{report.backend.value}{threads}; {settings.steps} steps after {settings.warmup} "
        f"warm-up, seed {settings.seed}",
        f"host {machine.hostname} ({machine.cpu_count} cpus, {machine.device_name}), torch "
        f"{machine.torch_version}, fbgemm_gpu {machine.fbgemm_version}",
    ]
    if report.side_by_side_with:
        others = len(report.side_by_side_with)
        head.append(f"side by side with {others} other plan(s), a step of each in turn")
    head.append("")
    rows = [list(COLUMNS)] + [row for rank in report.ranks for row in rank_rows(rank)]
    tail = [
        "",
        f"job step {milliseconds(report.job_step_ms)} ms (rank {report.slowest_rank}, the "
        f"slowest rank's median); predicted {milliseconds(report.predicted_job_ms)} ms "
        f"(error {percent(report.relative_error)})",
        "milliseconds; step and its parts: the mean of the middle half of the steps (by step "
        "time);",
        "predicted: the plan's rank_stats perf (step: its total); error: predicted step vs "
        "the median step",
    ]
    return "\n".join(head + aligned(rows) + tail) + "\n"


def render_side_by_side(reports: list[MeasureReport], names: list[str]) -> str:
    """Plans measured side by side, fastest first: each one's job step, its ratio to the
    fastest, and its predicted step."""
    fastest = min(report.job_step_ms for report in reports)
    rows = [["plan", "file", "job step", "× fastest", "predicted"]]
    ranked = sorted(zip(reports, names, strict=True), key=lambda pair: pair[0].job_step_ms)
    for report, name in ranked:
        rows.append(
            [
                report.plan_id[:12],
                name,
                milliseconds(report.job_step_ms),
                f"{report.job_step_ms / fastest:.3f}" if fastest > 0 else NONE,
                milliseconds(report.predicted_job_ms),
            ]
        )
    head = f"side by side: {len(reports)} plans, a step of each in turn, fastest first"
    return "\n".join([head, "", *aligned(rows), "", "milliseconds"]) + "\n"
