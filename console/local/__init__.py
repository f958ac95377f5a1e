"""crawlq's processes run on this machine, for ``crawlq demo`` and ``crawlq run``: the
children started and always stopped, the progress line (`processes`), the consumers' logs
as those commands show them (`logs`)."""
