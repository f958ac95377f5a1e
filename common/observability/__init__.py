"""What a process shows of itself: `logs` (one event a line, text or JSON) and `metrics`
(Prometheus metrics, each in a registry of its own).
"""

from common.observability.logs import setup_logging
from common.observability.metrics import LINK_FATES, NOT_FOLLOWED, Metrics

__all__ = ["LINK_FATES", "NOT_FOLLOWED", "Metrics", "setup_logging"]
