"""What every process the service starts does first: die with the process that started it,
however that one ends (SIGKILL, a crash, an OOM kill), so that no solver or CPU-lane
process outlives the service. Used by the solve pool (``solver/pool.py``), the CPU lane
(``cpu.py``) and the HTTP workers under a supervisor (``state.py``)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
PR_SET_NAME = 15
SOLVER_NAME = "shardplan-solve"  # at most 15 bytes: the kernel's limit for a thread name
CPU_WORKER_NAME = "shardplan-cpu"


def name_process(name: str) -> None:
    """Name this process as ``ps -o comm`` and /proc/PID/comm show it (Linux): a solver
    process and a CPU-lane worker are otherwise both ``python -c spawn_main``, and an
    operator (or a test) looking for the solver would count the lane's decoders too."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl.argtypes = [ctypes.c_int, ctypes.c_char_p, *[ctypes.c_ulong] * 3]
        libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when the thread that started it ends (Linux),
    then check that its parent had not ended already: the request is not retroactive."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl.argtypes = [ctypes.c_int, *[ctypes.c_ulong] * 4]
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    if os.getppid() != parent_pid:
        os._exit(1)  # orphaned before the request took effect
