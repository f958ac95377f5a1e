"""``crawlq run SPIDER``: one spider crawled end to end on this machine (`command`), and
the crawl the run owns: reset at its start, its items gathered and its exit code at its
end (`ownership`)."""
