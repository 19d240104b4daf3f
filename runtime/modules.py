"""The unsharded modules: ``EmbeddingBagCollection`` of pooled tables and
``EmbeddingCollection`` of sequence (unpooled) tables.

They are the references the sharded modules must reproduce, and what a training script
builds before sharding (on the ``meta`` device, so nothing is allocated until the plan says
where). Pooling ``sum`` adds each bag's rows (times their per-id weights for weighted
tables); ``mean`` divides that sum by the number of ids in the bag; an empty bag pools to
zeros. A sequence table gives one row per id instead, as a ``JaggedTensor`` with the input's
lengths.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

import torch
from torch import nn

from planner_service.plan.types import DataType, PoolingType, Table
from runtime.choices import choice
from runtime.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor

TORCH_DTYPES = {
    DataType.FP32: torch.float32,
    DataType.FP16: torch.float16,
    DataType.BF16: torch.bfloat16,
}
POOLED = (PoolingType.SUM, PoolingType.MEAN)  # an EmbeddingBagConfig's pooling


def check_table_name(name: str, prefix: str = "embedding_bags") -> None:
    """Refuse a name the state dict cannot key. A table's weight is
    ``{prefix}.{name}.weight`` (TorchRec's key): torch refuses '.' in a module name, and
    ``{prefix}.a.b.weight`` would not say which table it is. The planner accepts any
    non-empty name, so a dotted one stops here, before anything is allocated."""
    if name and "." not in name:
        return
    fix = f" (e.g. {name.replace('.', '_')!r})" if name.strip(".") else ""
    raise ValueError(
        f"table {name!r}: the runtime keys a table's weight as '{prefix}.<name>.weight', "
        f"so a table name must be non-empty and contain no '.'; rename the table in the "
        f"request and the module{fix}"
    )


@dataclass(frozen=True)
class BaseEmbeddingConfig:
    """What every table has (TorchRec's ``BaseEmbeddingConfig``); a table with no
    ``feature_names`` is looked up by one feature of its own name."""

    name: str
    num_embeddings: int
    embedding_dim: int
    feature_names: list[str] = field(default_factory=list)
    data_type: DataType = field(default=DataType.FP32, kw_only=True)

    # The module attribute its weight is under: ``{state_prefix}.{name}.weight``.
    state_prefix: ClassVar[str] = "embedding_bags"

    def __post_init__(self) -> None:
        check_table_name(self.name, self.state_prefix)
        self._coerce("data_type", DataType, tuple(TORCH_DTYPES))
        if isinstance(self.feature_names, str):
            raise ValueError(
                f"table {self.name!r}: feature_names {self.feature_names!r} is a string; give "
                f"a list of names ([{self.feature_names!r}])"
            )
        if not self.feature_names:
            object.__setattr__(self, "feature_names", [self.name])
        if self.num_embeddings <= 0 or self.embedding_dim <= 0:
            raise ValueError(
                f"table {self.name!r}: num_embeddings ({self.num_embeddings}) and "
                f"embedding_dim ({self.embedding_dim}) must be positive"
            )

    @property
    def dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.data_type]

    def _coerce(
        self, field_name: str, kind: type[StrEnum], accepted: Sequence[StrEnum] | None = None
    ) -> None:
        """Hold the member of ``kind`` that the field's member or string value names."""
        value = getattr(self, field_name)
        owner = f"table {self.name!r}"
        object.__setattr__(
            self, field_name, choice(kind, value, field_name, owner=owner, accepted=accepted)
        )


@dataclass(frozen=True)
class EmbeddingBagConfig(BaseEmbeddingConfig):
    """One pooled table (TorchRec's ``EmbeddingBagConfig``)."""

    pooling: PoolingType = field(default=PoolingType.SUM, kw_only=True)
    is_weighted: bool = field(default=False, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pooling == PoolingType.NONE:
            raise ValueError(
                f"table {self.name!r} has pooling 'none'; an EmbeddingBagCollection pools "
                "(use 'sum' or 'mean', or an EmbeddingConfig in an EmbeddingCollection)"
            )
        self._coerce("pooling", PoolingType, POOLED)
        if not isinstance(self.is_weighted, bool):
            raise ValueError(
                f"table {self.name!r}: is_weighted {self.is_weighted!r} is not supported; use "
                "True or False"
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


@dataclass(frozen=True)
class EmbeddingConfig(BaseEmbeddingConfig):
    """One sequence table (TorchRec's ``EmbeddingConfig``): a row per id, no pooling, no
    per-id weights. In a planning request it is a table with ``pooling: none``."""

    state_prefix: ClassVar[str] = "embeddings"

    @staticmethod
    def from_table(table: Table) -> EmbeddingConfig:
        """From the planner's ``Table``; it must be a sequence table (``pooling: none``)."""
        if table.pooling is not PoolingType.NONE:
            raise ValueError(
                f"table {table.name!r} has pooling {table.pooling.value!r}; an "
                "EmbeddingConfig is a sequence table (pooling 'none'): use EmbeddingBagConfig"
            )
        return EmbeddingConfig(
            name=table.name,
            num_embeddings=table.num_embeddings,
            embedding_dim=table.embedding_dim,
            feature_names=list(table.feature_names),
            data_type=table.data_type,
        )


def config_of(table: Table) -> EmbeddingBagConfig | EmbeddingConfig:
    """The runtime's table for a planner ``Table``: sequence when its pooling is 'none'."""
    if table.pooling is PoolingType.NONE:
        return EmbeddingConfig.from_table(table)
    return EmbeddingBagConfig.from_table(table)


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


def is_weighted(table: BaseEmbeddingConfig) -> bool:
    """Whether the table's features carry per-id weights (pooled tables only)."""
    return isinstance(table, EmbeddingBagConfig) and table.is_weighted


def check_tables(tables: Sequence[BaseEmbeddingConfig]) -> None:
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


def _initialised(
    layer: nn.Embedding | nn.EmbeddingBag, rows: int, generator: torch.Generator | None
):
    """``layer`` with its weight drawn uniform in +-sqrt(1/rows) (TorchRec's default); a
    layer on the meta device has no values to draw."""
    if layer.weight.device.type != "meta":
        bound = math.sqrt(1.0 / rows)
        with torch.no_grad():
            layer.weight.uniform_(-bound, bound, generator=generator)
    return layer


def _feature(
    jts: Mapping[str, JaggedTensor], name: str, table: BaseEmbeddingConfig
) -> JaggedTensor:
    if name not in jts:
        raise KeyError(f"feature {name!r} of table {table.name!r} is not in the input")
    return jts[name]


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
            )
            self.embedding_bags[table.name] = _initialised(bag, table.num_embeddings, generator)

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
                jt = _feature(jts, name, table)
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


class EmbeddingCollection(nn.Module):
    """Sequence (unpooled) embedding tables; ``forward(kjt)`` gives, per feature, a
    ``JaggedTensor`` of one ``embedding_dim`` row per id with the input's lengths, keyed in
    table order then feature order, like TorchRec's. Tables may differ in width."""

    def __init__(
        self,
        tables: Sequence[EmbeddingConfig],
        device: torch.device | str | None = None,
        *,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        check_tables(tables)
        for table in tables:
            if not isinstance(table, EmbeddingConfig):
                raise TypeError(
                    f"table {table.name!r} is a {type(table).__name__}; an EmbeddingCollection "
                    "holds EmbeddingConfig (sequence) tables"
                )
        self._tables = list(tables)
        self.embeddings = TableModules()
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        for table in self._tables:
            layer = nn.Embedding(
                table.num_embeddings, table.embedding_dim, device=device, dtype=table.dtype
            )
            self.embeddings[table.name] = _initialised(layer, table.num_embeddings, generator)

    def embedding_configs(self) -> list[EmbeddingConfig]:
        return list(self._tables)

    def table_weight(self, name: str) -> torch.Tensor:
        layer = self.embeddings[name]
        assert isinstance(layer, nn.Embedding)
        return layer.weight

    def forward(self, features: KeyedJaggedTensor) -> dict[str, JaggedTensor]:
        jts = features.to_dict()
        result = {}
        for table in self._tables:
            weight = self.table_weight(table.name)
            for name in table.feature_names:
                jt = _feature(jts, name, table)
                rows = nn.functional.embedding(jt.values(), weight)
                result[name] = JaggedTensor(rows, jt.lengths())
        return result
