"""Examples per second of the example training job (examples/dlrm/), launched with torchrun.

    .venv/bin/python -m benchmarks.dlrm_job_bench [--runs 3] [--steps 100]

For each configuration, plans the request the example prints (``shardplan plan``, into a
file: ``load_plan`` reads files as it reads the service's plans), then runs
``torchrun --standalone --nproc-per-node 2 examples/dlrm/train.py`` ``--runs`` times,
configurations interleaved, ``OMP_NUM_THREADS=1``, and prints the median, lowest and
highest of rank 0's examples/s (all ranks' samples, from the second step on).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "dlrm" / "train.py"
BIN = Path(sys.executable).parent
# (features, scale, batch size per rank)
CONFIGS = [("pooled", 0.01, 256), ("sequence", 0.01, 256), ("pooled", 0.001, 32)]


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def _options(features: str, scale: float, batch: int) -> list[str]:
    return ["--features", features, "--scale", str(scale), "--batch-size", str(batch)]


def plan_file(directory: Path, options: list[str]) -> Path:
    request, plan = directory / "request.json", directory / "plan.json"
    printed = subprocess.run(
        [sys.executable, str(EXAMPLE), "--print-request", "--world-size", "2", *options],
        check=True, capture_output=True, text=True, env=_env(),
    )  # fmt: skip
    request.write_text(printed.stdout)
    subprocess.run(
        [str(BIN / "shardplan"), "plan", str(request), "--output", str(plan)],
        check=True, capture_output=True, env=_env(),
    )  # fmt: skip
    return plan


def examples_per_s(plan: Path, options: list[str], steps: int, out: Path) -> float:
    subprocess.run(
        [
            str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", str(EXAMPLE),
            "--plan", str(plan), "--steps", str(steps), "--metrics-out", str(out), *options,
        ],
        check=True, capture_output=True, env=_env(), timeout=600,
    )  # fmt: skip
    return float(json.loads((out / "rank0.json").read_text())["examples_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        plans = {}
        for i, config in enumerate(CONFIGS):
            directory = Path(scratch) / f"config{i}"
            directory.mkdir()
            plans[config] = plan_file(directory, _options(*config))
        rates: dict[tuple, list[float]] = {config: [] for config in CONFIGS}
        for run in range(args.runs):
            for config in CONFIGS:
                out = Path(scratch) / f"run{run}-{config[0]}-{config[1]}-{config[2]}"
                rates[config].append(
                    examples_per_s(plans[config], _options(*config), args.steps, out)
                )
    print("| features | scale | batch per rank | examples/s median | lowest | highest |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for (features, scale, batch), values in rates.items():
        print(
            f"| {features} | {scale:g} | {batch} | {statistics.median(values):,.0f} | "
            f"{min(values):,.0f} | {max(values):,.0f} |"
        )


if __name__ == "__main__":
    main()
