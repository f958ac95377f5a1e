"use strict";
// Shared by every page of the crawlq dashboard.
//
// Every string that comes from a crawl (URLs, errors, hosts, worker ids, crawl names) is
// put in the page as a text node or an attribute value, never parsed as HTML: el() has
// no way to set innerHTML, and no link is ever built from crawled data.

const dash = (() => {
  const TOKEN_KEY = "crawlq-dashboard-token";
  const POLL_MS = 2000;

  function append(parent, children) {
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      parent.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return parent;
  }

  // <tag attrs...>children</tag>; "class" sets className, "on<event>" a listener.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    return append(node, children);
  }

  function replace(node, ...children) {
    node.replaceChildren();
    return append(node, children);
  }

  const number = new Intl.NumberFormat("en-US");
  const fmt = {
    int: (n) => (n === null || n === undefined ? "-" : number.format(n)),
    rate: (n) => (n === null || n === undefined ? "-" : `${n >= 100 ? Math.round(n) : n.toFixed(1)}/s`),
    age(ms) {
      if (ms === null || ms === undefined) return "-";
      const s = Math.max(0, Math.round(ms / 1000));
      if (s < 60) return `${s}s`;
      if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
      if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
      return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
    },
    time: (ms) => new Date(ms).toISOString().replace("T", " ").slice(0, 19) + "Z",
    // A moment relative to `now` (both ms of one clock): "now", "in 0.4s", "in 9m 59s".
    until(ms, now) {
      if (ms === null || ms === undefined) return "-";
      const left = ms - now;
      if (left <= 0) return "now";
      return left < 60000 ? `in ${(left / 1000).toFixed(1)}s` : `in ${fmt.age(left)}`;
    },
    seconds: (ms) => `${Number((ms / 1000).toFixed(3))}s`,
  };

  function table(headers, rows, empty) {
    const head = el("thead", null, el("tr", null, headers.map((h) =>
      el("th", { class: h.num ? "num" : null, title: h.title }, h.label ?? h))));
    const body = el("tbody");
    if (rows.length === 0) {
      body.append(el("tr", null, el("td", { class: "empty", colspan: headers.length }, empty)));
    } else {
      append(body, rows);
    }
    return el("table", null, head, body);
  }

  async function answer(response) {
    let data = null;
    try {
      data = await response.json();
    } catch (_) {
      data = { error: `HTTP ${response.status}` };
    }
    return { ok: response.ok, status: response.status, data };
  }

  // GET a view: { ok, status, data }, for a view whose 4xx the page shows (getJSON throws).
  async function get(url) {
    return answer(await fetch(url, { headers: { Accept: "application/json" } }));
  }

  async function getJSON(url) {
    const got = await get(url);
    if (!got.ok) throw new Error(got.data.error || `HTTP ${got.status}`);
    return got.data;
  }

  async function post(url, body) {
    const headers = { "Content-Type": "application/json", Accept: "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = `Bearer ${token}`;
    return answer(await fetch(url, {
      method: "POST", headers, body: JSON.stringify(body), credentials: "same-origin",
    }));
  }

  function notice(text, kind) {
    const box = document.getElementById("notice");
    replace(box, text ? el("span", { class: `notice ${kind || "info"}` }, text) : null);
  }

  // Runs refresh() now and then every POLL_MS after it settles; paused in a hidden tab.
  function poll(refresh) {
    let timer = null;
    const status = document.getElementById("live");
    async function tick() {
      clearTimeout(timer);
      if (!document.hidden) {
        try {
          await refresh();
          replace(status, el("span", { class: "ok" }, "live"), ` · updated ${new Date().toLocaleTimeString()}`);
        } catch (err) {
          replace(status, el("span", { class: "bad" }, "not updating"), ` · ${err.message}`);
        }
      }
      timer = setTimeout(tick, POLL_MS);
    }
    document.addEventListener("visibilitychange", () => { if (!document.hidden) tick(); });
    tick();
    return tick;
  }

  // The header: read-only badge, or the token field that actions need.
  async function session() {
    const info = await getJSON("/api/session");
    const mode = document.getElementById("mode");
    const form = document.getElementById("token-form");
    if (!info.actions) {
      replace(mode, el("span", { class: "badge muted", title: "start crawlq dashboard with --token to allow actions" }, "read-only"));
      form.hidden = true;
      return info;
    }
    const input = form.querySelector("input");
    const state = form.querySelector(".token-state");
    const show = () => replace(state, sessionStorage.getItem(TOKEN_KEY) ? "token set for this tab" : "no token: actions will be refused");
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      if (input.value) sessionStorage.setItem(TOKEN_KEY, input.value);
      else sessionStorage.removeItem(TOKEN_KEY);
      input.value = "";
      show();
    });
    show();
    return info;
  }

  return { el, replace, fmt, table, get, getJSON, post, notice, poll, session };
})();
