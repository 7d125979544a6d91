"""A pool of SSH hosts as one machine for jobs: GPUs, CPUs and memory, a fair queue, holdings.

The job server (``tlaunch server --pool pool.yaml``) keeps the pool; this
package is its core, pure and unit-tested, plus the probe that asks hosts
what they have::

    pool.yaml ──▶ config.PoolConfig ──┐     probe (SSH: nproc, memory, nvidia-smi)
                                      ▼              │ HostFacts, or why it did not answer
                          resources.Host (up/down) ◀─┘
                                      │
    waiting jobs (queue.Waiting) ──▶ queue.schedule(hosts, holdings, waiting, limits)
                                      │   fair order ▸ placement.place (gang, best fit,
                                      │   contiguous GPUs) ▸ reservation for the first
                                      │   job that waits (backfill never delays it)
                                      ▼
                          queue.Round: starts (placements to hold, then start)
                                       waits (position, reasons.waiting_reason)
                                      │
                          holdings.Holdings: a GPU or CPU held by one job at most;
                                       released host by host as a job's processes go

:func:`~tlaunch.pool.reasons.never_fits` is the server's 400 for a job that asks
for more than the pool has.
"""

from tlaunch.pool.config import HostDecl, PoolConfig, load_pool, parse_pool
from tlaunch.pool.errors import HoldingConflict, NeverFits, PoolConfigError, PoolError
from tlaunch.pool.holdings import Free, Held, Holdings, free_view
from tlaunch.pool.placement import place
from tlaunch.pool.queue import Limits, Round, Start, Wait, Waiting, schedule
from tlaunch.pool.reasons import never_fits, waiting_reason
from tlaunch.pool.resources import Gpu, GpuProcess, Host, HostFacts, Placement, Request, Slot

__all__ = [
    "Free",
    "Gpu",
    "GpuProcess",
    "Held",
    "HoldingConflict",
    "Holdings",
    "Host",
    "HostDecl",
    "HostFacts",
    "Limits",
    "NeverFits",
    "Placement",
    "PoolConfig",
    "PoolConfigError",
    "PoolError",
    "Request",
    "Round",
    "Slot",
    "Start",
    "Wait",
    "Waiting",
    "free_view",
    "load_pool",
    "never_fits",
    "parse_pool",
    "place",
    "schedule",
    "waiting_reason",
]
