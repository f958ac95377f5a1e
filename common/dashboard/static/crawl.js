"use strict";
// One crawl's page. Each <section class="panel"> has one panel object below with a
// refresh(ctx) that reads its GET /api/crawls/{crawl}/... view; the poll loop runs them
// every 2 s. Actions go through act(), which POSTs with the token and says what the
// server answered. A new view is one more section in crawl.html and one more panel here.

(() => {
  const { el, replace, fmt, table } = dash;
  const crawl = decodeURIComponent(location.pathname.split("/")[2] || "");
  const api = `/api/crawls/${encodeURIComponent(crawl)}`;
  const STATES = ["pending", "leased", "waiting", "dead", "done"];
  const ctx = { summary: null, actions: false, tick: () => {} };

  replace(document.getElementById("crawl-name"), crawl);
  document.title = `crawlq · ${crawl}`;

  // POST an action; on success refresh at once, on refusal show the server's reason.
  async function act(path, body, what) {
    const got = await dash.post(`${api}/${path}`, body);
    if (got.ok) {
      dash.notice(`${what}: ${got.data.changed} of ${got.data.selected} dead letters`, "ok");
      deadPanel.stale = true;
      ctx.tick();
    } else {
      dash.notice(`refused (${got.status}): ${got.data.error}`, "bad");
    }
  }

  function actionButton(label, cls, attrs, onclick) {
    return el("button", {
      type: "button", class: `action ${cls}`, ...attrs,
      title: ctx.actions ? null : "read-only: start the dashboard with --token to allow actions",
      disabled: !ctx.actions, onclick,
    }, label);
  }

  function deadActions(body, label) {
    return [
      actionButton("requeue", "requeue", { "data-target": label }, () => act("dead/requeue", body, `requeued ${label}`)),
      actionButton("purge", "purge danger", { "data-target": label }, () => {
        if (window.confirm(`Delete ${label} for good?`)) act("dead/purge", body, `purged ${label}`);
      }),
    ];
  }

  const summaryPanel = {
    node: document.getElementById("summary"),
    async refresh() {
      const s = await dash.getJSON(api);
      ctx.summary = s;
      const rates = s.rates || {};
      replace(this.node.querySelector(".meta"),
        `${s.settings.partitions} partition${s.settings.partitions === 1 ? "" : "s"} · dedup ${s.settings.dedup}`,
        ` · age ${s.created_ms ? fmt.age(s.now_ms - s.created_ms) : "-"}`,
        ` · ${s.workers} live worker${s.workers === 1 ? "" : "s"}`,
        rates.window_s ? ` · rates over the last ${Math.round(rates.window_s)}s` : " · rates: no history yet");
      const rateOf = { done: rates.done_per_s, dead: rates.dead_per_s, leased: rates.leased_per_s };
      replace(this.node.querySelector(".cards"), STATES.map((name) =>
        el("div", { class: `card state-${name}`, "data-state": name },
          el("div", { class: "label" }, name),
          el("div", { class: "value" }, fmt.int(s.states[name])),
          el("div", { class: "sub" }, rateOf[name] !== undefined ? fmt.rate(rateOf[name]) : "\u00a0"))));
      const outcomes = Object.entries(s.outcomes).sort((a, b) => b[1] - a[1]);
      replace(document.querySelector("#outcomes .body"), table(
        ["outcome", { label: "tasks", num: true }],
        outcomes.map(([k, v]) => el("tr", null, el("td", null, k), el("td", { class: "num" }, fmt.int(v)))),
        "nothing finished yet"));
      const reasons = Object.entries(s.dead_reasons);
      replace(document.querySelector("#reasons .body"), table(
        ["reason", { label: "dead", num: true }, ""],
        reasons.map(([reason, n]) => el("tr", { "data-reason": reason },
          el("td", null, reason), el("td", { class: "num" }, fmt.int(n)),
          el("td", { class: "actions" }, deadActions({ reason }, `reason ${reason}`)))),
        "no dead letters"));
    },
  };

  const chartPanel = {
    node: document.querySelector("#chart .body"),
    points: [],
    series: ["done", "failed", "enqueued"],
    span: 3600,
    async refresh() {
      const last = this.points.length ? this.points[this.points.length - 1].t : null;
      const data = await dash.getJSON(`${api}/history${last ? `?since=${last}` : ""}`);
      this.series = data.series;
      this.span = data.span_s;
      this.points = this.points.concat(data.points);
      const end = ctx.summary ? ctx.summary.now_ms / 1000 : Date.now() / 1000;
      this.points = this.points.filter((p) => p.t >= end - this.span);
      chart.draw(this.node, this.series, this.points, this.span, end);
    },
  };

  const workersPanel = {
    node: document.querySelector("#workers .body"),
    async refresh() {
      const data = await dash.getJSON(`${api}/workers`);
      const rows = data.workers.map((w) => el("tr", { class: w.stale ? "stale" : null, "data-worker": w.id },
        el("td", null, w.id, w.stale ? el("span", { class: "badge bad", title: "no heartbeat for more than two intervals" }, "late") : null),
        el("td", null, w.host), el("td", { class: "num" }, w.pid), el("td", null, w.state),
        el("td", { class: "num age" }, `${w.heartbeat_age_s.toFixed(1)}s`),
        el("td", { class: "num" }, fmt.int(w.in_flight)), el("td", { class: "num" }, fmt.int(w.done)),
        el("td", { class: "num" }, fmt.int(w.failed)), el("td", { class: "num" }, fmt.rate(w.pages_per_s)),
        el("td", { class: "num" }, fmt.age(data.now_ms - w.started_ms))));
      replace(this.node, table(["id", "host", { label: "pid", num: true }, "state",
        { label: "heartbeat", num: true, title: "age of the last heartbeat, on the Redis clock" },
        { label: "in flight", num: true }, { label: "done", num: true }, { label: "failed", num: true },
        { label: "pages/s", num: true }, { label: "up", num: true }], rows, "no live workers"),
        data.total > data.workers.length ? el("p", { class: "hint" }, `showing ${data.workers.length} of ${data.total}`) : null);
    },
  };

  const deadPanel = {
    node: document.getElementById("dead"),
    page: 0, size: 25, reason: "", stale: true, seen: null,
    async refresh() {
      const s = ctx.summary;
      const key = s ? JSON.stringify([s.states.dead, s.dead_reasons]) : null;
      if (!this.stale && key === this.seen) return; // nothing died or left since the last read
      const query = new URLSearchParams({ page: this.page, size: this.size });
      if (this.reason) query.set("reason", this.reason);
      const data = await dash.getJSON(`${api}/dead?${query}`);
      this.stale = false;
      this.seen = key;
      this.renderTools(s ? Object.keys(s.dead_reasons) : []);
      const rows = data.items.map((d) => el("tr", { "data-id": d.id },
        el("td", { class: "when" }, fmt.time(d.died_at_ms)),
        el("td", null, d.reason),
        el("td", { class: "url", title: d.url || "" }, d.url || "(no URL: malformed task)"),
        el("td", { class: "error", title: d.error }, d.error),
        el("td", { class: "num" }, d.attempts),
        el("td", { class: "actions" }, deadActions({ ids: [d.id] }, "1 task"))));
      replace(this.node.querySelector(".body"), table(
        ["died", "reason", "URL", "last error", { label: "attempts", num: true }, ""], rows,
        this.reason ? `no dead letters with reason ${this.reason}` : "no dead letters"),
        data.complete ? null : el("p", { class: "hint" },
          `the reason filter looked through the newest ${fmt.int(data.searched)} dead letters only`));
      const pages = Math.max(1, Math.ceil(data.total / data.size));
      replace(this.node.querySelector(".pager"),
        el("button", { type: "button", class: "prev", disabled: data.page === 0, onclick: () => this.go(this.page - 1) }, "newer"),
        ` page ${data.page + 1} of ${pages} · ${fmt.int(data.total)} dead${this.reason ? ` with ${this.reason}` : ""} `,
        el("button", { type: "button", class: "next", disabled: data.page + 1 >= pages, onclick: () => this.go(this.page + 1) }, "older"));
    },
    renderTools(reasons) {
      const select = el("select", { "aria-label": "filter by reason", onchange: (e) => { this.reason = e.target.value; this.go(0); } },
        el("option", { value: "" }, "every reason"),
        reasons.map((r) => el("option", { value: r, selected: r === this.reason }, r)));
      replace(this.node.querySelector(".tools"), el("label", null, "show ", select),
        el("span", { class: "spacer" }), "all dead letters: ", deadActions({ all: true }, "all"));
    },
    go(page) {
      this.page = Math.max(0, page);
      this.stale = true;
      ctx.tick();
    },
  };

  const panels = [summaryPanel, chartPanel, workersPanel, deadPanel];

  async function refresh() {
    await summaryPanel.refresh();
    const results = await Promise.allSettled(panels.slice(1).map((p) => p.refresh()));
    const failed = results.find((r) => r.status === "rejected");
    if (failed) throw failed.reason;
  }

  dash.session().then((info) => { ctx.actions = info.actions; })
    .catch((err) => dash.notice(err.message, "bad"))
    .finally(() => { ctx.tick = dash.poll(refresh); });
})();
