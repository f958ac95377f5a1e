"use strict";
// The crawls page: every crawl in this Redis, refreshed every 2 s from GET /api/crawls.

(() => {
  const { el, replace, fmt, table } = dash;
  const body = document.querySelector("#crawls .body");
  const STATES = ["pending", "leased", "waiting", "dead", "done"];

  function row(c) {
    // The link is built from the name through encodeURIComponent, under /crawls/.
    const link = el("a", { href: `/crawls/${encodeURIComponent(c.crawl)}`, class: "crawl-link" }, c.crawl);
    if (c.broken) {
      return el("tr", { class: "broken" }, el("td", null, link),
        el("td", { colspan: 10 }, "no settings: partly deleted? crawlq reset removes it"));
    }
    const rates = c.rates || {};
    return el("tr", { "data-crawl": c.crawl, class: c.paused ? "paused" : null },
      el("td", null, link, c.paused ? el("span", { class: "badge warn", title: "consumers lease nothing until it is resumed" }, "paused") : null),
      el("td", { class: "num" }, c.settings.partitions),
      el("td", null, c.settings.dedup),
      STATES.map((s) => el("td", { class: `num state-${s}` }, fmt.int(c.states[s]))),
      el("td", { class: "num" }, fmt.rate(rates.done_per_s)),
      el("td", { class: "num" }, c.created_ms ? fmt.age(c.now_ms - c.created_ms) : "-"),
      el("td", { class: "num" }, c.workers));
  }

  async function refresh() {
    const data = await dash.getJSON("/api/crawls");
    const headers = ["crawl", { label: "partitions", num: true }, "dedup",
      ...STATES.map((s) => ({ label: s, num: true })),
      { label: "done/s", num: true, title: "over the last minute" },
      { label: "age", num: true }, { label: "workers", num: true }];
    replace(body, table(headers, data.crawls.map(row), "no crawls in this Redis yet"),
      data.total > data.crawls.length ? el("p", { class: "hint" }, `showing ${data.crawls.length} of ${data.total} crawls`) : null);
  }

  dash.session().catch((err) => dash.notice(err.message, "bad"));
  dash.poll(refresh);
})();
