"""Where a plan's bytes live: per compute kernel, the tables and their bytes in HBM and
in host memory (DDR), and the tables whose weights left HBM.

The bytes are recomputed from the shards and the request (``validate.usage``), as the
validator does, not read from what the plan says about itself. On cuda, ``fused_uvm``
keeps a table's weights in host memory and ``fused_uvm_caching`` keeps them there behind a
cache in HBM: both read rows over the host link, tens of times slower than HBM, so a check
calls them out. A cpu plan holds everything in DDR: there is no HBM to leave.
"""

from __future__ import annotations

from planner_service.plan.api import KernelPlacement, Placement, TableOutsideHbm
from planner_service.plan.types import ComputeDevice, ComputeKernel, PlanRequest, ShardingPlan
from planner_service.validate.usage import table_storage

# Kernels that keep weights in host memory (UVM), on cuda.
UVM_KERNELS = frozenset({ComputeKernel.FUSED_UVM, ComputeKernel.FUSED_UVM_CACHING})
_KERNEL_ORDER = {kernel: i for i, kernel in enumerate(ComputeKernel)}


def outside_hbm(request: PlanRequest, kernel: ComputeKernel) -> bool:
    """Whether tables on ``kernel`` keep their weights outside HBM on this topology."""
    return request.topology.compute_device is ComputeDevice.CUDA and kernel in UVM_KERNELS


def placement(request: PlanRequest, plan: ShardingPlan) -> Placement:
    """``plan``'s bytes per kernel and tier, and its tables outside HBM (most bytes first)."""
    storage = table_storage(request, plan.tables)
    kernels: dict[ComputeKernel, list[int]] = {}
    outside: list[TableOutsideHbm] = []
    for name, bytes_ in storage.items():
        kernel = plan.tables[name].compute_kernel
        totals = kernels.setdefault(kernel, [0, 0, 0])
        totals[0] += 1
        totals[1] += bytes_.hbm_bytes
        totals[2] += bytes_.ddr_bytes
        if outside_hbm(request, kernel):
            outside.append(
                TableOutsideHbm(
                    name=name,
                    compute_kernel=kernel,
                    hbm_bytes=bytes_.hbm_bytes,
                    ddr_bytes=bytes_.ddr_bytes,
                )
            )
    return Placement(
        kernels=[
            KernelPlacement(
                compute_kernel=kernel,
                tables=tables,
                hbm_bytes=hbm,
                ddr_bytes=ddr,
                outside_hbm=outside_hbm(request, kernel),
            )
            for kernel, (tables, hbm, ddr) in sorted(
                kernels.items(), key=lambda item: _KERNEL_ORDER[item[0]]
            )
        ],
        outside_hbm=sorted(outside, key=lambda t: (-t.ddr_bytes - t.hbm_bytes, t.name)),
    )
