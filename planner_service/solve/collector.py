"""Pausing Python's cyclic garbage collector while a stage builds many acyclic values.

Preparing thousands of distinct table shapes allocates hundreds of thousands of small
values (options, shard estimates, cost arrays) that hold no reference cycles, so the
collector frees nothing among them; its full passes, triggered by the allocations
themselves, walk the whole growing heap each time: on 5,384 distinct shapes on 1,024
ranks, about half of enumerating the options and of the simple bounds (issue 37). A whole
solve (``pipeline.solve``) runs with it paused: the prepared problem's values live until
the answer, and a pass over them while the plan was sealed broke the time limit. Reference
counting still frees everything as usual while the collector is paused; cycles made
meanwhile wait for its next pass.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_paused = 0  # stages (in any thread) inside ``paused_collector``
_resume = False  # whether the collector ran before the first of them paused it


@contextmanager
def paused_collector() -> Iterator[None]:
    """Run the block with the cyclic collector off; it resumes when the last block (of
    any thread) leaves, if it was on when the first entered."""
    global _paused, _resume
    with _lock:
        if _paused == 0:
            _resume = gc.isenabled()
            gc.disable()
        _paused += 1
    try:
        yield
    finally:
        with _lock:
            _paused -= 1
            if _paused == 0 and _resume:
                gc.enable()
