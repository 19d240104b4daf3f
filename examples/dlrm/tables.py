"""The example's embedding tables and its planning request (no torch needed).

One table per sparse feature of Criteo's Kaggle display-advertising data, named after the
feature (``cat_0`` ... ``cat_25``), with the cardinalities DLRM uses for it
(``criteo_kaggle.csv``), scaled by ``scale``: ``num_embeddings = max(1, ceil(cardinality *
scale))``. The request lists them in the file's order; the model builds its collection from
this same list, so the tables the service plans are exactly the tables the job shards.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

CARDINALITIES = Path(__file__).with_name("criteo_kaggle.csv")
NUM_DENSE = 13  # Criteo's integer features
Features = Literal["pooled", "sequence"]


@dataclass(frozen=True)
class TableSpec:
    """What the example sets for every table (the request's fields)."""

    features: Features = "pooled"
    scale: float = 0.01
    embedding_dim: int = 16
    optimizer: str = "sgd"
    max_ids: int = 3  # sequence features: each sample has 0..max_ids ids


def cardinalities(path: Path = CARDINALITIES) -> list[tuple[str, int]]:
    """(feature, cardinality) in file order."""
    with path.open(newline="") as file:
        return [(row["feature"], int(row["num_embeddings"])) for row in csv.DictReader(file)]


def scaled_rows(cardinality: int, scale: float) -> int:
    return max(1, math.ceil(cardinality * scale))


def tables(spec: TableSpec) -> list[dict[str, Any]]:
    """The request's tables: pooled (sum, one id per sample, as Criteo's one-hot features)
    or sequence (pooling ``none``, 0..max_ids ids per sample, max_ids / 2 on average)."""
    pooled = spec.features == "pooled"
    return [
        {
            "name": feature,
            "num_embeddings": scaled_rows(cardinality, spec.scale),
            "embedding_dim": spec.embedding_dim,
            "pooling": "sum" if pooled else "none",
            "pooling_factors": [1.0 if pooled else spec.max_ids / 2],
            "optimizer": spec.optimizer,
        }
        for feature, cardinality in cardinalities()
    ]


def planning_request(spec: TableSpec, *, world_size: int, batch_size: int) -> dict[str, Any]:
    """The planning request for a job of ``world_size`` CPU ranks, ``batch_size`` samples
    per rank."""
    return {
        "topology": {"world_size": world_size, "compute_device": "cpu"},
        "batch_size": batch_size,
        "tables": tables(spec),
    }
