"use strict";
// One crawl's page. Each <section class="panel"> has one panel object below with a
// refresh(ctx) that reads its GET /api/crawls/{crawl}/... view; the poll loop runs them
// every 2 s. Actions go through act(), which POSTs with the token and says what the
// server answered (the policy form answers in its own panel). A new view is one more
// section in crawl.html and one more panel here.

(() => {
  const { el, replace, fmt, table } = dash;
  const crawl = decodeURIComponent(location.pathname.split("/")[2] || "");
  const api = `/api/crawls/${encodeURIComponent(crawl)}`;
  const STATES = ["pending", "leased", "waiting", "dead", "done"];
  const ctx = { summary: null, actions: false, tick: () => {} };

  replace(document.getElementById("crawl-name"), crawl);
  document.title = `crawlq · ${crawl}`;

  // POST an action; on success say what happened (describe(answer) gives the text) and
  // refresh at once, on refusal show the server's reason.
  async function act(path, body, describe) {
    const got = await dash.post(`${api}/${path}`, body);
    if (got.ok) {
      dash.notice(describe(got.data), "ok");
      deadPanel.stale = true; // any action may have moved dead letters
      ctx.tick();
    } else {
      dash.notice(`refused (${got.status}): ${got.data.error}`, "bad");
    }
    return got.ok;
  }

  function actionButton(label, cls, attrs, onclick) {
    return el("button", {
      type: "button", class: `action ${cls}`, ...attrs,
      title: ctx.actions ? null : "read-only: start the dashboard with --token to allow actions",
      disabled: !ctx.actions, onclick,
    }, label);
  }

  function deadActions(body, label) {
    const moved = (what) => (d) => `${what} ${label}: ${d.changed} of ${d.selected} dead letters`;
    return [
      actionButton("requeue", "requeue", { "data-target": label }, () => act("dead/requeue", body, moved("requeued"))),
      actionButton("purge", "purge danger", { "data-target": label }, () => {
        if (window.confirm(`Delete ${label} for good?`)) act("dead/purge", body, moved("purged"));
      }),
    ];
  }

  const summaryPanel = {
    node: document.getElementById("summary"),
    async refresh() {
      const s = await dash.getJSON(api);
      ctx.summary = s;
      const rates = s.rates || {};
      replace(document.getElementById("paused"), s.paused
        ? el("span", { class: "badge warn", title: "consumers lease nothing until it is resumed" }, "paused") : null);
      replace(this.node.querySelector(".pause"), s.paused
        ? actionButton("resume", "resume", null, () => act("resume", {}, () => `resumed ${crawl}`))
        : actionButton("pause", "pause", null, () => act("pause", {}, () => `paused ${crawl}: consumers lease nothing`)));
      replace(this.node.querySelector(".meta"),
        `${s.settings.partitions} partition${s.settings.partitions === 1 ? "" : "s"} · dedup ${s.settings.dedup}`,
        ` · age ${s.created_ms ? fmt.age(s.now_ms - s.created_ms) : "-"}`,
        ` · ${s.workers} live worker${s.workers === 1 ? "" : "s"}`,
        ` · ${fmt.int(s.hosts_due)} host${s.hosts_due === 1 ? "" : "s"} ready`,
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
      revisitsPanel(s.revisits);
    },
  };

  // The figures of the schedule of revisits (crawlq stats' line), or the panel hidden without one.
  function revisitsPanel(rv) {
    const node = document.getElementById("revisits");
    node.hidden = !rv;
    if (!rv) return;
    const late = (s) => (s === null ? "-" : s === "+Inf" ? "over 1d" : `\u2264 ${fmt.age(s * 1000)}`);
    const rows = [
      ["scheduled", fmt.int(rv.scheduled), "URLs waiting for their next visit"],
      ["due now", fmt.int(rv.due), "next visit has come; the reaper brings them back"],
      ["brought back", fmt.int(rv.revisits), "revisits put back in their hosts' queues"],
      ["late p50", late(rv.late_p50_s), "how long after their due time revisits were brought back (a bucket's bound)"],
      ["late p99", late(rv.late_p99_s), ""],
      ["not modified", fmt.int(rv.not_modified), "answered 304 to its validators"],
      ["unchanged", fmt.int(rv.unchanged), "a 2xx with the previous visit's digest"],
      ["changed", fmt.int(rv.changed), "a 2xx whose body changed"],
    ];
    replace(node.querySelector(".body"), table(
      ["figure", { label: "value", num: true }],
      rows.map(([k, v, title]) => el("tr", { "data-figure": k, title },
        el("td", null, k), el("td", { class: "num" }, v))),
      ""));
  }

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

  // Columns of the hosts table; `sort` names the API's sort column (SORT_COLUMNS). In
  // flight and done come from the host records, which no index sorts: shown, not sortable.
  const HOST_COLUMNS = [
    { label: "host" },
    { label: "queued", num: true, sort: "queued" },
    { label: "in flight", num: true, title: "leases whose response is not in (not sortable)" },
    { label: "done", num: true, title: "pages done (not sortable)" },
    { label: "errors", num: true, sort: "errors", title: "failed attempts" },
    { label: "next allowed", num: true, sort: "next_allowed", title: "when its next request may start (Redis clock); - : nothing pending, or every slot in use" },
    { label: "delay", num: true, sort: "delay", title: "least time between two requests (its own, the crawl's, robots.txt Crawl-delay, or what its push-back taught, fading)" },
    { label: "concurrency", num: true, title: "most requests in flight at once" },
    { label: "budget", num: true, title: "pages used / page budget" },
    { label: "backoff", num: true, title: "backoff level: push-backs in a row, less what was forgiven" },
    { label: "push-backs", num: true, title: "429/503 incidents (or what else the policy counts as push-back)" },
    { label: "blocked until", num: true, sort: "blocked_until" },
    { label: "" },
  ];

  const hostsPanel = {
    node: document.getElementById("hosts"),
    page: 0, size: 25, sort: "queued", desc: true, form: null,
    async refresh() {
      if (!this.form) this.renderForm();
      const query = new URLSearchParams({ sort: this.sort, desc: this.desc ? 1 : 0, page: this.page, size: this.size });
      const data = await dash.getJSON(`${api}/hosts?${query}`);
      const until = (ms) => fmt.until(ms, data.now_ms);
      const rows = data.hosts.map((h) => el("tr", { "data-host": h.host },
        el("td", { class: "host", title: h.host }, h.host),
        el("td", { class: "num" }, fmt.int(h.queued)),
        el("td", { class: "num" }, fmt.int(h.in_flight)),
        el("td", { class: "num" }, fmt.int(h.done)),
        el("td", { class: "num" }, fmt.int(h.errors)),
        el("td", { class: "num" }, until(h.next_allowed_ms)),
        el("td", { class: "num" }, fmt.seconds(h.delay_ms)),
        el("td", { class: "num" }, h.concurrency ? fmt.int(h.concurrency) : "no limit"),
        el("td", { class: "num" }, h.budget === null ? "-" : `${fmt.int(h.used)}/${fmt.int(h.budget)}`),
        el("td", { class: "num" }, fmt.int(h.backoff_level)),
        el("td", { class: "num" }, fmt.int(h.pushbacks)),
        el("td", { class: h.blocked_until_ms > data.now_ms ? "num blocked" : "num" }, until(h.blocked_until_ms)),
        el("td", { class: "actions" }, el("button", {
          type: "button", class: "action pick", title: "put this host in the form above",
          onclick: () => this.pick(h.host) }, "edit"))));
      const headers = HOST_COLUMNS.map((c) => ({ ...c, label: c.sort ? this.sortButton(c) : c.label }));
      replace(this.node.querySelector(".body"), table(headers, rows,
        data.page ? "no hosts on this page" : "no hosts yet"),
        this.sort === "queued" ? null : el("p", { class: "hint" },
          `sorted by ${this.sort.replace("_", " ")}: only hosts that have a value in it are listed (queued lists every host)`));
      const first = data.page * data.size;
      const deepest = data.page >= data.last_page;
      replace(this.node.querySelector(".pager"),
        el("button", { type: "button", class: "prev", disabled: data.page === 0, onclick: () => this.go(this.page - 1) }, "previous"),
        rows.length ? ` hosts ${fmt.int(first + 1)}-${fmt.int(first + rows.length)} of ${fmt.int(data.total)} ` : ` ${fmt.int(data.total)} hosts `,
        el("button", { type: "button", class: "next", disabled: rows.length < data.size || deepest, onclick: () => this.go(this.page + 1) }, "next"),
        deepest && rows.length === data.size ? el("span", { class: "hint" },
          "the deepest page here: sort the other way for the other end, or crawlq hosts --offset") : null);
    },
    sortButton(c) {
      const on = c.sort === this.sort;
      return el("button", {
        type: "button", class: on ? "sort on" : "sort", "data-sort": c.sort, title: c.title,
        onclick: () => { this.desc = on ? !this.desc : true; this.sort = c.sort; this.go(0); },
      }, c.label, on ? (this.desc ? " \u25bc" : " \u25b2") : "");
    },
    // The host form: one host's delay / concurrency / budget, or a block. Built once,
    // outside the table that every refresh redraws.
    renderForm() {
      const field = (name, label, attrs) => el("label", null, label, " ",
        el("input", { name, autocomplete: "off", ...attrs }));
      const number = { type: "number", min: 0, class: "short" };
      const button = (label, cls, onclick) => actionButton(label, cls, null, onclick);
      this.form = el("form", { class: "host-form", onsubmit: (e) => { e.preventDefault(); this.setHost(); } },
        field("host", "host", { placeholder: "example.com:8080", class: "host-input" }),
        field("delay_s", "delay (s)", { ...number, step: "any" }),
        field("concurrency", "concurrency", { ...number, step: 1, title: "0: no limit" }),
        field("budget", "budget", { ...number, step: 1, title: "most pages to fetch from it" }),
        button("set", "set-host", () => this.setHost()),
        button("defaults", "clear-host", () => this.post("hosts/set", { clear: ["delay", "concurrency", "budget"] }, "back to the crawl's defaults")),
        el("span", { class: "sep" }, "\u00b7"),
        field("seconds", "block for (s)", { ...number, step: "any", value: 600 }),
        button("block", "block-host danger", () => this.post("hosts/block", { seconds: this.value("seconds") }, "blocked")),
        button("unblock", "unblock-host", () => this.post("hosts/block", { seconds: 0 }, "unblocked")));
      replace(this.node.querySelector(".tools"), this.form);
    },
    value(name) {
      const raw = this.form.elements[name].value.trim();
      return raw === "" ? undefined : Number(raw);
    },
    setHost() {
      const body = {};
      for (const name of ["delay_s", "concurrency", "budget"]) {
        const v = this.value(name);
        if (v !== undefined) body[name] = v;
      }
      this.post("hosts/set", body, "set");
    },
    async post(path, body, what) {
      const host = this.form.elements.host.value.trim();
      const ok = await act(path, { host, ...body }, (d) => `host ${d.host}: ${what}` + (d.row
        ? ` (delay ${fmt.seconds(d.row.delay_ms)}, concurrency ${d.row.concurrency || "no limit"}, budget ${d.row.budget === null ? "none" : d.row.budget})`
        : " (not queued in this crawl yet)"));
      if (ok) for (const name of ["delay_s", "concurrency", "budget"]) this.form.elements[name].value = "";
    },
    pick(host) {
      this.form.elements.host.value = host;
      this.form.elements.host.focus();
    },
    go(page) {
      this.page = Math.max(0, page);
      ctx.tick();
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

  // The proxy pool (crawlq proxies): hidden until a consumer reported a proxy. URLs come
  // redacted from the API; nothing here could show a credential.
  const proxiesPanel = {
    node: document.getElementById("proxies"),
    async refresh() {
      const data = await dash.getJSON(`${api}/proxies`);
      this.node.hidden = !data.proxies.length;
      if (!data.proxies.length) return;
      const rows = data.proxies.map((p) => el("tr", { "data-proxy": p.id, class: p.state === "ok" ? null : "stale" },
        el("td", { class: "url", title: p.id }, p.shown), el("td", null, p.tier),
        el("td", { class: "num" }, fmt.int(p.ok)), el("td", { class: "num" }, fmt.int(p.fail)),
        el("td", { class: "num" }, fmt.int(p.ban)), el("td", { class: "num" }, fmt.int(p.banned_by)),
        el("td", { class: "num" }, p.lat_ms >= 0 ? `${p.lat_ms} ms` : "-"),
        el("td", null, p.state === "ok" ? "ok" : `quarantined ${fmt.age(p.quarantined_s * 1000)} more`)));
      replace(this.node.querySelector(".body"), el("p", { class: "hint" }, `tiers: ${data.tiers.join(" \u2192 ")}`),
        table(["proxy", "tier", { label: "ok", num: true }, { label: "failed", num: true },
          { label: "bans", num: true }, { label: "banned by", num: true, title: "hosts that ban it now" },
          { label: "latency", num: true }, "state"], rows, "no proxy reported"));
      replace(this.node.querySelector(".hosts"), table(["host", "tier", { label: "bans at tier", num: true }, "bans (proxy ids)"],
        data.hosts.map((h) => el("tr", { "data-host": h.host }, el("td", { class: "host" }, h.host),
          el("td", null, h.tier), el("td", { class: "num" }, fmt.int(h.bans_at_tier)),
          el("td", null, h.banned.join(", ") || "-"))),
        "no host bans a proxy"),
        data.hosts_total > data.hosts.length ? el("p", { class: "hint" }, `showing ${data.hosts.length} of ${data.hosts_total}`) : null);
    },
  };

  // The crawl's sessions (crawlq sessions): how many cookies each holds, never a value.
  const sessionsPanel = {
    node: document.getElementById("sessions"),
    async refresh() {
      const data = await dash.getJSON(`${api}/sessions`);
      this.node.hidden = !data.total;
      if (!data.total) return;
      const rows = data.sessions.map((s) => el("tr", { "data-session": s.name, class: s.state === "live" ? null : "stale" },
        el("td", null, s.name), el("td", null, s.host || "-"), el("td", null, s.state),
        el("td", { class: "num" }, fmt.int(s.version)), el("td", { class: "num" }, fmt.int(s.uses)),
        el("td", { class: "num" }, fmt.int(s.bans)), el("td", { class: "num" }, fmt.int(s.cookies)),
        el("td", null, s.proxy || "-")));
      replace(this.node.querySelector(".body"), table(["session", "pool host", "state",
        { label: "version", num: true }, { label: "uses", num: true },
        { label: "blocks", num: true, title: "requests of it answered with a block" },
        { label: "cookies", num: true, title: "how many it holds (their values are credentials: never shown)" },
        "proxy"], rows, "no session"),
        data.total > data.sessions.length ? el("p", { class: "hint" }, `the newest ${data.sessions.length} of ${data.total}`) : null);
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

  // The crawl's policy (crawlq crawl show / set). The form is built from the options the
  // API lists (POLICY_OPTIONS, in their order), never from a list kept here: when the
  // panel first loads, after a save, on "reload", and when the policy moved while nothing
  // in the form was edited. Every poll re-reads the version and the log. A save sends the
  // edited values with the version the form was loaded at; the server refuses it (409)
  // when the policy changed meanwhile, and the form keeps the edits.
  const policyPanel = {
    node: document.getElementById("policy"),
    loaded: null, latest: null, form: null,
    async refresh() {
      const got = await dash.get(`${api}/policy?log=10`);
      if (got.status === 404) return this.missing(got.data.error);
      if (!got.ok) throw new Error(got.data.error || `HTTP ${got.status}`);
      this.latest = got.data;
      if (!this.form || (got.data.version !== this.loaded.version && !this.edited().length)) {
        this.render(got.data);
      }
      this.renderMeta();
      this.renderLog(got.data.log);
    },
    missing(text) {
      this.loaded = this.latest = this.form = null;
      replace(this.node.querySelector(".meta"), "no policy yet");
      replace(this.node.querySelector(".body"), el("p", { class: "hint" }, text));
      replace(this.node.querySelector(".log"));
    },
    render(doc) {
      this.loaded = doc;
      const rows = doc.options.map((o) => el("div", { class: "policy-row", "data-option": o.name },
        el("label", { for: `policy-${o.name}` }, o.name),
        el("input", {
          id: `policy-${o.name}`, name: o.name, value: doc.text[o.name], placeholder: o.default,
          autocomplete: "off", spellcheck: "false", "aria-describedby": `policy-help-${o.name}`,
        }),
        el("span", { class: "hint", id: `policy-help-${o.name}` }, o.help, ` (default ${o.default})`)));
      this.form = el("form", {
        class: "policy-form", oninput: () => this.renderMeta(),
        onsubmit: (e) => { e.preventDefault(); this.save(); },
      }, rows, el("div", { class: "policy-foot" },
        actionButton("save", "save-policy", { type: "submit" }, null),
        el("button", {
          type: "button", class: "action reload-policy", title: "the policy as it is now; drops the edits",
          onclick: () => { this.form = null; ctx.tick(); },
        }, "reload")));
      replace(this.node.querySelector(".body"), this.form);
    },
    edited() {
      if (!this.form) return [];
      return this.loaded.options.map((o) => o.name)
        .filter((name) => this.form.elements[name].value !== this.loaded.text[name]);
    },
    renderMeta() {
      if (!this.loaded) return;
      const edited = this.edited();
      const now = this.latest ? this.latest.version : this.loaded.version;
      replace(this.node.querySelector(".meta"), `version ${this.loaded.version}`,
        edited.length ? ` · edited: ${edited.join(", ")}` : null,
        now !== this.loaded.version ? el("span", {
          class: "badge warn stale-policy", title: "saving would be refused: reload to see it",
        }, `changed since loaded: now version ${now}`) : null);
    },
    status(text, kind) {
      replace(this.node.querySelector(".status"), el("span", { class: `policy-msg ${kind}` }, text));
    },
    async save() {
      const values = {};
      for (const name of this.edited()) values[name] = this.form.elements[name].value;
      const keys = Object.keys(values);
      if (!keys.length) return this.status("nothing edited", "info");
      const got = await dash.post(`${api}/policy/set`, { values, version: this.loaded.version });
      if (got.ok) {
        this.status(got.data.changed ? `saved: version ${got.data.version} (${keys.join(", ")})`
          : `nothing changed: the values are the same (version ${got.data.version})`, "ok");
        this.form = null;
      } else {
        this.status(`refused (${got.status}): ${got.data.error}`, "bad");
      }
      ctx.tick();
    },
    renderLog(entries) {
      const changes = (c) => Object.entries(c || {}).sort((a, b) => a[0].localeCompare(b[0]))
        .map(([key, [old, now]]) => `${key} ${old ?? "-"} \u2192 ${now}`).join(", ");
      replace(this.node.querySelector(".log"), table(
        ["when", { label: "version", num: true }, "by", "changes"],
        entries.map((e) => el("tr", { "data-version": e.version },
          el("td", { class: "when" }, fmt.time(e.at)), el("td", { class: "num" }, e.version),
          el("td", null, e.by), el("td", { class: "changes" }, changes(e.changes)))),
        "no changes logged"));
    },
  };

  const panels = [summaryPanel, chartPanel, hostsPanel, proxiesPanel, sessionsPanel, workersPanel, deadPanel, policyPanel];

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
