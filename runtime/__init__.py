"""shardplan's execution runtime: apply a plan to pooled and sequence embedding tables with
FBGEMM's table-batched kernels and torch.distributed collectives (see docs/runtime.md).

Everything a training script names is importable from here: the unsharded modules and their
configs, with the enums a config and ``fused_params`` take (``DataType``, ``PoolingType``,
``OptimizerType``); the plan builders with theirs (``ShardingType``, ``ComputeKernel``); the
sharded modules; checkpoints, resharding, ``full_state`` and the pipeline.
"""

from planner_service.plan.types import (
    ComputeKernel,
    DataType,
    OptimizerType,
    ParameterSharding,
    PoolingType,
    ShardingPlan,
    ShardingType,
)
from runtime.checkpoint import (
    CheckpointError,
    CheckpointManifest,
    load_checkpoint,
    save_checkpoint,
)
from runtime.comm import SubgroupTimeoutError
from runtime.export import full_state
from runtime.modules import (
    BaseEmbeddingConfig,
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    config_of,
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
    "BaseEmbeddingConfig",
    "CheckpointError",
    "CheckpointManifest",
    "ComputeKernel",
    "DataType",
    "EmbeddingBagCollection",
    "EmbeddingBagConfig",
    "EmbeddingCollection",
    "EmbeddingConfig",
    "JaggedTensor",
    "KeyedJaggedTensor",
    "KeyedTensor",
    "ModulePlan",
    "OptimizerType",
    "ParameterSharding",
    "PipelineBatchError",
    "PipelineTimeoutError",
    "PlanLoadError",
    "PlanMismatchError",
    "PoolingType",
    "Resharded",
    "ShardedEmbeddingBagCollection",
    "ShardedEmbeddingCollection",
    "ShardedWeight",
    "ShardingPlan",
    "ShardingType",
    "SubgroupTimeoutError",
    "TrainPipelineSparseDist",
    "apply_sharding_plan",
    "check_plan",
    "column_wise",
    "config_of",
    "construct_module_plan",
    "data_parallel",
    "full_state",
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
