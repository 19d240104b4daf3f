"""What each rank can hold for embedding tables after the reservation.

The reservation is ``hbm_headroom_fraction`` of the rank's primary memory (a margin for
fragmentation, allocator caches and estimate error, as TorchRec's 15% default) plus
``dense_bytes_per_rank`` (dense parameters, activations, optimizer state of the dense
model). It is taken from HBM on cuda and from DDR on cpu, where tables live.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner_service.types import ComputeDevice, Constraints, DeviceSpec, Topology


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


def usable_capacity(topology: Topology, constraints: Constraints) -> list[Capacity]:
    base = _usable(topology.device(0), topology.compute_device, constraints)
    capacities = [replace(base, rank=rank) for rank in range(topology.world_size)]
    for override in topology.rank_overrides:
        device = topology.device(override.rank)
        capacities[override.rank] = _usable(device, topology.compute_device, constraints)
    return capacities


def _usable(
    device: DeviceSpec, compute_device: ComputeDevice, constraints: Constraints
) -> Capacity:
    on_cuda = compute_device is ComputeDevice.CUDA
    primary = device.hbm_bytes if on_cuda else device.ddr_bytes
    headroom = int(primary * constraints.hbm_headroom_fraction)
    dense = min(constraints.dense_bytes_per_rank, primary - headroom)
    left = primary - headroom - dense
    if on_cuda:
        return Capacity(device.rank, left, device.ddr_bytes, headroom, dense)
    return Capacity(device.rank, 0, left, headroom, dense)
