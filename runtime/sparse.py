"""Sparse inputs and pooled outputs, named and shaped as in TorchRec.

- ``JaggedTensor``: one feature's ids for a batch: ``values`` and per-sample ``lengths``
  (and optional per-id ``weights``).
- ``KeyedJaggedTensor`` (KJT): several features sharing one batch. ``lengths`` is
  feature-major: the ``stride()`` (batch size) lengths of the first key, then the next.
- ``KeyedTensor``: pooled embeddings of several features side by side, ``values()`` of shape
  ``[batch, sum of dims]``.

Also the tensor helpers the containers and the sharded module share (offsets of bags,
indices built on the host).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import torch


def offsets_from_lengths(lengths: torch.Tensor) -> torch.Tensor:
    """``[0, l0, l0+l1, ...]``: where each bag starts in ``values`` (int64)."""
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths.to(torch.int64), dim=0, out=offsets[1:])
    return offsets


def segment_sums(lengths: torch.Tensor, bags: torch.Tensor) -> torch.Tensor:
    """The sums of consecutive runs of ``lengths``, run ``i`` being ``bags[i]`` entries long
    (the ids in each segment of bags)."""
    ends = offsets_from_lengths(lengths)
    run_ends = offsets_from_lengths(bags)
    return ends[run_ends[1:]] - ends[run_ends[:-1]]


def exclusive_cumsum(counts: torch.Tensor) -> torch.Tensor:
    """Where each run of ``counts`` starts: ``[0, c0, c0+c1, ...]`` without the total."""
    return offsets_from_lengths(counts)[:-1]


def index_tensor(
    data: Sequence[int], device: torch.device, dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    """An index (or, with ``torch.bool``, a mask) computed once on the host, on ``device``."""
    return torch.tensor(data, dtype=dtype, device=device)


def concat(tensors: list[torch.Tensor], dim: int = 0) -> torch.Tensor:
    """``torch.cat`` without the copy when there is one tensor."""
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=dim)


class _Jagged:
    """Ids cut into bags: ``values()``, ``lengths()``, optional per-id ``weights()`` and the
    bags' ``offsets()`` (TorchRec's accessors, shared by both jagged containers)."""

    _values: torch.Tensor
    _lengths: torch.Tensor
    _weights: torch.Tensor | None

    def values(self) -> torch.Tensor:
        return self._values

    def lengths(self) -> torch.Tensor:
        return self._lengths

    def weights(self) -> torch.Tensor:
        if self._weights is None:
            raise ValueError(f"this {type(self).__name__} has no weights")
        return self._weights

    def weights_or_none(self) -> torch.Tensor | None:
        return self._weights

    def offsets(self) -> torch.Tensor:
        return offsets_from_lengths(self._lengths)


class JaggedTensor(_Jagged):
    """One feature's ids for a batch."""

    def __init__(
        self, values: torch.Tensor, lengths: torch.Tensor, weights: torch.Tensor | None = None
    ) -> None:
        self._values, self._lengths, self._weights = values, lengths, weights

    def to_dense(self) -> list[torch.Tensor]:
        """The ids of each sample, one tensor per sample."""
        return list(torch.split(self._values, self._lengths.tolist()))


class KeyedJaggedTensor(_Jagged):
    """Ids of several features for one batch, feature-major (TorchRec's layout)."""

    def __init__(
        self,
        keys: Sequence[str],
        values: torch.Tensor,
        lengths: torch.Tensor,
        weights: torch.Tensor | None = None,
        stride: int | None = None,
    ) -> None:
        keys = list(keys)
        if len(set(keys)) != len(keys):
            raise ValueError(f"KeyedJaggedTensor keys must be unique; got {keys}")
        if values.dim() != 1 or lengths.dim() != 1:
            raise ValueError(
                "KeyedJaggedTensor values and lengths must be 1-D; got shapes "
                f"{tuple(values.shape)} and {tuple(lengths.shape)}"
            )
        if stride is None:
            if keys and lengths.numel() % len(keys):
                raise ValueError(
                    f"KeyedJaggedTensor has {lengths.numel()} lengths for {len(keys)} keys; "
                    "lengths must hold batch_size entries per key"
                )
            stride = lengths.numel() // len(keys) if keys else 0
        elif lengths.numel() != stride * len(keys):
            raise ValueError(
                f"KeyedJaggedTensor has {lengths.numel()} lengths; stride {stride} x "
                f"{len(keys)} keys needs {stride * len(keys)}"
            )
        if weights is not None and weights.shape != values.shape:
            raise ValueError(
                f"KeyedJaggedTensor weights have shape {tuple(weights.shape)}; they need one "
                f"weight per value, shape {tuple(values.shape)}"
            )
        self._keys = keys
        self._values = values
        self._lengths = lengths
        self._weights = weights
        self._stride = stride
        self._length_per_key: list[int] | None = None

    @staticmethod
    def from_lengths_sync(
        keys: Sequence[str],
        values: torch.Tensor,
        lengths: torch.Tensor,
        weights: torch.Tensor | None = None,
        stride: int | None = None,
    ) -> KeyedJaggedTensor:
        """Build and check now that ``lengths`` sum to the number of values."""
        kjt = KeyedJaggedTensor(keys, values, lengths, weights, stride)
        total = int(lengths.sum()) if lengths.numel() else 0
        if total != values.numel():
            raise ValueError(
                f"KeyedJaggedTensor lengths sum to {total} but there are {values.numel()} "
                "values; the lengths must sum to the number of values"
            )
        if lengths.numel() and int(lengths.min()) < 0:
            raise ValueError("KeyedJaggedTensor lengths must be >= 0")
        kjt.length_per_key()
        return kjt

    # ---- accessors (TorchRec's names)

    def keys(self) -> list[str]:
        return list(self._keys)

    def stride(self) -> int:
        return self._stride

    def length_per_key(self) -> list[int]:
        if self._length_per_key is None:
            if not self._keys:
                self._length_per_key = []
            else:
                per_key = self._lengths.view(len(self._keys), self._stride).sum(dim=1)
                self._length_per_key = [int(n) for n in per_key.tolist()]
        return self._length_per_key

    def offset_per_key(self) -> list[int]:
        return list(accumulate(self.length_per_key(), initial=0))

    def __getitem__(self, key: str) -> JaggedTensor:
        if key not in self._keys:
            raise KeyError(f"no key {key!r} in KeyedJaggedTensor with keys {self._keys}")
        i = self._keys.index(key)
        start, end = self.offset_per_key()[i : i + 2]
        lengths = self._lengths[i * self._stride : (i + 1) * self._stride]
        weights = None if self._weights is None else self._weights[start:end]
        return JaggedTensor(self._values[start:end], lengths, weights)

    def to_dict(self) -> dict[str, JaggedTensor]:
        return {key: self[key] for key in self._keys}

    # ---- reshaping

    def split(self, segments: Sequence[int]) -> list[KeyedJaggedTensor]:
        """Consecutive groups of ``segments[i]`` keys each (the sizes must sum to the keys)."""
        if sum(segments) != len(self._keys) or any(s < 0 for s in segments):
            raise ValueError(
                f"split segments {list(segments)} must be >= 0 and sum to the "
                f"{len(self._keys)} keys"
            )
        offsets = self.offset_per_key()
        result, key = [], 0
        for size in segments:
            start, end = offsets[key], offsets[key + size]
            result.append(
                KeyedJaggedTensor(
                    self._keys[key : key + size],
                    self._values[start:end],
                    self._lengths[key * self._stride : (key + size) * self._stride],
                    None if self._weights is None else self._weights[start:end],
                    stride=self._stride,
                )
            )
            key += size
        return result

    def permute(self, indices: Sequence[int]) -> KeyedJaggedTensor:
        """Keys in the order ``indices`` (positions into ``keys()``)."""
        if any(not 0 <= i < len(self._keys) for i in indices):
            raise ValueError(f"permute indices {list(indices)} must be in [0, {len(self._keys)})")
        features = self.to_dict()
        keys = [self._keys[i] for i in indices]
        jts = [features[k] for k in keys]
        weights = None
        if self._weights is not None:
            weights = torch.cat([jt.weights() for jt in jts if jt.weights_or_none() is not None])
        empty = self._values[:0]
        return KeyedJaggedTensor(
            keys,
            torch.cat([jt.values() for jt in jts]) if jts else empty,
            torch.cat([jt.lengths() for jt in jts]) if jts else self._lengths[:0],
            weights,
            stride=self._stride,
        )

    def to(self, device: torch.device | str) -> KeyedJaggedTensor:
        return KeyedJaggedTensor(
            self._keys,
            self._values.to(device),
            self._lengths.to(device),
            None if self._weights is None else self._weights.to(device),
            stride=self._stride,
        )

    def __repr__(self) -> str:
        return (
            f"KeyedJaggedTensor(keys={self._keys}, stride={self._stride}, "
            f"values={self._values.numel()}, weighted={self._weights is not None})"
        )


class KeyedTensor:
    """Pooled embeddings of several keys side by side: ``values()`` is ``[batch, sum dims]``."""

    def __init__(self, keys: Sequence[str], length_per_key: Sequence[int], values: torch.Tensor):
        if values.dim() != 2 or values.shape[1] != sum(length_per_key):
            raise ValueError(
                f"KeyedTensor values of shape {tuple(values.shape)} do not match dims "
                f"{list(length_per_key)} (need [batch, {sum(length_per_key)}])"
            )
        self._keys = list(keys)
        self._length_per_key = list(length_per_key)
        self._values = values

    def keys(self) -> list[str]:
        return list(self._keys)

    def values(self) -> torch.Tensor:
        return self._values

    def length_per_key(self) -> list[int]:
        return list(self._length_per_key)

    def offset_per_key(self) -> list[int]:
        return list(accumulate(self._length_per_key, initial=0))

    def __getitem__(self, key: str) -> torch.Tensor:
        i = self._keys.index(key)
        start, end = self.offset_per_key()[i : i + 2]
        return self._values[:, start:end]

    def to_dict(self) -> dict[str, torch.Tensor]:
        return {key: self[key] for key in self._keys}

    def __repr__(self) -> str:
        return f"KeyedTensor(keys={self._keys}, shape={tuple(self._values.shape)})"
