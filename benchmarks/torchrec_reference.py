#!/usr/bin/env python3
"""Reference harness: run TorchRec 1.8.0's own enumerator + default estimators.

Dev/benchmark only. TorchRec is never a dependency of shardplan; this script runs inside
the separate virtualenv created by ``benchmarks/torchrec_env.sh``::

    bash benchmarks/torchrec_env.sh
    .venv-torchrec/bin/python benchmarks/torchrec_reference.py cases.json > results.json

Input  ``{"cases": [{"id", "topology", "batch_size", "table", "sharding_type",
"compute_kernel", "cache_load_factor", "col_wise_shard_dim"}, ...]}``
(``-`` as the path reads stdin).

Output ``{"results": {id: {"shards": [{"sizes", "offsets", "perf", "storage"}]}
| {"error": msg}}}``; perf values are TorchRec's milliseconds, storage in bytes, shards
in TorchRec's order.

For each case a fresh meta-device module with one table is built
(EmbeddingBagCollection, or EmbeddingCollection for ``pooling: none``) and
``EmbeddingEnumerator(topology, batch_size, constraints)`` -- with TorchRec's default
perf and storage estimators, no fused params -- enumerates it under constraints that
admit exactly the requested sharding type and compute kernel.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
import warnings
from typing import Any

import torch
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.types import ParameterConstraints, Topology
from torchrec.distributed.types import CacheParams
from torchrec.modules.embedding_configs import (
    DataType,
    EmbeddingBagConfig,
    EmbeddingConfig,
    PoolingType,
)
from torchrec.modules.embedding_modules import (
    EmbeddingBagCollection,
    EmbeddingCollection,
)

SHARDING_TYPES = {
    "table_wise",
    "row_wise",
    "column_wise",
    "table_row_wise",
    "table_column_wise",
    "data_parallel",
}
COMPUTE_KERNELS = {"dense", "fused", "fused_uvm", "fused_uvm_caching"}
DATA_TYPES = {
    "fp32": DataType.FP32,
    "fp16": DataType.FP16,
    "bf16": DataType.BF16,
    "int8": DataType.INT8,
}
POOLINGS = {"sum": PoolingType.SUM, "mean": PoolingType.MEAN, "none": None}

META = torch.device("meta")
# Sharders are stateless here (no fused params); one of each is reused for all cases.
EBC_SHARDER = EmbeddingBagCollectionSharder()
EC_SHARDER = EmbeddingCollectionSharder()


class CaseError(ValueError):
    """A malformed case (reported as that case's error, never fatal)."""


def _require(obj: dict[str, Any], key: str, where: str) -> Any:
    if key not in obj or obj[key] is None:
        raise CaseError(f"{where}: missing '{key}'")
    return obj[key]


def build_topology(topo: dict[str, Any]) -> Topology:
    kwargs: dict[str, Any] = {
        "world_size": int(_require(topo, "world_size", "topology")),
        "compute_device": str(topo.get("compute_device") or "cuda"),
    }
    if topo.get("local_world_size") is not None:
        kwargs["local_world_size"] = int(topo["local_world_size"])
    if topo.get("hbm_bytes") is not None:
        kwargs["hbm_cap"] = int(topo["hbm_bytes"])
    if topo.get("ddr_bytes") is not None:
        kwargs["ddr_cap"] = int(topo["ddr_bytes"])
    # All bandwidths / multipliers stay at TorchRec's defaults.
    return Topology(**kwargs)


def build_module(table: dict[str, Any]) -> torch.nn.Module:
    name = str(_require(table, "name", "table"))
    num_embeddings = int(_require(table, "num_embeddings", "table"))
    embedding_dim = int(_require(table, "embedding_dim", "table"))
    feature_names = list(table.get("feature_names") or [name])
    pooling = str(table.get("pooling") or "sum").lower()
    if pooling not in POOLINGS:
        raise CaseError(f"unknown pooling {pooling!r} (sum|mean|none)")
    dt_name = str(table.get("data_type") or "fp32").lower()
    if dt_name not in DATA_TYPES:
        raise CaseError(f"unknown data_type {dt_name!r} (fp32|fp16|bf16|int8)")
    data_type = DATA_TYPES[dt_name]

    if pooling == "none":
        # Sequence table. EmbeddingCollection has no notion of weighted features, so
        # `is_weighted` is not forwarded (TorchRec would only see it via constraints).
        cfg = EmbeddingConfig(
            num_embeddings=num_embeddings,
            embedding_dim=embedding_dim,
            name=name,
            feature_names=feature_names,
            data_type=data_type,
        )
        return EmbeddingCollection(tables=[cfg], device=META)
    cfg = EmbeddingBagConfig(
        num_embeddings=num_embeddings,
        embedding_dim=embedding_dim,
        name=name,
        feature_names=feature_names,
        pooling=POOLINGS[pooling],
        data_type=data_type,
    )
    return EmbeddingBagCollection(
        tables=[cfg], is_weighted=bool(table.get("is_weighted", False)), device=META
    )


def build_constraints(case: dict[str, Any]) -> dict[str, ParameterConstraints]:
    table = case["table"]
    st = str(_require(case, "sharding_type", "case")).lower()
    ck = str(_require(case, "compute_kernel", "case")).lower()
    if st not in SHARDING_TYPES:
        raise CaseError(f"unknown sharding_type {st!r}")
    if ck not in COMPUTE_KERNELS:
        raise CaseError(f"unknown compute_kernel {ck!r}")
    feature_names = list(table.get("feature_names") or [table["name"]])
    pooling_factors = table.get("pooling_factors")
    if pooling_factors is None:
        pooling_factors = [1.0] * len(feature_names)
    pooling_factors = [float(x) for x in pooling_factors]
    if len(pooling_factors) != len(feature_names):
        raise CaseError(
            f"pooling_factors has {len(pooling_factors)} entries for {len(feature_names)} features"
        )
    clf = case.get("cache_load_factor")
    cwd = case.get("col_wise_shard_dim")
    pc = ParameterConstraints(
        sharding_types=[st],
        compute_kernels=[ck],
        pooling_factors=pooling_factors,
        min_partition=int(cwd) if cwd is not None else None,
        cache_params=CacheParams(load_factor=float(clf)) if clf is not None else None,
    )
    return {str(table["name"]): pc}


def _num(x: Any) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(case, dict):
        raise CaseError("case is not an object")
    table = _require(case, "table", "case")
    topology = build_topology(_require(case, "topology", "case"))
    batch_size = int(_require(case, "batch_size", "case"))
    module = build_module(table)
    constraints = build_constraints(case)
    sharder = EC_SHARDER if isinstance(module, EmbeddingCollection) else EBC_SHARDER
    enumerator = EmbeddingEnumerator(
        topology=topology, batch_size=batch_size, constraints=constraints
    )
    options = enumerator.enumerate(module, sharders=[sharder])  # type: ignore[list-item]
    if not options:
        raise RuntimeError("TorchRec enumerated no sharding option")
    if len(options) != 1:
        # Cannot happen with a single (sharding type, kernel) constraint; be loud if so.
        raise RuntimeError(
            f"TorchRec enumerated {len(options)} options: "
            + ", ".join(f"{o.sharding_type}/{o.compute_kernel}" for o in options)
        )
    return {"shards": shard_estimates(options[0])}


def shard_estimates(option: Any) -> list[dict[str, Any]]:
    """A TorchRec ShardingOption's shards: sizes, offsets, perf (ms) and storage (bytes)."""
    shards: list[dict[str, Any]] = []
    for shard in option.shards:
        perf = shard.perf
        storage = shard.storage
        if perf is None or storage is None:
            raise RuntimeError("TorchRec left a shard without perf/storage estimate")
        shards.append(
            {
                "sizes": [int(v) for v in shard.size],
                "offsets": [int(v) for v in shard.offset],
                "perf": {
                    "fwd_compute": _num(perf.fwd_compute),
                    "fwd_comms": _num(perf.fwd_comms),
                    "bwd_compute": _num(perf.bwd_compute),
                    "bwd_comms": _num(perf.bwd_comms),
                    "prefetch": _num(perf.prefetch_compute),
                    "input_dist": _num(perf.input_dist_comms),
                    "total": _num(perf.total),
                },
                "storage": {"hbm_bytes": int(storage.hbm), "ddr_bytes": int(storage.ddr)},
            }
        )
    return shards


def _error_text(exc: BaseException) -> str:
    msg = str(exc).strip()
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] in {"-h", "--help"}:
        print(
            "usage: python benchmarks/torchrec_reference.py cases.json > results.json",
            file=sys.stderr,
        )
        return 2
    if argv[1] == "-":
        doc = json.load(sys.stdin)
    else:
        with open(argv[1], encoding="utf-8") as fh:
            doc = json.load(fh)
    cases = doc.get("cases") if isinstance(doc, dict) else None
    if not isinstance(cases, list):
        print("input must be an object with a 'cases' list", file=sys.stderr)
        return 2

    # TorchRec logs "no available sharding types/kernels" warnings and emits
    # UserWarnings (e.g. column-wise dim not divisible); keep them off stdout and quiet.
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")

    results: dict[str, Any] = {}
    real_stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):  # anything printed must not corrupt JSON
        for i, case in enumerate(cases):
            cid = str(case.get("id", i)) if isinstance(case, dict) else str(i)
            try:
                results[cid] = run_case(case)
            except Exception as exc:  # noqa: BLE001 - reported per case
                msg = _error_text(exc)
                if isinstance(case, dict) and "No available sharding type" in msg:
                    pooling = (case.get("table") or {}).get("pooling")
                    msg = (
                        f"TorchRec refuses {case.get('sharding_type')}/"
                        f"{case.get('compute_kernel')} (pooling={pooling}, device="
                        f"{(case.get('topology') or {}).get('compute_device')}): {msg}"
                    )
                results[cid] = {"error": msg}
    json.dump({"results": results}, real_stdout, allow_nan=False)
    real_stdout.write("\n")
    real_stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
