"""The unsharded module: ``EmbeddingBagCollection`` of pooled embedding tables.

It is the reference the sharded module must reproduce, and what a training script builds
before sharding (on the ``meta`` device, so nothing is allocated until the plan says where).
Pooling ``sum`` adds each bag's rows (times their per-id weights for weighted tables);
``mean`` divides that sum by the number of ids in the bag; an empty bag pools to zeros.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from planner_service.plan.types import DataType, PoolingType, Table
from runtime.sparse import KeyedJaggedTensor, KeyedTensor

TORCH_DTYPES = {
    DataType.FP32: torch.float32,
    DataType.FP16: torch.float16,
    DataType.BF16: torch.bfloat16,
}


def check_table_name(name: str) -> None:
    """Refuse a name the state dict cannot key. A table's weight is
    ``embedding_bags.{name}.weight`` (TorchRec's key): torch refuses '.' in a module name,
    and ``embedding_bags.a.b.weight`` would not say which table it is. The planner accepts
    any non-empty name, so a dotted one stops here, before anything is allocated."""
    if name and "." not in name:
        return
    fix = f" (e.g. {name.replace('.', '_')!r})" if name.strip(".") else ""
    raise ValueError(
        f"table {name!r}: the runtime keys a table's weight as 'embedding_bags.<name>.weight', "
        f"so a table name must be non-empty and contain no '.'; rename the table in the "
        f"request and the module{fix}"
    )


@dataclass(frozen=True)
class EmbeddingBagConfig:
    """One pooled table (TorchRec's ``EmbeddingBagConfig``)."""

    name: str
    num_embeddings: int
    embedding_dim: int
    feature_names: list[str] = field(default_factory=list)
    pooling: PoolingType = PoolingType.SUM
    data_type: DataType = DataType.FP32
    is_weighted: bool = False

    def __post_init__(self) -> None:
        check_table_name(self.name)
        if not self.feature_names:
            object.__setattr__(self, "feature_names", [self.name])
        if self.num_embeddings <= 0 or self.embedding_dim <= 0:
            raise ValueError(
                f"table {self.name!r}: num_embeddings ({self.num_embeddings}) and "
                f"embedding_dim ({self.embedding_dim}) must be positive"
            )
        if self.pooling is PoolingType.NONE:
            raise ValueError(
                f"table {self.name!r} has pooling 'none'; an EmbeddingBagCollection pools "
                "(use 'sum' or 'mean')"
            )
        if self.data_type not in TORCH_DTYPES:
            raise ValueError(
                f"table {self.name!r} has data_type {self.data_type.value!r}; the runtime "
                f"trains {sorted(d.value for d in TORCH_DTYPES)}"
            )

    @staticmethod
    def from_table(table: Table) -> EmbeddingBagConfig:
        """From the planner's ``Table`` (the request the plan was made for)."""
        return EmbeddingBagConfig(
            name=table.name,
            num_embeddings=table.num_embeddings,
            embedding_dim=table.embedding_dim,
            feature_names=list(table.feature_names),
            pooling=table.pooling,
            data_type=table.data_type,
            is_weighted=table.is_weighted,
        )

    @property
    def dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.data_type]


class TableModules(nn.ModuleDict):
    """Modules keyed by table name, under any name the state dict can key.

    ``nn.Module.add_module`` refuses a name that is already an attribute, and the planner
    accepts tables called ``items``, ``keys``, ``train`` or ``to``. Torch finds children for
    ``state_dict``, ``load_state_dict``, ``named_parameters``, ``.to()`` and iteration in
    ``_modules``, never by attribute, so a table is registered there under its own name
    (``embedding_bags.items.weight``, TorchRec's key) and reached by ``[name]``;
    ``embedding_bags.items`` stays the method. Torch's other checks (a module, a non-empty
    name without '.') still apply. What resolves dotted paths by attribute
    (``get_submodule``, ``get_parameter``) cannot reach such a table."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dict__.get("_modules", ()):
            # The container's own attribute (``train()`` sets ``training``), not a table.
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def add_module(self, name: str, module: nn.Module | None) -> None:
        new = name not in self._modules
        if new:
            # A name already in _modules passes add_module's attribute check (torch's
            # _modules holds None for a child registered as None).
            self._modules[name] = None  # type: ignore[assignment]
        try:
            super().add_module(name, module)
        except BaseException:
            if new:
                del self._modules[name]
            raise


def check_tables(tables: Sequence[EmbeddingBagConfig]) -> None:
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        raise ValueError(f"table names must be unique; got {names}")
    features = [f for t in tables for f in t.feature_names]
    repeated = sorted({f for f in features if features.count(f) > 1})
    if repeated:
        raise ValueError(f"features {repeated} are looked up by more than one table")


def pool(
    weight: torch.Tensor,
    ids: torch.Tensor,
    offsets: torch.Tensor,
    per_id_weights: torch.Tensor | None,
    pooling: PoolingType,
) -> torch.Tensor:
    """Pooled rows of ``weight`` for each bag (sum, or sum / bag length for mean)."""
    pooled = nn.functional.embedding_bag(
        ids,
        weight,
        offsets,
        mode="sum",
        per_sample_weights=per_id_weights,
        include_last_offset=True,
    )
    if pooling is PoolingType.MEAN:
        lengths = (offsets[1:] - offsets[:-1]).clamp(min=1).to(pooled.dtype)
        pooled = pooled / lengths.unsqueeze(1)
    return pooled


class EmbeddingBagCollection(nn.Module):
    """Pooled embedding tables; ``forward(kjt)`` gives a ``KeyedTensor`` keyed by feature,
    in table order then feature order, like TorchRec's."""

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        device: torch.device | str | None = None,
        *,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        check_tables(tables)
        self._tables = list(tables)
        self.embedding_bags = TableModules()
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        for table in self._tables:
            bag = nn.EmbeddingBag(
                table.num_embeddings,
                table.embedding_dim,
                mode="sum",
                device=device,
                dtype=table.dtype,
                _weight=None,
            )
            if bag.weight.device.type != "meta":
                bound = math.sqrt(1.0 / table.num_embeddings)
                with torch.no_grad():
                    bag.weight.uniform_(-bound, bound, generator=generator)
            self.embedding_bags[table.name] = bag

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return list(self._tables)

    def table_weight(self, name: str) -> torch.Tensor:
        bag = self.embedding_bags[name]
        assert isinstance(bag, nn.EmbeddingBag)
        return bag.weight

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        jts = features.to_dict()
        keys, dims, pooled = [], [], []
        for table in self._tables:
            weight = self.table_weight(table.name)
            for name in table.feature_names:
                if name not in jts:
                    raise KeyError(f"feature {name!r} of table {table.name!r} is not in the input")
                jt = jts[name]
                per_id = None
                if table.is_weighted:
                    if jt.weights_or_none() is None:
                        raise ValueError(
                            f"table {table.name!r} is weighted; the input has no weights"
                        )
                    per_id = jt.weights().to(weight.dtype)
                pooled.append(pool(weight, jt.values(), jt.offsets(), per_id, table.pooling))
                keys.append(name)
                dims.append(table.embedding_dim)
        return KeyedTensor(keys, dims, torch.cat(pooled, dim=1))
