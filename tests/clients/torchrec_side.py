"""The TorchRec side of tests/clients/test_torchrec.py. It runs in ``.venv-torchrec``
(TorchRec 1.8.0 on torch 2.13.0 CPU, made by benchmarks/torchrec_env.sh), never in the
product's environment, where TorchRec is not installed::

    PYTHONPATH=. .venv-torchrec/bin/python -m tests.clients.torchrec_side COMMAND < in.json > out.json

A model is plain JSON naming TorchRec's own objects: ``topology`` (``Topology``'s
arguments), ``batch_size``, ``collections`` (module path -> ``kind`` ``bag`` or ``sequence``,
``is_weighted``, ``tables``: ``EmbeddingBagConfig``/``EmbeddingConfig`` arguments),
``constraints`` (table -> ``ParameterConstraints`` arguments, ``cache_params`` as
``CacheParams`` arguments), ``fused_params`` and ``options`` (passed to from_torchrec).

Commands:

- ``request``: ``{"models": {id: model}}`` -> per model, from_torchrec's request, or its
  error; with ``"enumerate": true``, also TorchRec's EmbeddingEnumerator's options for the
  model, each shard priced by TorchRec's default estimators.
- ``convert``: ``{"cases": {id: {"plan", "topology", "module_path", "request"}}}`` -> per case, what
  to_torchrec_plan made (every ParameterSharding's fields and shard placements), or its error.
- ``shard``: ``{"model": model, "plan": plan}`` -> ``{"ranks": [...]}``: on world_size gloo
  ranks, the plan applied with to_torchrec_plan and DistributedModelParallel, weights copied
  from an unsharded model, and each rank's outputs for its own batch compared with the
  unsharded model's.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torchrec import (
    DataType,
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    KeyedJaggedTensor,
    PoolingType,
)
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.types import CustomTopologyData, ParameterConstraints, Topology
from torchrec.distributed.types import CacheParams, KeyValueParams

from benchmarks.torchrec_reference import shard_estimates
from clients.torchrec import from_torchrec, to_torchrec_plan
from planner_service.plan.errors import InputError
from planner_service.plan.types import PlanOptions

SEED = 0
IDS_PER_BAG = 3  # bag lengths are drawn from 0..IDS_PER_BAG


# --------------------------------------------------------------------------- the model


def topology(model: dict[str, Any]) -> Topology:
    arguments = dict(model["topology"])
    if arguments.get("custom_topology_data") is not None:
        arguments["custom_topology_data"] = CustomTopologyData(
            arguments["custom_topology_data"], arguments["world_size"]
        )
    return Topology(**arguments)


def fused_params(model: dict[str, Any]) -> dict[str, Any] | None:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    given = model.get("fused_params")
    if given is None or "optimizer" not in given:
        return given
    return {**given, "optimizer": EmbOptimType(given["optimizer"])}


def configs(collection: dict[str, Any]) -> list[Any]:
    make = EmbeddingBagConfig if collection["kind"] == "bag" else EmbeddingConfig
    result = []
    for table in collection["tables"]:
        arguments = dict(table)
        if "pooling" in arguments:
            arguments["pooling"] = PoolingType[arguments["pooling"]]
        arguments["data_type"] = DataType[arguments.get("data_type", "FP32")]
        result.append(make(**arguments))
    return result


def collections(model: dict[str, Any], device: torch.device) -> dict[str, nn.Module]:
    modules: dict[str, nn.Module] = {}
    for path, collection in model["collections"].items():
        if collection["kind"] == "bag":
            modules[path] = EmbeddingBagCollection(
                tables=configs(collection),
                is_weighted=collection.get("is_weighted", False),
                device=device,
            )
        else:
            modules[path] = EmbeddingCollection(tables=configs(collection), device=device)
    return modules


def constraints(model: dict[str, Any]) -> dict[str, ParameterConstraints]:
    result = {}
    for name, arguments in model.get("constraints", {}).items():
        arguments = dict(arguments)
        if arguments.get("cache_params") is not None:
            arguments["cache_params"] = CacheParams(**arguments["cache_params"])
        if arguments.get("output_dtype") is not None:
            arguments["output_dtype"] = DataType[arguments["output_dtype"]]
        if arguments.get("key_value_params") is not None:
            arguments["key_value_params"] = KeyValueParams(**arguments["key_value_params"])
        result[name] = ParameterConstraints(**arguments)
    return result


class Model(nn.Module):
    """The collections as children named by their module paths."""

    def __init__(self, model: dict[str, Any], device: torch.device) -> None:
        super().__init__()
        for path, module in collections(model, device).items():
            self.add_module(path, module)
        self.sequences = {
            path for path, collection in model["collections"].items() if collection["kind"] != "bag"
        }

    def forward(self, features: dict[str, KeyedJaggedTensor]) -> dict[str, torch.Tensor]:
        """Every feature's output: pooled [batch, dim], or the sequence's embeddings."""
        outputs = {}
        for path, module in self.named_children():
            out = module(features[path])
            if path in self.sequences:
                outputs.update({key: jagged.values() for key, jagged in out.items()})
            else:
                outputs.update(out.to_dict())
        return outputs


# --------------------------------------------------------------------------- request


def request_for(model: dict[str, Any]) -> dict[str, Any]:
    """from_torchrec's request for the model (given its collections, or with ``as_configs``
    their bare configs), or its error."""
    if model.get("as_configs"):
        tables: list[Any] = [
            c for collection in model["collections"].values() for c in configs(collection)
        ]
    else:
        tables = list(collections(model, torch.device("meta")).values())
    try:
        request = from_torchrec(
            tables,
            constraints(model),
            topology(model) if model.get("topology") else None,
            model.get("batch_size", 512),
            fused_params=fused_params(model),
            options=PlanOptions.model_validate(model.get("options", {})),
        )
    except InputError as error:
        return {"error": str(error)}
    return {"request": json.loads(request.model_dump_json())}


def torchrec_options(model: dict[str, Any]) -> list[dict[str, Any]]:
    """What TorchRec's own EmbeddingEnumerator makes of the model, with its default
    estimators: every option of every table, every shard priced."""
    enumerator = EmbeddingEnumerator(
        topology=topology(model),
        batch_size=model.get("batch_size", 512),
        constraints=constraints(model) or None,
    )
    module = Model(model, torch.device("meta"))
    sharders = [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]
    return [
        {
            "table": option.name,
            "sharding_type": option.sharding_type,
            "compute_kernel": option.compute_kernel,
            "shards": shard_estimates(option),
        }
        for option in enumerator.enumerate(module, sharders)  # type: ignore[arg-type]
    ]


def command_request(document: dict[str, Any]) -> dict[str, Any]:
    results = {}
    for case, model in document["models"].items():
        results[case] = request_for(model)
        if document.get("enumerate"):
            results[case]["torchrec_options"] = torchrec_options(model)
    return results


# --------------------------------------------------------------------------- shard


def local_batch(model: dict[str, Any], rank: int) -> dict[str, KeyedJaggedTensor]:
    """Each rank's own batch of every collection (the same on every run)."""
    generator = torch.Generator().manual_seed(1000 + rank)
    batch = model["batch_size"]
    features = {}
    for path, collection in model["collections"].items():
        keys, lengths, values = [], [], []
        for table in collection["tables"]:
            for feature in table["feature_names"]:
                feature_lengths = torch.randint(0, IDS_PER_BAG + 1, (batch,), generator=generator)
                ids = torch.randint(
                    0, table["num_embeddings"], (int(feature_lengths.sum()),), generator=generator
                )
                keys.append(feature)
                lengths.append(feature_lengths)
                values.append(ids)
        all_values = torch.cat(values)
        weights = None
        if collection.get("is_weighted"):
            weights = torch.rand(all_values.numel(), generator=generator)
        features[path] = KeyedJaggedTensor.from_lengths_sync(
            keys, all_values, torch.cat(lengths), weights=weights
        )
    return features


def copy_weights(sharded: nn.Module, reference: nn.Module) -> list[dict[str, Any]]:
    """Copy the unsharded model's tables into this rank's shards; returns the shards held
    here (table, offsets, sizes), as TorchRec laid them out."""
    full = reference.state_dict()
    held = []
    with torch.no_grad():
        for key, value in sharded.state_dict().items():
            table = key.split(".")[-2]
            if hasattr(value, "local_shards"):
                for shard in value.local_shards():
                    (row, col), (rows, cols) = (
                        shard.metadata.shard_offsets,
                        shard.metadata.shard_sizes,
                    )
                    shard.tensor.copy_(full[key][row : row + rows, col : col + cols])
                    held.append({"table": table, "offsets": [row, col], "sizes": [rows, cols]})
            else:  # a data-parallel replica
                value.copy_(full[key])
                held.append({"table": table, "offsets": [0, 0], "sizes": list(value.shape)})
    return held


def compared(got: torch.Tensor | None, want: torch.Tensor) -> dict[str, Any]:
    """One feature's sharded output against the unsharded one."""
    if got is None or got.shape != want.shape:
        return {"shape": None if got is None else list(got.shape), "expected": list(want.shape)}
    return {
        "shape": list(got.shape),
        "expected": list(want.shape),
        "max_abs_diff": float((got - want).abs().max()) if want.numel() else 0.0,
        "max_abs": float(want.abs().max()) if want.numel() else 0.0,
    }


def shard_rank(rank: int, world_size: int, model: dict[str, Any], plan: str, out: str) -> None:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    torch.manual_seed(SEED)
    reference = Model(model, torch.device("cpu"))
    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}
    sharders = [
        EmbeddingBagCollectionSharder(fused_params=fused),
        EmbeddingCollectionSharder(fused_params=fused),
    ]
    paths = {
        table["name"]: path
        for path, collection in model["collections"].items()
        for table in collection["tables"]
    }
    torchrec_plan = to_torchrec_plan(plan, topology(model), module_path=paths)
    sharded = DistributedModelParallel(
        Model(model, torch.device("meta")),
        env=ShardingEnv.from_process_group(torch.distributed.group.WORLD),
        plan=torchrec_plan,
        sharders=sharders,  # type: ignore[arg-type]
        device=torch.device("cpu"),
    )
    held = copy_weights(sharded, reference)
    batch = local_batch(model, rank)
    with torch.no_grad():
        expected = reference(batch)
        got = sharded(batch)
    # from_torchrec without a topology plans for this process group, as TorchRec's does.
    running = from_torchrec(
        list(collections(model, torch.device("meta")).values()),
        constraints(model),
        batch_size=model["batch_size"],
        options=PlanOptions.model_validate(model.get("options", {})),
    )
    result = {
        "rank": rank,
        "held": held,
        "plan": {
            path: {name: [p.sharding_type, p.compute_kernel, p.ranks] for name, p in plan_.items()}
            for path, plan_ in sharded.plan.plan.items()
        },
        "outputs": {
            feature: compared(got.get(feature), want) for feature, want in expected.items()
        },
        "running_request": json.loads(running.model_dump_json()),
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    del sharded
    gc.collect()  # before the process group goes (TorchRec's modules hold it in cycles)


def command_shard(document: dict[str, Any]) -> dict[str, Any]:
    from tests.clients.torchrec_side import shard_rank  # importable by the spawned ranks
    from tests.support.distributed import run_ranks

    model = document["model"]
    world_size = model["topology"]["world_size"]
    os.environ["LOCAL_WORLD_SIZE"] = str(model["topology"].get("local_world_size", world_size))
    with tempfile.TemporaryDirectory() as out:
        run_ranks(shard_rank, world_size, model, json.dumps(document["plan"]), out, timeout_s=240)
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world_size)]
    return {"ranks": ranks}


def torchrec_plan_summary(plan: Any) -> dict[str, Any]:
    """A TorchRec ShardingPlan as JSON: per module path and table, what DMP reads."""
    summary: dict[str, Any] = {}
    for path, module_plan in plan.plan.items():
        summary[path] = {}
        for table, sharding in module_plan.items():
            spec = sharding.sharding_spec
            summary[path][table] = {
                "type": [type(plan).__name__, type(module_plan).__name__, type(sharding).__name__],
                "sharding_type": sharding.sharding_type,
                "compute_kernel": sharding.compute_kernel,
                "ranks": sharding.ranks,
                "shards": None
                if spec is None
                else [
                    {
                        "offsets": list(shard.shard_offsets),
                        "sizes": list(shard.shard_sizes),
                        "placement": str(shard.placement),
                    }
                    for shard in spec.shards
                ],
                "cache_load_factor": None
                if sharding.cache_params is None
                else sharding.cache_params.load_factor,
            }
    return summary


def command_convert(document: dict[str, Any]) -> dict[str, Any]:
    """``{"cases": {id: {"plan", "topology", "module_path", "request"}}}`` -> per case, the
    summary of to_torchrec_plan's result, or its error."""
    results = {}
    for case, arguments in document["cases"].items():
        given = arguments.get("topology")
        try:
            plan = to_torchrec_plan(
                arguments["plan"]
                if isinstance(arguments["plan"], str)
                else json.dumps(arguments["plan"]),
                Topology(**given) if given else None,
                module_path=arguments.get("module_path", ""),
                request=arguments.get("request"),
            )
        except InputError as error:
            results[case] = {"error": str(error)}
            continue
        results[case] = {"plan": torchrec_plan_summary(plan)}
    return results


COMMANDS = {"request": command_request, "convert": command_convert, "shard": command_shard}


def main() -> None:
    logging.disable(logging.WARNING)  # TorchRec warns about every directly built Topology
    warnings.simplefilter("ignore")
    document = json.load(sys.stdin)
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the answer only
        answer = COMMANDS[sys.argv[1]](document)
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
