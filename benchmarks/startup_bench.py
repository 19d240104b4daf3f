"""How long ``shardplan`` commands take from exec to exit, and which imports cost the most.

    .venv/bin/python -m benchmarks.startup_bench [--runs 10] [--top 5]

Runs each command ``--runs`` times through the installed console script (the interpreter
next to this one's), on examples/, and prints the median and fastest wall time and the
median CPU time (user + system, which other work on the machine hardly changes);
then, for each command, the top-level packages whose imports took longest, from one run
under ``python -X importtime`` (self times summed per package). ``python -c pass`` is the
floor: the interpreter's own start. ``fetch`` reads the example plan from a cache folder
made for the run (a plan id held there is not asked for), so it needs no service: its row
is the start-up and the plan's verification (no client is opened for a cached id).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
REQUEST, PLAN = str(EXAMPLES / "request.json"), str(EXAMPLES / "plan.json")
COMMANDS: list[tuple[str, list[str]]] = [
    ("--version", ["--version"]),
    ("--help", ["--help"]),
    ("diff", ["diff", PLAN, PLAN]),
    ("validate", ["validate", REQUEST, PLAN]),
    ("schema", ["schema"]),
    ("fetch (cached)", ["fetch", "<plan_id>", "--server", "http://127.0.0.1:1", "--cache-dir"]),
    ("options", ["options", REQUEST]),
    ("plan (solves)", ["plan", REQUEST]),
]


# Out of the source tree: ``python -c`` puts the working directory first on sys.path, and
# the code measured must be the installed one (or $PYTHONPATH's), not whatever is here.
NEUTRAL = tempfile.gettempdir()


def timings(argv: list[str], runs: int) -> tuple[list[float], list[float]]:
    """Wall and CPU (user + system) seconds of each run. CPU time hardly moves when other
    work shares the machine; wall time does."""
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=NEUTRAL, check=False
        )
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return walls, cpus


def import_offenders(args: list[str], top: int) -> list[tuple[str, float]]:
    """Self import time per top-level package (ms), largest first, from one run."""
    script = f"from clients.cli import main\ntry:\n    main({args!r})\nexcept SystemExit:\n    pass"
    with tempfile.TemporaryFile("w+") as out:
        subprocess.run(
            [sys.executable, "-X", "importtime", "-c", script],
            stdout=subprocess.DEVNULL,
            stderr=out,
            cwd=NEUTRAL,
            check=False,
        )
        out.seek(0)
        lines = out.read().splitlines()
    per_package: Counter[str] = Counter()
    for line in lines:
        if not line.startswith("import time:") or "|" not in line or "self [us]" in line:
            continue
        self_us, _, name = (part.strip() for part in line.removeprefix("import time:").split("|"))
        per_package[name.partition(".")[0]] += int(self_us) / 1000
    return per_package.most_common(top)


def with_cache(command: list[str], cache_dir: Path) -> list[str]:
    """``fetch``'s arguments, with the example plan filed in ``cache_dir`` under its id."""
    if command[0] != "fetch":
        return command
    from planner_service.plan.codec import parse_plan, plan_bytes

    plan = parse_plan(Path(PLAN).read_bytes())
    (cache_dir / "plans").mkdir(exist_ok=True)
    (cache_dir / "plans" / f"{plan.plan_id}.json").write_bytes(plan_bytes(plan))
    return [plan.plan_id if part == "<plan_id>" else part for part in command] + [str(cache_dir)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--top", type=int, default=5)
    args = parser.parse_args()
    exe = str(Path(sys.executable).parent / "shardplan")
    walls, cpus = timings([sys.executable, "-c", "pass"], args.runs)
    print(
        f"interpreter start (python -c pass): median {statistics.median(walls) * 1000:.0f} ms "
        f"wall, {statistics.median(cpus) * 1000:.0f} ms CPU\n"
    )
    print("| command | median ms | fastest ms | median CPU ms | largest imports (self ms) |")
    print("| --- | ---: | ---: | ---: | --- |")
    cache_dir = Path(tempfile.mkdtemp(prefix="startup-bench-"))
    for label, template in COMMANDS:
        command = with_cache(template, cache_dir)
        walls, cpus = timings([exe, *command], args.runs)
        offenders = ", ".join(
            f"{name} {ms:.0f}" for name, ms in import_offenders(command, args.top)
        )
        print(
            f"| `shardplan {label}` | {statistics.median(walls) * 1000:.0f} | "
            f"{min(walls) * 1000:.0f} | {statistics.median(cpus) * 1000:.0f} | {offenders} |"
        )


if __name__ == "__main__":
    main()
