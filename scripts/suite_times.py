"""The suite's time per test folder, from pytest's JUnit XML, as the markdown table in
docs/testing.md.

    .venv/bin/python -m pytest --junitxml=var/suite.xml
    .venv/bin/python scripts/suite_times.py var/suite.xml

A test's time is its setup, call and teardown (a module's server starts in the setup of
its first test); the folders add up to the suite's time less collection and start-up.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path


def folder_of(classname: str) -> str:
    """``tests.service.test_api`` (or ``tests.service.test_api.TestX``) -> ``tests/service``."""
    parts = classname.split(".")
    modules = [i for i, part in enumerate(parts) if part.startswith("test_")]
    return "/".join(parts[: modules[0]] if modules else parts[:-1])


def main() -> None:
    seconds: Counter[str] = Counter()
    tests: Counter[str] = Counter()
    for case in ET.parse(Path(sys.argv[1])).iter("testcase"):
        folder = folder_of(case.get("classname", ""))
        seconds[folder] += float(case.get("time", "0"))
        tests[folder] += 1
    print("| folder | tests | seconds |")
    print("| --- | ---: | ---: |")
    for folder in sorted(seconds):
        print(f"| `{folder}` | {tests[folder]} | {seconds[folder]:.0f} |")
    print(f"| all | {sum(tests.values())} | {sum(seconds.values()):.0f} |")


if __name__ == "__main__":
    main()
