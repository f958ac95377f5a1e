"""The frontier's hosts table as ``crawlq hosts`` and the dashboard sort it: by an
indexed column (``common.frontier.hosts.SORT_COLUMNS``), and why not by another."""

from __future__ import annotations

from common.frontier.hosts import SORT_COLUMNS

#: Columns the hosts table shows but can't be sorted by: no index keeps them, only the
#: host records, so a sort would read every host.
UNSORTED_COLUMNS = ("in_flight", "done", "last_request")


def sort_refusal(column: str) -> str:
    """Why the hosts can't be listed sorted by `column` (not one of SORT_COLUMNS)."""
    sortable = ", ".join(SORT_COLUMNS)
    if column in UNSORTED_COLUMNS:
        return (f"hosts can't be sorted by {column}: it is shown, but only {sortable} "
                "are indexed")
    return f"unknown sort column {column[:40]!r}: one of {sortable}"
