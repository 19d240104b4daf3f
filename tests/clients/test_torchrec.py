"""TorchRec interop (clients/torchrec.py) against TorchRec 1.8.0 itself.

TorchRec cannot share the product's environment (it pulls the CUDA fbgemm-gpu, whose module
replaces the runtime's fbgemm-gpu-cpu), so it lives in ``.venv-torchrec``, which
benchmarks/torchrec_env.sh makes (first time about a minute) or finds up to date (5 s). The
TorchRec side of every test runs there, in tests/clients/torchrec_side.py, on real TorchRec objects;
the planner side runs here. A few subprocess calls serve all the tests of a kind.

- Our plan for a small model (every sharding type TorchRec 1.8 runs on CPU) is accepted by
  DistributedModelParallel on 2 gloo ranks, places every shard where the plan says, and gives
  the unsharded model's outputs.
- A request built by from_torchrec from TorchRec's objects prices every option TorchRec's own
  EmbeddingEnumerator makes exactly as TorchRec does (``cost_model: torchrec-1.8``).
- What from_torchrec maps, and what it refuses with a message naming the setting;
  to_torchrec_plan's placements, kernels and cache parameters.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from benchmarks.compare_torchrec_estimator import compare
from clients.torchrec import to_torchrec_plan
from planner_service.costs.enumerate import enumerate_options
from planner_service.plan.codec import parse_request, request_hash
from planner_service.plan.errors import InputError
from planner_service.plan.types import ROW_SHARDING_TYPES, ShardingType
from planner_service.solve.deadline import Deadline
from planner_service.solve.pipeline import solve
from tests.project import doc_commands
from tests.support import builders

ROOT = Path(__file__).resolve().parents[2]
TORCHREC_ENV = ROOT / "benchmarks" / "torchrec_env.sh"
ENV_TIMEOUT_S = 900  # a first build downloads ~200 MB of wheels
# A first build of the environment runs inside the first test that needs it.
pytestmark = [pytest.mark.timeout(ENV_TIMEOUT_S + 300), pytest.mark.slow]
GiB = 2**30


@pytest.fixture(scope="module")
def torchrec_python() -> Path:
    """``.venv-torchrec``'s interpreter, made or checked by benchmarks/torchrec_env.sh."""
    try:
        done = subprocess.run(
            ["bash", str(TORCHREC_ENV)],
            capture_output=True,
            text=True,
            timeout=ENV_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"benchmarks/torchrec_env.sh ran past {ENV_TIMEOUT_S} s; run it by hand")
    if done.returncode != 0:
        pytest.fail(
            "these tests need TorchRec 1.8.0 in .venv-torchrec, which benchmarks/torchrec_env.sh "
            "could not make (it needs Python 3.11 and PyPI). Run `bash "
            "benchmarks/torchrec_env.sh` and fix what it reports:\n" + done.stderr[-3000:]
        )
    return Path(done.stdout.strip().splitlines()[-1])


def run_torchrec(python: Path, command: str, document: Any, timeout_s: float = 300) -> Any:
    """tests/clients/torchrec_side.py's answer to ``command`` for ``document``."""
    done = subprocess.run(
        [str(python), "-m", "tests.clients.torchrec_side", command],
        input=json.dumps(document),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"),
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, f"torchrec_side {command} failed:\n{done.stderr[-6000:]}"
    return json.loads(done.stdout)


def solved(request: dict[str, Any]) -> dict[str, Any]:
    outcome = solve(parse_request(json.dumps(request)), deadline=Deadline.never())
    assert outcome.plan is not None, outcome.infeasibility
    return json.loads(outcome.plan.model_dump_json())


def sequence(name: str, rows: int, dim: int, *features: str, **more: Any) -> dict[str, Any]:
    """An EmbeddingConfig's arguments (a sequence table)."""
    return {
        "name": name,
        "num_embeddings": rows,
        "embedding_dim": dim,
        "feature_names": list(features or [name]),
        **more,
    }


def bag(name: str, rows: int, dim: int, *features: str, **more: Any) -> dict[str, Any]:
    """An EmbeddingBagConfig's arguments (a pooled table, sum unless ``pooling`` says)."""
    return {**sequence(name, rows, dim, *features), "pooling": "SUM", **more}


# --------------------------------------------------------------------------- DMP on CPU

# Every sharding type TorchRec 1.8 runs on CPU, forced per table. Left out, because TorchRec
# 1.8 gets them wrong on CPU with its own plans too (construct_module_sharding_plan, or its
# planner's): data_parallel sequence tables (construct_jagged_tensors fails: split sizes do not
# match), and mean pooling on a row_wise table (the other tables of its collection come out
# wrong; sum pooling there, mean on a table_wise table, are right).
DMP_MODEL = {
    "topology": {"world_size": 2, "local_world_size": 2, "compute_device": "cpu"},
    "batch_size": 4,
    "collections": {
        "sparse": {
            "kind": "bag",
            "tables": [
                bag("tw", 50, 16, pooling="MEAN"),
                bag("rw", 63, 16, "rw_a", "rw_b"),
                bag("cw", 40, 64),
                bag("twrw", 45, 8),
                bag("twcw", 30, 32),
                bag("dp", 20, 8),
            ],
        },
        "weighted": {"kind": "bag", "is_weighted": True, "tables": [bag("clicks", 37, 8)]},
        "history": {
            "kind": "sequence",
            "tables": [sequence("s_tw", 30, 8), sequence("s_rw", 33, 8), sequence("s_cw", 20, 8)],
        },
    },
    "constraints": {
        "tw": {"sharding_types": ["table_wise"]},
        "rw": {"sharding_types": ["row_wise"], "pooling_factors": [2.0, 1.0]},
        # Heavy enough that the planner splits it (it may also keep a column table whole).
        "cw": {"sharding_types": ["column_wise"], "min_partition": 16, "pooling_factors": [60.0]},
        "twrw": {"sharding_types": ["table_row_wise"]},
        "twcw": {"sharding_types": ["table_column_wise"], "min_partition": 8},
        "dp": {"sharding_types": ["data_parallel"]},
        "clicks": {"sharding_types": ["row_wise"]},
        "s_tw": {"sharding_types": ["table_wise"]},
        "s_rw": {"sharding_types": ["row_wise"]},
        "s_cw": {"sharding_types": ["column_wise"], "min_partition": 4},
    },
}


FEATURES = {
    feature
    for collection in DMP_MODEL["collections"].values()
    for table in collection["tables"]
    for feature in table["feature_names"]
}


def test_our_plan_runs_in_distributed_model_parallel_and_matches_the_unsharded_model(
    torchrec_python,
):
    request = run_torchrec(torchrec_python, "request", {"models": {"dmp": DMP_MODEL}})["dmp"]
    plan = solved(request["request"])
    types = {name: table["sharding_type"] for name, table in plan["tables"].items()}
    assert types == {
        name: constraint["sharding_types"][0]
        for name, constraint in DMP_MODEL["constraints"].items()
    }
    assert len(builders.shard_list(plan["tables"]["cw"])) > 1, (
        "cw kept whole: make it heavier to split"
    )

    ranks = run_torchrec(torchrec_python, "shard", {"model": DMP_MODEL, "plan": plan})["ranks"]

    for rank, result in enumerate(ranks):
        # DMP kept our plan: every table's sharding type, kernel and ranks.
        kept = {name: p for module in result["plan"].values() for name, p in module.items()}
        assert kept == {
            name: [
                t["sharding_type"],
                t["compute_kernel"],
                [s["rank"] for s in builders.shard_list(t)],
            ]
            for name, t in plan["tables"].items()
        }
        assert set(result["plan"]) == {"sparse", "weighted", "history"}
        # Every shard is on the rank the plan names, with the plan's offsets and sizes.
        held = sorted((h["table"], h["offsets"], h["sizes"]) for h in result["held"])
        assert held == sorted(
            (name, shard["offsets"], shard["sizes"])
            for name, table in plan["tables"].items()
            for shard in builders.shard_list(table)
            if shard["rank"] == rank
        )
        outputs = result["outputs"]
        assert set(outputs) == FEATURES
        for feature, output in outputs.items():
            assert output["shape"] == output["expected"], (rank, feature, output)
            assert output["max_abs_diff"] <= 1e-6, (rank, feature, output)
        assert all(output["max_abs"] > 0 for output in outputs.values())  # ids were looked up
        # Without a topology, from_torchrec plans for the running process group.
        assert result["running_request"] == request["request"]


# --------------------------------------------------------------------------- prices

PRICED_MODELS = {
    "cuda": {
        "topology": {
            "world_size": 8,
            "local_world_size": 4,
            "compute_device": "cuda",
            "hbm_cap": 24 * GiB,
            "ddr_cap": 96 * GiB,
            # bytes per ms, as TorchRec counts them
            "hbm_mem_bw": 1.2e9,
            "ddr_mem_bw": 4.0e7,
            "hbm_to_ddr_mem_bw": 2.5e7,
            "intra_host_bw": 3.0e8,
            "inter_host_bw": 1.1e7,
        },
        "batch_size": 256,
        "collections": {
            "sparse": {
                "kind": "bag",
                "tables": [
                    bag("user", 200_000, 128, "user_id", "user_geo"),
                    bag("item", 50_000, 256, "item_id", pooling="MEAN", data_type="FP16"),
                    bag("small", 1_000, 24, data_type="BF16"),
                ],
            },
            "weighted": {"kind": "bag", "is_weighted": True, "tables": [bag("clicks", 30_000, 64)]},
            "history": {
                "kind": "sequence",
                "tables": [sequence("hist", 100_000, 64, "hist_item", "hist_cat")],
            },
        },
        "constraints": {
            "user": {
                "pooling_factors": [4.0, 1.5],
                "num_poolings": [1.0, 2.0],
                "batch_sizes": [256, 128],
                "min_partition": 32,
                "cache_params": {"load_factor": 0.35},
            },
            "item": {
                "pooling_factors": [12.0],
                "sharding_types": [
                    "row_wise",
                    "table_row_wise",
                    "column_wise",
                    "table_column_wise",
                ],
                "min_partition": 64,
            },
            "clicks": {"compute_kernels": ["fused", "fused_uvm"], "pooling_factors": [0.5]},
            "hist": {"pooling_factors": [20.0, 5.0]},
        },
        "options": {"cost_model": "torchrec-1.8"},
    },
    "cpu": {
        "topology": {"world_size": 2, "compute_device": "cpu", "ddr_cap": 64 * GiB},
        "batch_size": 1024,
        "collections": {
            "sparse": {
                "kind": "bag",
                "tables": [bag("user", 80_000, 64), bag("item", 9_000, 128, pooling="MEAN")],
            },
            "history": {"kind": "sequence", "tables": [sequence("hist", 5_000, 32)]},
        },
        "constraints": {"user": {"pooling_factors": [3.0]}, "item": {"min_partition": 32}},
        "options": {"cost_model": "torchrec-1.8"},
    },
}


@pytest.fixture(scope="module")
def priced(torchrec_python):
    document = {"models": PRICED_MODELS, "enumerate": True}
    return run_torchrec(torchrec_python, "request", document)


@pytest.mark.parametrize("model", sorted(PRICED_MODELS))
def test_from_torchrec_prices_every_option_exactly_as_torchrec_does(priced, model):
    request = parse_request(json.dumps(priced[model]["request"]))
    ours = {
        (
            table.table.name,
            option.sharding_type.value,
            option.compute_kernel.value,
            layout(option),
        ): option
        for table in enumerate_options(request)
        for option in table.options
    }
    theirs = priced[model]["torchrec_options"]
    assert len(theirs) >= 10
    worst = 0.0
    for option in theirs:
        key = (
            option["table"],
            option["sharding_type"],
            option["compute_kernel"],
            tuple((tuple(s["offsets"]), tuple(s["sizes"])) for s in option["shards"]),
        )
        assert key in ours, f"TorchRec's option {key[:3]} with shards {key[3]} is not among ours"
        errors, problems = compare(ours[key], option)
        assert not problems
        worst = max(worst, *errors.values())
    assert worst == 0.0  # every perf component and byte count, of every shard
    # Ours are TorchRec's, plus column splits TorchRec does not try and the row-wise types
    # it leaves out on CPU for pooled tables.
    kinds = {key[:3] for key in ours}
    assert {(o["table"], o["sharding_type"], o["compute_kernel"]) for o in theirs} == {
        kind
        for kind in kinds
        if not (model == "cpu" and kind[0] != "hist" and kind[1] in ROW_TYPES)
    }


ROW_TYPES = {t.value for t in ROW_SHARDING_TYPES}


def layout(option) -> tuple:
    return tuple(
        (tuple(offsets), tuple(shard.sizes))
        for shard, offsets in zip(option.shards, option.offsets(), strict=True)
    )


# --------------------------------------------------------------------------- mapped

MAPPED = {
    "topology": {
        "world_size": 4,
        "local_world_size": 2,
        "compute_device": "cuda",
        "hbm_cap": 2 * GiB,
        "ddr_cap": 64 * GiB,
        "custom_topology_data": {"hbm_cap": [2 * GiB, 2 * GiB, 1 * GiB, 2 * GiB]},
        "hbm_mem_bw": 1.0e9,
        "ddr_mem_bw": 5.0e7,
        "hbm_to_ddr_mem_bw": 2.0e7,
        "intra_host_bw": 2.5e8,
        "inter_host_bw": 1.25e7,
    },
    "batch_size": 128,
    "fused_params": {"optimizer": "exact_row_wise_adagrad", "cache_load_factor": 0.25},
    "collections": {
        "sparse": {
            "kind": "bag",
            "is_weighted": True,
            "tables": [
                bag("user", 1_000, 64, "u1", "u2"),
                bag("item", 500, 32, pooling="MEAN", data_type="FP16"),
            ],
        },
        "history": {"kind": "sequence", "tables": [sequence("hist", 300, 32)]},
    },
    "constraints": {
        "item": {
            "sharding_types": ["row_wise", "column_wise"],
            "compute_kernels": ["fused", "fused_uvm_caching"],
            "min_partition": 16,
            "cache_params": {"load_factor": 0.5, "algorithm": None},
            "pooling_factors": [3.0],
            "num_poolings": [2.0],
            "batch_sizes": [64],
            # run-time settings that do not change a plan
            "enforce_hbm": True,
            "stochastic_rounding": True,
            "feature_names": ["item"],
            "output_dtype": "FP16",
            "device_group": "cuda",
        },
        "hist": {"pooling_factors": [7.0]},
    },
    "options": {"cost_model": "torchrec-1.8", "time_limit_s": 5.0},
}

# Bare configs, no collection: a bag's weighting comes from its constraint.
CONFIGS = {
    "topology": {"world_size": 2, "compute_device": "cpu"},
    "as_configs": True,
    "collections": {
        "sparse": {"kind": "bag", "tables": [bag("clicks", 100, 8)]},
        "history": {"kind": "sequence", "tables": [sequence("hist", 50, 8)]},
    },
    "constraints": {"clicks": {"is_weighted": True}},
}


def small(**changes: Any) -> dict[str, Any]:
    """A one-table model on 2 cuda ranks, with ``changes`` to its parts."""
    model: dict[str, Any] = {
        "topology": {"world_size": 2, "compute_device": "cuda"},
        "collections": {"sparse": {"kind": "bag", "tables": [bag("t", 100, 16, "f", "g")]}},
        "constraints": {},
    }
    for part, value in changes.items():
        model[part] = value
    return model


def one_table(table: dict[str, Any], kind: str = "bag", **changes: Any) -> dict[str, Any]:
    return small(collections={"c": {"kind": kind, "tables": [table]}}, **changes)


def constrained(**constraint: Any) -> dict[str, Any]:
    return small(constraints={"t": constraint})


REFUSED = {
    "sharding_type": (
        constrained(sharding_types=["table_wise", "grid_shard"]),
        "constraints['t'].sharding_types = 'grid_shard': has no counterpart in a shardplan "
        "plan; accepted: column_wise, data_parallel, row_wise, table_column_wise, "
        "table_row_wise, table_wise",
    ),
    "compute_kernel": (
        constrained(compute_kernels=["fused", "key_value"]),
        "constraints['t'].compute_kernels = 'key_value': has no counterpart in a shardplan "
        "plan; accepted: dense, fused, fused_uvm, fused_uvm_caching",
    ),
    "key_value_params": (
        constrained(key_value_params={}),
        "constraints['t'].key_value_params = 'KeyValueParams': key-value (SSD) kernels have "
        "no counterpart in a shardplan plan; leave it unset",
    ),
    "prefetch_pipeline": (
        constrained(cache_params={"load_factor": 0.2, "prefetch_pipeline": True}),
        "constraints['t'].cache_params.prefetch_pipeline = True: prefetch pipelining changes "
        "TorchRec's prices and is not modelled; leave it unset for planning",
    ),
    "output_dtype": (
        constrained(output_dtype="FP16"),
        "constraints['t'].output_dtype = 'FP16': differs from the table's data type FP32; "
        "outputs are priced in the table's type, so leave it unset or equal",
    ),
    "device_group": (
        constrained(device_group="cpu"),
        "constraints['t'].device_group = 'cpu': is not the topology's compute_device 'cuda'; "
        "TorchRec plans such tables separately, so put them in a request of their own",
    ),
    "feature_names": (
        constrained(feature_names=["g", "f"]),
        "constraints['t'].feature_names = ['g', 'f']: differs from the table's feature_names "
        "['f', 'g']; leave it unset or equal",
    ),
    "pooling_factors": (
        constrained(pooling_factors=[2.0]),
        "constraints['t'].pooling_factors = [2.0]: has 1 entries for a table of 2 features "
        "['f', 'g']; give one per feature, in feature_names order",
    ),
    "num_poolings": (
        small(
            batch_size=333,
            constraints={"t": {"pooling_factors": [1.0, 2.0], "num_poolings": [1.0, 1.5]}},
        ),
        "constraints['t'].num_poolings[1] = 1.5: times batch size 333 makes 499.5 bags per "
        "iteration; shardplan counts whole bags (batch_sizes), so make the product a whole "
        "number",
    ),
    "unknown_table": (
        small(constraints={"users": {"min_partition": 8}}),
        "constraints['users'] = 'users': names no table given; the tables are t",
    ),
    "data_type": (
        {**one_table(bag("q", 100, 16, data_type="INT4")), "as_configs": True},
        "tables['q'].data_type = 'INT4': has no counterpart here; accepted: FP32, FP16, BF16, INT8",
    ),
    "virtual_table": (
        {**one_table(bag("v", 100, 16, use_virtual_table=True)), "as_configs": True},
        "tables['v'].use_virtual_table = True: virtual tables (key-value kernels, ids beyond "
        "num_embeddings) have no counterpart in a plan; plan this table without it",
    ),
    "bag_without_pooling": (
        {**one_table(bag("n", 100, 16, pooling="NONE")), "as_configs": True},
        "tables['n'].pooling = 'NONE': an EmbeddingBagConfig pools its bags; accepted: SUM, "
        "MEAN (a sequence table is an EmbeddingConfig)",
    ),
    "weighted_sequence": (
        one_table(
            sequence("s", 100, 16), kind="sequence", constraints={"s": {"is_weighted": True}}
        ),
        "tables[0].is_weighted = True: table 's' has is_weighted true with pooling none; "
        "per-id weights scale ids inside a pooled bag, so use pooling sum or mean, or "
        "is_weighted false",
    ),
    "optimizer": (
        small(fused_params={"optimizer": "lamb"}),
        "fused_params['optimizer'] = 'lamb': has no counterpart here; accepted: adagrad, adam, "
        "exact_adagrad, exact_row_wise_adagrad, exact_sgd, row_wise_adagrad, rowwise_adagrad, "
        "sgd",
    ),
    "pod_size": (
        small(
            topology={
                "world_size": 4,
                "local_world_size": 1,
                "pod_size": 2,
                "compute_device": "cuda",
            }
        ),
        "topology.pod_size = 2: groups 2 ranks for table_row_wise where a host has 1; "
        "shardplan groups by host, so leave pod_size unset",
    ),
    "multiplier": (
        small(topology={"world_size": 2, "compute_device": "cuda", "bwd_compute_multiplier": 3.0}),
        "topology.bwd_compute_multiplier = 3.0: shardplan's cost models use TorchRec's default "
        "2; leave it unset",
    ),
    "device": (
        small(topology={"world_size": 2, "compute_device": "mtia"}),
        "topology.compute_device = 'mtia': has no counterpart here; accepted: cuda, cpu",
    ),
    "no_topology": (
        small(topology=None),
        "topology: is needed when no torch.distributed process group is running; pass "
        "TorchRec's Topology(world_size=..., compute_device=..., local_world_size=...)",
    ),
}


# The setup docs/from-torchrec.md shows, as TorchRec objects.
GUIDE = {
    "topology": {
        "world_size": 8,
        "local_world_size": 8,
        "compute_device": "cuda",
        "hbm_cap": 80 * GiB,
    },
    "batch_size": 1024,
    "collections": {
        "ebc": {
            "kind": "bag",
            "tables": [
                bag("user", 10_000_000, 128, "user_id"),
                bag("item", 5_000_000, 256, "item_id"),
                bag("city", 20_000, 32, "city_id"),
            ],
        }
    },
    "constraints": {
        "item": {"sharding_types": ["row_wise", "table_row_wise"], "pooling_factors": [12.0]},
        "user": {"compute_kernels": ["fused_uvm_caching"], "cache_params": {"load_factor": 0.1}},
    },
    "options": {"cost_model": "torchrec-1.8"},
}


@pytest.fixture(scope="module")
def requests(torchrec_python):
    models = {"mapped": MAPPED, "configs": CONFIGS, "guide": GUIDE} | {
        case: model for case, (model, _) in REFUSED.items()
    }
    return run_torchrec(torchrec_python, "request", {"models": models})


def test_from_torchrec_maps_topology_tables_constraints_and_fused_params(requests):
    request = requests["mapped"]["request"]
    assert request["topology"] == {
        "world_size": 4,
        "local_world_size": 2,
        "compute_device": "cuda",
        "hbm_bytes": 2 * GiB,
        "ddr_bytes": 64 * GiB,
        # bytes per ms times 1,000
        "hbm_bw_bytes_per_s": 1.0e12,
        "ddr_bw_bytes_per_s": 5.0e10,
        "hbm_to_ddr_bw_bytes_per_s": 2.0e10,
        "intra_host_bw_bytes_per_s": 2.5e11,
        "inter_host_bw_bytes_per_s": 1.25e10,
        "rank_overrides": [
            {
                "rank": 2,
                "hbm_bytes": 1 * GiB,
                "ddr_bytes": None,
                "hbm_bw_bytes_per_s": None,
                "ddr_bw_bytes_per_s": None,
            }
        ],
    }
    common = {"batch_sizes": None, "optimizer": "rowwise_adagrad"}
    assert request["tables"] == [
        # TorchRec counts one lookup per sample for a table without pooling factors; here
        # that is one per feature (docs/from-torchrec.md).
        {
            "name": "user",
            "num_embeddings": 1_000,
            "embedding_dim": 64,
            "feature_names": ["u1", "u2"],
            "pooling": "sum",
            "pooling_factors": [1.0, 1.0],
            "data_type": "fp32",
            "is_weighted": True,
            **common,
        },
        # num_poolings 2 x batch size 64: 128 bags per iteration
        {
            "name": "item",
            "num_embeddings": 500,
            "embedding_dim": 32,
            "feature_names": ["item"],
            "pooling": "mean",
            "pooling_factors": [3.0],
            "data_type": "fp16",
            "is_weighted": True,
            **common,
            "batch_sizes": [128],
        },
        {
            "name": "hist",
            "num_embeddings": 300,
            "embedding_dim": 32,
            "feature_names": ["hist"],
            "pooling": "none",
            "pooling_factors": [7.0],
            "data_type": "fp32",
            "is_weighted": False,
            **common,
        },
    ]
    assert request["constraints"]["tables"] == {
        "user": {
            "sharding_types": None,
            "compute_kernels": None,
            "ranks": None,
            "min_partition": None,
            "cache_load_factor": 0.25,
        },
        "item": {
            "sharding_types": ["row_wise", "column_wise"],
            "compute_kernels": ["fused", "fused_uvm_caching"],
            "ranks": None,
            "min_partition": 16,
            "cache_load_factor": 0.5,
        },
        "hist": {  # a sequence table: what TorchRec's EmbeddingCollection runs
            "sharding_types": ["data_parallel", "table_wise", "column_wise", "row_wise"],
            "compute_kernels": None,
            "ranks": None,
            "min_partition": None,
            "cache_load_factor": 0.25,
        },
    }
    assert request["batch_size"] == 128
    assert request["options"]["cost_model"] == "torchrec-1.8"
    assert request["options"]["time_limit_s"] == 5.0


def test_from_torchrec_takes_bare_configs_and_the_weighting_from_constraints(requests):
    tables = requests["configs"]["request"]["tables"]
    assert [(t["name"], t["pooling"], t["is_weighted"]) for t in tables] == [
        ("clicks", "sum", True),
        ("hist", "none", False),
    ]
    assert requests["configs"]["request"]["topology"]["hbm_bytes"] == 0  # cpu


def test_the_guide_s_request_is_what_from_torchrec_makes_of_its_torchrec_setup(requests):
    made = parse_request(json.dumps(requests["guide"]["request"]))
    headroom = made.constraints.model_copy(update={"hbm_headroom_fraction": 0.1})
    made = made.model_copy(update={"constraints": headroom})
    page = ROOT / "docs" / "from-torchrec.md"
    shown = next(b for b in doc_commands.blocks(page) if b.file == "from-torchrec.json")
    assert made == parse_request(shown.body)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_from_torchrec_refuses_what_a_request_cannot_say_naming_it(requests, case):
    assert requests[case] == {"error": f"from_torchrec: {REFUSED[case][1]}"}


# --------------------------------------------------------------------------- to TorchRec


def request_with_every_type(device: str) -> dict[str, Any]:
    forced = {
        "a": ["table_wise"],
        "b": ["row_wise"],
        "c": ["column_wise"],
        "d": ["data_parallel"],
        "e": ["table_row_wise"],
        "f": ["table_column_wise"],
    }
    constraints = {name: {"sharding_types": kinds} for name, kinds in forced.items()}
    if device == "cuda":
        constraints["c"] |= {"compute_kernels": ["fused_uvm_caching"], "cache_load_factor": 0.3}
    return {
        "topology": {"world_size": 4, "local_world_size": 2, "compute_device": device},
        "tables": [
            {
                "name": name,
                "num_embeddings": 1_000 + 10 * i,
                "embedding_dim": 64,
                "pooling_factors": [30.0],
            }
            for i, name in enumerate(forced)
        ],
        "constraints": {"tables": constraints, "hbm_headroom_fraction": 0.1},
    }


@pytest.fixture(scope="module")
def plans():
    return {device: solved(request_with_every_type(device)) for device in ("cuda", "cpu")}


@pytest.fixture(scope="module")
def converted(torchrec_python, plans):
    cuda, cpu = plans["cuda"], plans["cpu"]
    topology = {"world_size": 4, "local_world_size": 2, "compute_device": "cuda"}
    cases = {
        "cuda": {"plan": cuda, "topology": topology, "module_path": "model.sparse"},
        "cuda_request": {"plan": cuda, "request": json.dumps(request_with_every_type("cuda"))},
        "cpu": {"plan": cpu, "topology": {"world_size": 4, "compute_device": "cpu"}},
        "cpu_request": {"plan": cpu, "request": json.dumps(request_with_every_type("cpu"))},
        "paths": {
            "plan": cuda,
            "topology": topology,
            "module_path": dict.fromkeys("abc", "x") | dict.fromkeys("def", "y"),
        },
        "missing_path": {
            "plan": cuda,
            "topology": topology,
            "module_path": dict.fromkeys("abcd", "x"),
        },
        "world_size": {"plan": cuda, "topology": {"world_size": 8, "compute_device": "cuda"}},
    }
    return run_torchrec(torchrec_python, "convert", {"cases": cases})


def expected_torchrec_plan(plan: dict[str, Any], placement) -> dict[str, Any]:
    return {
        name: {
            "type": ["ShardingPlan", "EmbeddingModuleShardingPlan", "ParameterSharding"],
            "sharding_type": table["sharding_type"],
            "compute_kernel": table["compute_kernel"],
            "ranks": [s["rank"] for s in builders.shard_list(table)],
            "shards": None
            if table["sharding_type"] == "data_parallel"
            else [
                {"offsets": s["offsets"], "sizes": s["sizes"], "placement": placement(s["rank"])}
                for s in builders.shard_list(table)
            ],
            "cache_load_factor": table.get("cache_load_factor"),
        }
        for name, table in plan["tables"].items()
    }


def test_to_torchrec_plan_places_every_shard_as_torchrec_names_devices(converted, plans):
    cuda = plans["cuda"]
    assert {t["sharding_type"] for t in cuda["tables"].values()} == {t.value for t in ShardingType}
    assert cuda["tables"]["c"]["cache_load_factor"] == 0.3
    assert converted["cuda"] == {
        "plan": {"model.sparse": expected_torchrec_plan(cuda, lambda r: f"rank:{r}/cuda:{r % 2}")}
    }
    # The request the plan was made from says the device and the ranks per host.
    assert converted["cuda_request"] == {
        "plan": {"": expected_torchrec_plan(cuda, lambda r: f"rank:{r}/cuda:{r % 2}")}
    }
    on_cpu = {"plan": {"": expected_torchrec_plan(plans["cpu"], lambda r: f"rank:{r}/cpu")}}
    assert converted["cpu"] == converted["cpu_request"] == on_cpu


def test_to_torchrec_plan_puts_tables_in_the_modules_named(converted, plans):
    every = expected_torchrec_plan(plans["cuda"], lambda r: f"rank:{r}/cuda:{r % 2}")
    assert converted["paths"] == {
        "plan": {
            "x": {name: every[name] for name in "abc"},
            "y": {name: every[name] for name in "def"},
        }
    }


def test_to_torchrec_plan_refuses_a_plan_it_cannot_place(converted):
    assert converted["missing_path"] == {
        "error": "to_torchrec_plan: module_path = ['a', 'b', 'c', 'd']: has no module for "
        "tables 'e', 'f'; map every table of the plan to the path of the collection holding it"
    }
    assert converted["world_size"] == {
        "error": "to_torchrec_plan: topology.world_size = 8: differs from the plan's "
        "world_size 4; pass the topology the plan was made for"
    }


def test_to_torchrec_plan_without_a_device_says_what_to_pass_before_importing_torchrec(plans):
    """A plan does not record its request's compute device (recording it would change every
    plan's bytes and id), so the export refuses to guess one; it refuses here, where TorchRec
    is not installed, so nothing of TorchRec is reached."""
    with pytest.raises(InputError) as error:
        to_torchrec_plan(json.dumps(plans["cpu"]))
    assert str(error.value) == (
        "to_torchrec_plan: topology: is needed: a plan does not record the compute device its "
        "request named, and TorchRec places every shard on it; pass the request the plan was "
        "made from (request=...), its topology (topology=request.topology), or TorchRec's "
        "Topology(world_size=4, compute_device='cpu' or 'cuda', local_world_size=ranks per host)"
    )


def test_to_torchrec_plan_refuses_a_request_the_plan_was_not_made_from(plans):
    cuda_request = parse_request(json.dumps(request_with_every_type("cuda")))
    with pytest.raises(InputError) as error:
        to_torchrec_plan(json.dumps(plans["cpu"]), request=cuda_request)
    assert str(error.value) == (
        f"to_torchrec_plan: request = '{request_hash(cuda_request)}': is not the request the "
        f"plan was made from (the plan's request_hash is {plans['cpu']['request_hash']}); pass "
        "that request, or the topology the plan was made for"
    )
    with pytest.raises(InputError, match=r"request: is given with a topology; pass one of them"):
        to_torchrec_plan(json.dumps(plans["cuda"]), cuda_request.topology, request=cuda_request)
    with pytest.raises(ModuleNotFoundError, match="torchrec"):  # past every check
        to_torchrec_plan(json.dumps(plans["cuda"]), request=cuda_request)
