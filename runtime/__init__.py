"""shardplan's execution runtime: apply a plan to pooled and sequence embedding tables with
FBGEMM's table-batched kernels and torch.distributed collectives (see docs/runtime.md)."""

from runtime.checkpoint import (
    CheckpointError,
    CheckpointManifest,
    load_checkpoint,
    save_checkpoint,
)
from runtime.comm import SubgroupTimeoutError
from runtime.modules import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
)
from runtime.pipeline import PipelineBatchError, PipelineTimeoutError, TrainPipelineSparseDist
from runtime.plan import (
    ModulePlan,
    PlanMismatchError,
    check_plan,
    column_wise,
    construct_module_plan,
    data_parallel,
    row_wise,
    table_column_wise,
    table_row_wise,
    table_wise,
)
from runtime.reshard import Resharded, reshard
from runtime.sharding.module import (
    ShardedEmbeddingBagCollection,
    ShardedEmbeddingCollection,
    apply_sharding_plan,
    shard_modules,
)
from runtime.sharding.weights import ShardedWeight
from runtime.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor
from runtime.startup import PlanLoadError, load_plan

__all__ = [
    "CheckpointError",
    "CheckpointManifest",
    "EmbeddingBagCollection",
    "EmbeddingBagConfig",
    "EmbeddingCollection",
    "EmbeddingConfig",
    "JaggedTensor",
    "KeyedJaggedTensor",
    "KeyedTensor",
    "ModulePlan",
    "PipelineBatchError",
    "PipelineTimeoutError",
    "PlanLoadError",
    "PlanMismatchError",
    "Resharded",
    "ShardedEmbeddingBagCollection",
    "ShardedEmbeddingCollection",
    "ShardedWeight",
    "SubgroupTimeoutError",
    "TrainPipelineSparseDist",
    "apply_sharding_plan",
    "check_plan",
    "column_wise",
    "construct_module_plan",
    "data_parallel",
    "load_checkpoint",
    "load_plan",
    "reshard",
    "row_wise",
    "save_checkpoint",
    "shard_modules",
    "table_column_wise",
    "table_row_wise",
    "table_wise",
]
