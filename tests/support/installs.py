"""The distribution's own files, copied where a test installs them from: pip builds in the
folder it installs from (``build/``, ``*.egg-info``), which must not be this checkout."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What `pip install .` reads: the metadata and the three packages.
DISTRIBUTION = ("pyproject.toml", "README.md", "planner_service", "runtime", "clients")


def copy_distribution(destination: Path) -> Path:
    """The distribution's files under ``destination`` (made here), without caches."""
    destination.mkdir(parents=True)
    for name in DISTRIBUTION:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, destination / name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy(ROOT / name, destination / name)
    return destination
