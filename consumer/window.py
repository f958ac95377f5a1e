"""The CPU window: how many unfinished leases this consumer's CPU keeps up with."""

from __future__ import annotations

#: Responses waiting for (or in) the handler past which the consumer leases nothing: its
#: CPU is the bottleneck, and leases it took would wait for it while another consumer of
#: the fleet could serve them (a host's slot comes back when the response is in).
MAX_HANDLING = 4
#: The fewest unfinished leases the CPU window allows.
MIN_WINDOW = 2


class CpuWindow:
    """Responses in the handler, and the window of unfinished leases they allow.

    The window shrinks by one for each response that finds MAX_HANDLING others waiting
    for the handler, grows by one for each that finds the handler idle. An I/O-bound
    consumer stays at its full room; a CPU-bound one holds only what it can handle, and
    its hosts' other slots go to the fleet.
    """

    def __init__(self, concurrency: int) -> None:
        self._full = 2 * concurrency
        self.size = float(self._full)
        self.handling = 0  # responses in the handler (or waiting for the CPU to run it)

    def enter(self) -> None:
        """A response goes to the handler: resize the window, count it."""
        if self.handling >= MAX_HANDLING:
            self.size = max(MIN_WINDOW, self.size - 1)
        elif not self.handling:
            self.size = min(self._full, self.size + 1)
        self.handling += 1

    def leave(self) -> None:
        """The handler is done with a response."""
        self.handling -= 1

    @property
    def cpu_bound(self) -> bool:
        """Whether what the consumer would lease now would wait here, not at the host."""
        return self.handling >= MAX_HANDLING
