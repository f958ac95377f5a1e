"""What the fleet's processes share in Redis beside the queue, each independent of the
others (an import-linter contract): `wake` (wake-ups over pub/sub), `workers` (the worker
registry), `history` (snapshots of the crawl's summed counters, for rates and charts),
`locks` (token locks: robots.txt fetches, the producer's crawl lock).
"""

from common.fleet.locks import TokenLocks
from common.fleet.wake import WakeChannel
from common.fleet.workers import WorkerRegistry, read_workers

__all__ = ["TokenLocks", "WakeChannel", "WorkerRegistry", "read_workers"]
