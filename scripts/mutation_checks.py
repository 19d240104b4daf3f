"""Deliberate bugs, one or two per package, each of which the tests of that package must
catch: the suite's teeth, checked after changes to the tests themselves.

    .venv/bin/python scripts/mutation_checks.py            # every mutation
    .venv/bin/python scripts/mutation_checks.py plan solve  # some packages

Each mutation replaces one exact piece of source text (it fails loudly if the text is not
there any more, so the list stays true to the code), runs the named tests with ``-x``,
restores the file, and reports whether the tests failed (caught) or passed (survived).
Exits 1 if any mutation survives. docs/testing.md lists the results.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    package: str
    says: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTATIONS = (
    Mutation(
        "plan",
        "canonical bytes no longer sort their keys",
        "planner_service/plan/canonical.py",
        "sort_keys=True",
        "sort_keys=False",
        ("tests/plan",),
    ),
    Mutation(
        "costs",
        "the dense kernel priced at the fused kernel's bandwidth",
        "planner_service/costs/estimate.py",
        "return DENSE_BANDWIDTH_FACTOR * ddr if kernel is ComputeKernel.DENSE else ddr",
        "return ddr",
        ("tests/costs",),
    ),
    Mutation(
        "solve",
        "the CP-SAT model forgets every rank's memory capacity",
        "planner_service/solve/cpsat/model.py",
        "self.model.add(_weighted(terms) <= int(cap))",
        "pass",
        ("tests/solve",),
    ),
    Mutation(
        "validate",
        "the validator lets a rank exceed its memory by up to 1 TiB",
        "planner_service/validate/validator.py",
        "if used > usable:",
        "if used > usable + 2**40:",
        ("tests/validate",),
    ),
    Mutation(
        "check",
        "headroom reports a rank's whole HBM as free",
        "planner_service/check/headroom.py",
        "hbm_free_bytes=capacity.hbm_bytes - stats.hbm_bytes,",
        "hbm_free_bytes=capacity.hbm_bytes,",
        ("tests/check",),
    ),
    Mutation(
        "service",
        "an alias's second change keeps version 1",
        "planner_service/service/store/aliases.py",
        "int(row[1]) + 1",
        "int(row[1])",
        ("tests/service/test_store.py",),
    ),
    Mutation(
        "runtime",
        "the sharded module forgets to divide mean-pooled bags by their length",
        "runtime/sharding/outputs.py",
        "out = out / torch.where(mean, bags.clamp(min=1), 1).to(out.dtype)",
        "out = out",
        ("tests/runtime/test_distributed.py",),
    ),
    Mutation(
        "clients",
        "the client accepts a plan whose content does not hash to its id",
        "clients/http/integrity.py",
        "if computed != plan.plan_id:",
        "if False:",
        ("tests/clients/test_http_client.py",),
    ),
    Mutation(
        "service",
        "a body that declares its size over the limit is read anyway",
        "planner_service/service/http/limits.py",
        "if declared > self.max_bytes:",
        "if declared > 2 * self.max_bytes:",
        ("tests/service/test_api.py",),
    ),
    Mutation(
        "runtime",
        "row-wise ids all look up the first row of their block",
        "runtime/sharding/inputs.py",
        "return bucketed[0].to(torch.int64), bucketed[1], bucketed[2], positions",
        "return bucketed[0].to(torch.int64), bucketed[1] * 0, bucketed[2], positions",
        ("tests/runtime/test_distributed.py",),
    ),
    Mutation(
        "clients",
        "`shardplan plan` exits 0 when no plan exists",
        "clients/cli/exits.py",
        "EXIT_NO_PLAN = 3",
        "EXIT_NO_PLAN = 0",
        ("tests/clients/cli",),
    ),
)


def run(mutation: Mutation) -> tuple[bool, float]:
    path = ROOT / mutation.path
    original = path.read_text()
    if original.count(mutation.old) != 1:
        raise SystemExit(f"{mutation.path}: {mutation.old!r} is not there exactly once")
    path.write_text(original.replace(mutation.old, mutation.new))
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
             "-m", "not postgres", *mutation.tests],
            cwd=ROOT, capture_output=True, text=True, check=False,
        )  # fmt: skip
    finally:
        path.write_text(original)
    return done.returncode != 0, time.monotonic() - started


def main() -> None:
    chosen = set(sys.argv[1:])
    survived = 0
    print("| package | deliberate bug | tests | result |")
    print("| --- | --- | --- | --- |")
    for mutation in MUTATIONS:
        if chosen and mutation.package not in chosen:
            continue
        caught, seconds = run(mutation)
        survived += not caught
        verdict = f"caught in {seconds:.0f} s" if caught else "**survived**"
        tests = ", ".join(f"`{test}`" for test in mutation.tests)
        print(f"| {mutation.package} | {mutation.says} | {tests} | {verdict} |", flush=True)
    sys.exit(1 if survived else 0)


if __name__ == "__main__":
    main()
