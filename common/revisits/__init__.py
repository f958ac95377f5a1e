"""A URL's visits as the revisit schedule keeps them: `previous` (`Revisit`: what a
recrawl carries of the previous visit, its validators and digest) and `record` (a done
URL's history record, the binary form ``common/lua/lib/revisits.lua`` writes).
"""

from common.revisits.previous import MAX_VALIDATOR_BYTES, Observed, Revisit
from common.revisits.record import (
    HistoryRecord,
    decode_record,
    history_field,
    record_entry,
    record_fetched,
    record_host,
)

__all__ = [
    "MAX_VALIDATOR_BYTES",
    "HistoryRecord",
    "Observed",
    "Revisit",
    "decode_record",
    "history_field",
    "record_entry",
    "record_fetched",
    "record_host",
]
