#!/usr/bin/env python3
"""Reference harness: run TorchRec 1.8.0's *default* sharding planner on a PlanRequest.

Dev/benchmark only. TorchRec is never a dependency of shardplan; this script runs inside
the separate virtualenv created by ``benchmarks/torchrec_env.sh``::

    bash benchmarks/torchrec_env.sh
    .venv-torchrec/bin/python benchmarks/torchrec_planner_reference.py request.json \\
        [--time-cap SECONDS] > result.json

Input: a shardplan ``PlanRequest`` JSON (``-`` reads stdin). Only the workload is used:
``topology`` (world_size, local_world_size, compute_device, hbm_bytes, ddr_bytes),
``batch_size`` and per table name / num_embeddings / embedding_dim / feature_names /
pooling / pooling_factors / batch_sizes / data_type / is_weighted. shardplan's own
``constraints`` and ``options`` are deliberately ignored: this measures TorchRec's planner
as it ships.

What runs (TorchRec defaults everywhere else): one meta-device EmbeddingBagCollection
with one EmbeddingBagConfig per table, ``Topology(world_size, compute_device, hbm_cap,
ddr_cap, local_world_size)``, ``constraints = {name: ParameterConstraints(pooling_factors=
[...])}``, ``EmbeddingShardingPlanner(topology=, batch_size=, constraints=)`` -- i.e.
EmbeddingEnumerator with the default estimators, proposers [GridSearchProposer,
GreedyProposer, GreedyProposer(use_depth=False), UniformProposer], GreedyPerfPartitioner,
NoopPerfModel, HeuristicalStorageReservation(percentage=0.15) -- and
``planner.plan(module, sharders=[EmbeddingBagCollectionSharder()])``. Only ``plan()`` is
timed. (Requests that TorchRec cannot hold in one EBC -- weighted and unweighted tables
mixed, or ``pooling: none`` sequence tables -- are split into one EBC per weightedness
plus an EmbeddingCollection, under a plain wrapper module, with the matching sharders.)

Time cap: the planning runs in a child process (this script with a hidden flag, in its
own process group). The cap counts from the moment the child calls ``plan()`` (imports
and module construction, ~3 s, are not charged to TorchRec; they have their own generous
bound, ``--setup-timeout``). On expiry the whole child process group is SIGKILLed and
``{"status": "did_not_finish", "time_cap_s": N}`` is printed.

Output (stdout, one JSON object; all TorchRec chatter goes to stderr)::

    {"status": "ok", "wall_time_s": ...,
     "tables": {name: {"sharding_type", "compute_kernel", "ranks",
                       "shards": [{"offsets", "sizes", "rank"}], "cache_load_factor"}},
     "rating": NoopPerfModel.rate(best plan)   # max over ranks of summed shard perf.total
     "per_rank_perf_total": [...], "per_rank_hbm_bytes": [...], "per_rank_ddr_bytes": [...],
     "storage_reservation": "HeuristicalStorageReservation(percentage=0.15, ...)",
     "storage_reservation_detail": {...usable per-rank capacity after reservation...},
     "num_proposals": ..., "num_plans": ...}
    {"status": "error", "error": "...", "wall_time_s": ...}     # e.g. PlannerError
    {"status": "did_not_finish", "time_cap_s": N}

Per-rank numbers and the rating come from ``planner._best_plan`` -- the exact list of
ShardingOptions (shards with rank, perf, storage filled in) that the planner rated and
turned into the returned ShardingPlan: perf.total / storage.hbm / storage.ddr are summed
per shard.rank, and the rating is ``planner._perf_model.rate(planner._best_plan)``
(NoopPerfModel: max over ranks of the summed perf.total, in TorchRec's milliseconds).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

DEFAULT_TIME_CAP_S = 180.0
DEFAULT_SETUP_TIMEOUT_S = 300.0
CHILD_FLAG = "--_planner-child"

GiB = 1024**3
DEFAULT_HBM_BYTES = 32 * GiB  # TorchRec's HBM_CAP
DEFAULT_DDR_BYTES = 128 * GiB  # TorchRec's DDR_CAP
DEFAULT_BATCH_SIZE = 512  # TorchRec's BATCH_SIZE


class RequestError(ValueError):
    """A malformed request (reported as status error)."""


def _error_text(exc: BaseException, limit: int = 2000) -> str:
    msg = str(exc).strip()
    text = f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
    return text[:limit]


def _emit(obj: dict[str, Any], stream: Any = None) -> None:
    stream = stream or sys.stdout
    json.dump(obj, stream, allow_nan=False)
    stream.write("\n")
    stream.flush()


# --------------------------------------------------------------------------------------
# Child: build the module and run TorchRec's planner.
# --------------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this child if the parent process goes away."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:  # noqa: BLE001 - best effort (non-Linux)
        pass
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def _parse_request(req: Any) -> dict[str, Any]:
    if not isinstance(req, dict):
        raise RequestError("request is not a JSON object")
    topo = req.get("topology")
    if not isinstance(topo, dict) or topo.get("world_size") is None:
        raise RequestError("request.topology.world_size is required")
    tables = req.get("tables")
    if not isinstance(tables, list) or not tables:
        raise RequestError("request.tables must be a non-empty list")
    world_size = int(topo["world_size"])
    out_topo = {
        "world_size": world_size,
        "local_world_size": int(topo.get("local_world_size") or world_size),
        "compute_device": str(topo.get("compute_device") or "cuda"),
        "hbm_bytes": int(
            topo["hbm_bytes"] if topo.get("hbm_bytes") is not None else DEFAULT_HBM_BYTES
        ),
        "ddr_bytes": int(
            topo["ddr_bytes"] if topo.get("ddr_bytes") is not None else DEFAULT_DDR_BYTES
        ),
    }
    out_tables = []
    seen: set[str] = set()
    for i, t in enumerate(tables):
        if not isinstance(t, dict):
            raise RequestError(f"tables[{i}] is not an object")
        for key in ("name", "num_embeddings", "embedding_dim"):
            if t.get(key) is None:
                raise RequestError(f"tables[{i}]: missing '{key}'")
        name = str(t["name"])
        if name in seen:
            raise RequestError(f"duplicate table name {name!r}")
        seen.add(name)
        feature_names = [str(f) for f in (t.get("feature_names") or [name])]
        pfs = t.get("pooling_factors")
        if pfs is None:
            pfs = [1.0] * len(feature_names)
        pfs = [float(x) for x in pfs]
        if len(pfs) != len(feature_names):
            raise RequestError(
                f"table {name!r}: {len(pfs)} pooling_factors for {len(feature_names)} features"
            )
        bss = t.get("batch_sizes")
        if bss is not None:
            bss = [int(x) for x in bss]
            if len(bss) != len(feature_names):
                raise RequestError(
                    f"table {name!r}: {len(bss)} batch_sizes for {len(feature_names)} features"
                )
        out_tables.append(
            {
                "name": name,
                "num_embeddings": int(t["num_embeddings"]),
                "embedding_dim": int(t["embedding_dim"]),
                "feature_names": feature_names,
                "pooling": str(t.get("pooling") or "sum").lower(),
                "pooling_factors": pfs,
                "batch_sizes": bss,
                "data_type": str(t.get("data_type") or "fp32").lower(),
                "is_weighted": bool(t.get("is_weighted", False)),
            }
        )
    return {
        "topology": out_topo,
        "batch_size": int(req.get("batch_size") or DEFAULT_BATCH_SIZE),
        "tables": out_tables,
    }


def _build(req: dict[str, Any]) -> tuple[Any, Any, Any, list[Any]]:
    """Returns (topology, constraints, module, sharders) for TorchRec."""
    import torch
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.types import ParameterConstraints, Topology
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

    data_types = {
        "fp32": DataType.FP32,
        "fp16": DataType.FP16,
        "bf16": DataType.BF16,
        "int8": DataType.INT8,
    }
    poolings = {"sum": PoolingType.SUM, "mean": PoolingType.MEAN}
    meta = torch.device("meta")

    t = req["topology"]
    topology = Topology(
        world_size=t["world_size"],
        local_world_size=t["local_world_size"],
        compute_device=t["compute_device"],
        hbm_cap=t["hbm_bytes"],
        ddr_cap=t["ddr_bytes"],
    )

    constraints: dict[str, Any] = {}
    pooled: dict[bool, list[Any]] = {False: [], True: []}  # is_weighted -> configs
    sequence: list[Any] = []
    for tb in req["tables"]:
        if tb["data_type"] not in data_types:
            raise RequestError(f"table {tb['name']!r}: unknown data_type {tb['data_type']!r}")
        pc_kwargs: dict[str, Any] = {"pooling_factors": list(tb["pooling_factors"])}
        if tb["batch_sizes"] is not None:
            pc_kwargs["batch_sizes"] = list(tb["batch_sizes"])
        if tb["is_weighted"]:
            pc_kwargs["is_weighted"] = True
        constraints[tb["name"]] = ParameterConstraints(**pc_kwargs)
        if tb["pooling"] == "none":
            sequence.append(
                EmbeddingConfig(
                    num_embeddings=tb["num_embeddings"],
                    embedding_dim=tb["embedding_dim"],
                    name=tb["name"],
                    feature_names=tb["feature_names"],
                    data_type=data_types[tb["data_type"]],
                )
            )
            continue
        if tb["pooling"] not in poolings:
            raise RequestError(f"table {tb['name']!r}: unknown pooling {tb['pooling']!r}")
        pooled[tb["is_weighted"]].append(
            EmbeddingBagConfig(
                num_embeddings=tb["num_embeddings"],
                embedding_dim=tb["embedding_dim"],
                name=tb["name"],
                feature_names=tb["feature_names"],
                pooling=poolings[tb["pooling"]],
                data_type=data_types[tb["data_type"]],
            )
        )

    submodules: dict[str, Any] = {}
    for weighted, cfgs in pooled.items():
        if cfgs:
            key = "ebc_weighted" if weighted else "ebc"
            submodules[key] = EmbeddingBagCollection(tables=cfgs, is_weighted=weighted, device=meta)
    if sequence:
        submodules["ec"] = EmbeddingCollection(tables=sequence, device=meta)

    sharders: list[Any] = []
    if pooled[False] or pooled[True]:
        sharders.append(EmbeddingBagCollectionSharder())
    if sequence:
        sharders.append(EmbeddingCollectionSharder())

    if len(submodules) == 1 and "ebc" in submodules:
        module = submodules["ebc"]  # the common case: exactly one plain EBC
    else:
        module = torch.nn.Module()
        for key, sub in submodules.items():
            module.add_module(key, sub)
    return topology, constraints, module, sharders


def _rank_of(placement: Any) -> int:
    rank = getattr(placement, "rank", None)
    if callable(rank):
        try:
            r = rank()
            if r is not None:
                return int(r)
        except Exception:  # noqa: BLE001
            pass
    m = re.search(r"rank:(\d+)", str(placement))
    if not m:
        raise RuntimeError(f"cannot parse rank from placement {placement!r}")
    return int(m.group(1))


def _describe_reservation(res: Any) -> tuple[str, dict[str, Any]]:
    params: dict[str, Any] = {}
    for attr, key in (
        ("_percentage", "percentage"),
        ("_parameter_multiplier", "parameter_multiplier"),
        ("_dense_tensor_estimate", "dense_tensor_estimate"),
        ("_hbm_reserved_bytes", "hbm_reserved_bytes"),
    ):
        if hasattr(res, attr):
            params[key] = getattr(res, attr)
    text = f"{type(res).__name__}(" + ", ".join(f"{k}={v!r}" for k, v in params.items()) + ")"
    detail: dict[str, Any] = {"class": type(res).__name__, **params}
    for attr, key in (("_dense_storage", "dense_storage"), ("_kjt_storage", "kjt_storage")):
        st = getattr(res, attr, None)
        if st is not None:
            detail[f"{key}_hbm_bytes"] = int(st.hbm)
            detail[f"{key}_ddr_bytes"] = int(st.ddr)
    try:
        reserved = res.last_reserved_topology
    except Exception:  # noqa: BLE001
        reserved = None
    if reserved is not None:
        detail["usable_hbm_bytes_per_rank"] = [int(d.storage.hbm) for d in reserved.devices]
        detail["usable_ddr_bytes_per_rank"] = [int(d.storage.ddr) for d in reserved.devices]
    return text, detail


def _finite(x: float) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def _child_plan(req_raw: Any, status_fd: int) -> dict[str, Any]:
    import logging

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)

    from torchrec.distributed.planner import EmbeddingShardingPlanner

    req = _parse_request(req_raw)
    topology, constraints, module, sharders = _build(req)
    planner = EmbeddingShardingPlanner(
        topology=topology, batch_size=req["batch_size"], constraints=constraints
    )
    reservation_text, reservation_detail = _describe_reservation(planner._storage_reservation)

    # Tell the parent that plan() starts now: the time cap counts from here.
    os.write(status_fd, b"S")
    os.close(status_fd)
    t0 = time.perf_counter()
    try:
        plan = planner.plan(module, sharders=sharders)
    except Exception as exc:  # noqa: BLE001 - PlannerError and anything else
        wall = time.perf_counter() - t0
        _, reservation_detail = _describe_reservation(planner._storage_reservation)
        return {
            "status": "error",
            "error": _error_text(exc),
            "error_type": type(exc).__name__,
            "wall_time_s": wall,
            "storage_reservation": reservation_text,
            "storage_reservation_detail": reservation_detail,
        }
    wall = time.perf_counter() - t0
    _, reservation_detail = _describe_reservation(planner._storage_reservation)

    world_size = req["topology"]["world_size"]
    tables: dict[str, Any] = {}
    for _path, module_plan in plan.plan.items():
        for name, ps in module_plan.items():
            st = str(ps.sharding_type)
            shards: list[dict[str, Any]] = []
            if ps.sharding_spec is None:  # data_parallel: a full replica on every rank
                cfg = next(tb for tb in req["tables"] if tb["name"] == name)
                full = [cfg["num_embeddings"], cfg["embedding_dim"]]
                for r in ps.ranks or list(range(world_size)):
                    shards.append({"offsets": [0, 0], "sizes": list(full), "rank": int(r)})
            else:
                for sm in ps.sharding_spec.shards:
                    shards.append(
                        {
                            "offsets": [int(v) for v in sm.shard_offsets],
                            "sizes": [int(v) for v in sm.shard_sizes],
                            "rank": _rank_of(sm.placement),
                        }
                    )
            clf = None
            if ps.cache_params is not None and ps.cache_params.load_factor is not None:
                clf = float(ps.cache_params.load_factor)
            tables[name] = {
                "sharding_type": st,
                "compute_kernel": str(ps.compute_kernel),
                "ranks": [int(r) for r in (ps.ranks or [])],
                "shards": shards,
                "cache_load_factor": clf,
            }

    perf = [0.0] * world_size
    hbm = [0] * world_size
    ddr = [0] * world_size
    rating = None
    best = planner._best_plan
    if best:
        for so in best:
            for sh in so.shards:
                r = int(sh.rank)
                perf[r] += float(sh.perf.total)
                hbm[r] += int(sh.storage.hbm)
                ddr[r] += int(sh.storage.ddr)
        rating = _finite(planner._perf_model.rate(plan=best))

    sharding_type_counts: dict[str, int] = {}
    for v in tables.values():
        st_name = v["sharding_type"]
        sharding_type_counts[st_name] = sharding_type_counts.get(st_name, 0) + 1
    return {
        "status": "ok",
        "wall_time_s": wall,
        "tables": tables,
        "rating": rating,
        "rating_model": type(planner._perf_model).__name__,
        "per_rank_perf_total": [_finite(x) for x in perf],
        "per_rank_hbm_bytes": hbm,
        "per_rank_ddr_bytes": ddr,
        "storage_reservation": reservation_text,
        "storage_reservation_detail": reservation_detail,
        "num_proposals": int(planner._num_proposals),
        "num_plans": int(planner._num_plans),
        "sharding_type_counts": sharding_type_counts,
    }


def _child_main(request_path: str, result_path: str, status_fd: int) -> int:
    _die_with_parent()
    # Anything printed (Python or C level) goes to stderr; the result goes to a file.
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        with open(request_path, encoding="utf-8") as fh:
            req_raw = json.load(fh)
        result = _child_plan(req_raw, status_fd)
    except Exception as exc:  # noqa: BLE001 - request/setup errors
        result = {"status": "error", "error": _error_text(exc), "wall_time_s": None}
    tmp = result_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(result, fh, allow_nan=False)
    os.replace(tmp, result_path)
    return 0


# --------------------------------------------------------------------------------------
# Parent: spawn, enforce the cap, print the result.
# --------------------------------------------------------------------------------------


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def _run_parent(request_path: str, time_cap: float, setup_timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="trec_planner_ref_") as tmpdir:
        req_file = os.path.join(tmpdir, "request.json")
        res_file = os.path.join(tmpdir, "result.json")
        # Read (and copy) the request here so that "-" (stdin) works and bad JSON fails fast.
        if request_path == "-":
            raw = sys.stdin.read()
        else:
            with open(request_path, encoding="utf-8") as fh:
                raw = fh.read()
        try:
            json.loads(raw)
        except json.JSONDecodeError as exc:
            return {"status": "error", "error": _error_text(exc), "wall_time_s": None}
        with open(req_file, "w", encoding="utf-8") as fh:
            fh.write(raw)

        r_fd, w_fd = os.pipe()
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            CHILD_FLAG,
            req_file,
            res_file,
            str(w_fd),
        ]
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=sys.stderr.fileno(),
            stderr=sys.stderr.fileno(),
            pass_fds=(w_fd,),
            start_new_session=True,  # own process group: killpg takes everything
        )
        os.close(w_fd)
        try:
            # Phase 1: imports + module build, until the child signals "plan() starts".
            started = False
            deadline = time.monotonic() + setup_timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                ready, _, _ = select.select([r_fd], [], [], left)
                if ready:
                    started = os.read(r_fd, 1) == b"S"  # b"" = child closed it / died
                    break
            os.close(r_fd)
            r_fd = -1
            # Phase 2: plan(), capped. (Not started = the child failed or exited during
            # setup and is writing its error result; give it the rest of the setup bound.)
            wait_s = time_cap if started else max(1.0, deadline - time.monotonic())
            try:
                proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                if started:
                    return {"status": "did_not_finish", "time_cap_s": time_cap}
                return {
                    "status": "error",
                    "error": f"setup (imports + module build) exceeded {setup_timeout:g} s",
                    "wall_time_s": None,
                }
            # The child is gone; clear any grandchildren it may have left in its group.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        except BaseException:
            _kill_group(proc)
            raise
        finally:
            if r_fd >= 0:
                os.close(r_fd)

        if not os.path.exists(res_file):
            return {
                "status": "error",
                "error": f"planner child exited with code {proc.returncode} without a result",
                "wall_time_s": None,
            }
        with open(res_file, encoding="utf-8") as fh:
            return json.load(fh)


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[1] == CHILD_FLAG:
        return _child_main(argv[2], argv[3], int(argv[4]))

    ap = argparse.ArgumentParser(
        description="Run TorchRec's default EmbeddingShardingPlanner on a shardplan PlanRequest."
    )
    ap.add_argument("request", help="PlanRequest JSON file ('-' for stdin)")
    ap.add_argument(
        "--time-cap",
        type=float,
        default=DEFAULT_TIME_CAP_S,
        help="seconds plan() may run before the child is killed (default %(default)s)",
    )
    ap.add_argument(
        "--setup-timeout",
        type=float,
        default=DEFAULT_SETUP_TIMEOUT_S,
        help="seconds allowed for imports + module build before plan() (default %(default)s)",
    )
    args = ap.parse_args(argv[1:])
    if not (args.time_cap > 0 and math.isfinite(args.time_cap)):
        ap.error("--time-cap must be a positive number")
    if not (args.setup_timeout > 0 and math.isfinite(args.setup_timeout)):
        ap.error("--setup-timeout must be a positive number")

    # SIGTERM/SIGHUP -> SystemExit, so the finally/except above kills the child group.
    def _on_signal(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)

    result = _run_parent(args.request, args.time_cap, args.setup_timeout)
    _emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
