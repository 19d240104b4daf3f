"""What each rank can hold for embedding tables after the reservation.

The reservation (``hbm_headroom_fraction`` of the rank's primary memory, then
``dense_bytes_per_rank``) is taken from HBM on cuda and from DDR on cpu, where tables live.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner_service.types import ComputeDevice, Constraints, DeviceSpec, Topology


@dataclass(frozen=True)
class Capacity:
    """Bytes a rank offers to embedding shards, per tier, and what was held back."""

    rank: int
    hbm_bytes: int
    ddr_bytes: int
    reserved_bytes: int


def usable_capacity(topology: Topology, constraints: Constraints) -> list[Capacity]:
    return [_usable(device, topology.compute_device, constraints) for device in topology.devices()]


def _usable(
    device: DeviceSpec, compute_device: ComputeDevice, constraints: Constraints
) -> Capacity:
    on_cuda = compute_device is ComputeDevice.CUDA
    primary = device.hbm_bytes if on_cuda else device.ddr_bytes
    reserved = min(
        primary,
        int(primary * constraints.hbm_headroom_fraction) + constraints.dense_bytes_per_rank,
    )
    if on_cuda:
        return Capacity(device.rank, device.hbm_bytes - reserved, device.ddr_bytes, reserved)
    return Capacity(device.rank, 0, device.ddr_bytes - reserved, reserved)
