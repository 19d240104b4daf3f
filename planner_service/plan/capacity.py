"""What each rank can hold for embedding tables after the reservation.

The reservation is ``hbm_headroom_fraction`` of the rank's primary memory (a margin for
fragmentation, allocator caches and estimate error, as TorchRec's 15% default) plus
``dense_bytes_per_rank`` (dense parameters, activations, optimizer state of the dense
model). It is taken from HBM on cuda and from DDR on cpu, where tables live.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner_service.plan.types import ComputeDevice, Constraints, Topology


@dataclass(frozen=True)
class Capacity:
    """Bytes a rank offers to embedding shards, per tier, and what was held back."""

    rank: int
    hbm_bytes: int
    ddr_bytes: int
    headroom_bytes: int
    dense_bytes: int

    @property
    def reserved_bytes(self) -> int:
        return self.headroom_bytes + self.dense_bytes


@dataclass(frozen=True)
class RankCapacities:
    """Every rank's capacity without an object per rank: the topology's, and the overridden
    ranks' own. Built and queried in time proportional to the overrides, not the world."""

    default: Capacity
    overridden: dict[int, Capacity]

    def of(self, rank: int) -> Capacity:
        found = self.overridden.get(rank)
        return found if found is not None else replace(self.default, rank=rank)


def rank_capacities(topology: Topology, constraints: Constraints) -> RankCapacities:
    hbm, ddr = topology.hbm_bytes or 0, topology.ddr_bytes
    device = topology.compute_device
    overridden = {
        o.rank: _usable(
            o.rank,
            hbm if o.hbm_bytes is None else o.hbm_bytes,
            ddr if o.ddr_bytes is None else o.ddr_bytes,
            device,
            constraints,
        )
        for o in topology.rank_overrides
    }
    return RankCapacities(_usable(0, hbm, ddr, device, constraints), overridden)


def usable_capacity(topology: Topology, constraints: Constraints) -> list[Capacity]:
    """Every rank's capacity, in rank order (the solver's per-rank arrays)."""
    capacities = rank_capacities(topology, constraints)
    return [capacities.of(rank) for rank in range(topology.world_size)]


def _usable(
    rank: int, hbm_bytes: int, ddr_bytes: int, device: ComputeDevice, constraints: Constraints
) -> Capacity:
    on_cuda = device is ComputeDevice.CUDA
    primary = hbm_bytes if on_cuda else ddr_bytes
    headroom = int(primary * constraints.hbm_headroom_fraction)
    dense = min(constraints.dense_bytes_per_rank, primary - headroom)
    left = primary - headroom - dense
    if on_cuda:
        return Capacity(rank, left, ddr_bytes, headroom, dense)
    return Capacity(rank, 0, left, headroom, dense)
