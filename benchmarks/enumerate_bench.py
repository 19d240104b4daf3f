"""How long enumerating and estimating every option takes on the public workloads.

    .venv/bin/python -m benchmarks.enumerate_bench [--repeat 5]

Prints one row per (model, world size): tables, options, shards, best wall time.
"""

from __future__ import annotations

import argparse
import random
import time

from benchmarks.workloads import NVIDIA_MODELS, criteo_tables, nvidia_tables, workload_request
from planner_service.costs.enumerate import enumerate_options, fit_options


def distinct_tables(count: int, seed: int = 0) -> list[dict[str, object]]:
    """The worst case for shape caching: every table a different shape."""
    rng = random.Random(seed)
    return [
        {
            "name": f"t{i}",
            "num_embeddings": rng.randint(1_000, 100_000_000),
            "embedding_dim": rng.choice([32, 64, 128, 256, 512]),
            "pooling_factors": [round(rng.uniform(1, 50), 3)],
        }
        for i in range(count)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print("| workload | ranks | tables | options | shards | enumerate+estimate s | +fit s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    workloads = [(model, nvidia_tables(model)) for model in NVIDIA_MODELS]
    workloads.append(("criteo", criteo_tables()))
    workloads.append(("2,000 distinct shapes", distinct_tables(2000)))
    for name, tables in workloads:
        for world in (8, 32, 128):
            request = workload_request(tables, world)
            best_enum, best_fit = float("inf"), float("inf")
            for _ in range(args.repeat):
                start = time.perf_counter()
                options = enumerate_options(request)
                middle = time.perf_counter()
                fit_options(request, options)
                end = time.perf_counter()
                best_enum = min(best_enum, middle - start)
                best_fit = min(best_fit, end - start)
            num_options = sum(len(t.options) for t in options)
            num_shards = sum(len(o.shards) for t in options for o in t.options)
            print(
                f"| {name} | {world} | {len(tables)} | {num_options} | {num_shards} | "
                f"{best_enum:.3f} | {best_fit:.3f} |"
            )


if __name__ == "__main__":
    main()
