"""What a crawl carries: `task` (the task model and its wire format), `request` (a request
as data: URL, method, headers, label, unique key), `headers` (request headers checked,
credentials kept apart), `items` (keyed items a spider extracts) and `pgtarget` (the
PostgreSQL tables the items go to).
"""

from common.tasks.headers import (
    DEFAULT_USER_AGENT,
    checked_headers,
    is_credential,
    parse_header_lines,
    redacted_headers,
)
from common.tasks.items import Item, check_item_type, item_key, unique_key_of
from common.tasks.pgtarget import DEFAULT_TABLE, PostgresTarget, is_postgres_url, sink_problem
from common.tasks.request import (
    BODYLESS,
    MAX_BODY_BYTES,
    Request,
    check_data,
    check_label,
    check_method,
    check_request,
    check_session,
    request_from_dict,
    request_key,
    shown,
)
from common.tasks.task import (
    DEFAULT_MAX_ATTEMPTS,
    Task,
    compact_tail,
    decode_entry,
    encode_entry,
    entry_url,
    is_task_id,
    queued_id,
    stored_entry,
)

__all__ = [
    "BODYLESS",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_TABLE",
    "DEFAULT_USER_AGENT",
    "MAX_BODY_BYTES",
    "Item",
    "PostgresTarget",
    "Request",
    "Task",
    "check_data",
    "check_item_type",
    "check_label",
    "check_method",
    "check_request",
    "check_session",
    "checked_headers",
    "compact_tail",
    "decode_entry",
    "encode_entry",
    "entry_url",
    "is_credential",
    "is_postgres_url",
    "is_task_id",
    "item_key",
    "parse_header_lines",
    "queued_id",
    "redacted_headers",
    "request_from_dict",
    "request_key",
    "shown",
    "sink_problem",
    "stored_entry",
    "unique_key_of",
]
