"use strict";
// A small line chart in inline SVG (no library): per-second rates over a time span.

const chart = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const W = 900, H = 200, LEFT = 56, RIGHT = 12, TOP = 12, BOTTOM = 28;

  function svg(tag, attrs, text) {
    const node = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function niceMax(v) {
    if (v <= 0) return 1;
    const step = 10 ** Math.floor(Math.log10(v));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * step >= v) return m * step;
    return 10 * step;
  }

  // A short label for `s` seconds ago.
  function ago(s) {
    if (s === 0) return "now";
    return s % 60 === 0 ? `-${s / 60}m` : `-${s}s`;
  }

  // points: [{t: unix s, <series>: rate}], oldest first; the x axis ends at `end` (unix s)
  // and spans the history there is, up to `maxSpanS`.
  function draw(container, seriesNames, points, maxSpanS, end) {
    const have = points.length ? end - points[0].t : 0;
    const spanS = Math.min(maxSpanS, Math.max(60, Math.ceil(have / 60) * 60));
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img",
      "aria-label": `per-second ${seriesNames.join(", ")} over the last ${Math.round(spanS / 60)} minutes` });
    const start = end - spanS;
    const x = (t) => LEFT + ((t - start) / spanS) * (W - LEFT - RIGHT);
    let top = 0;
    for (const p of points) for (const s of seriesNames) top = Math.max(top, p[s] || 0);
    const ymax = niceMax(top);
    const y = (v) => TOP + (1 - v / ymax) * (H - TOP - BOTTOM);
    for (let i = 0; i <= 4; i++) {
      const v = (ymax * i) / 4;
      root.append(svg("line", { x1: LEFT, x2: W - RIGHT, y1: y(v), y2: y(v), class: "grid" }));
      root.append(svg("text", { x: LEFT - 6, y: y(v) + 4, class: "ylabel" },
        String(Number(v.toFixed(2)))));
    }
    const step = [10, 30, 60, 120, 300, 600].find((s) => spanS / s <= 6) || 600;
    for (let s = 0; s <= spanS; s += step) {
      root.append(svg("text", { x: x(end - s), y: H - 8, class: "xlabel" }, ago(s)));
    }
    for (const name of seriesNames) {
      const shown = points.filter((p) => p.t >= start);
      if (shown.length < 2) continue;
      const d = shown.map((p, i) => `${i ? "L" : "M"}${x(p.t).toFixed(1)},${y(p[name] || 0).toFixed(1)}`).join("");
      root.append(svg("path", { d, class: `line s-${name}` }));
    }
    const legend = document.createElement("div");
    legend.className = "legend";
    for (const name of seriesNames) {
      const last = points.length ? points[points.length - 1][name] : null;
      const item = document.createElement("span");
      item.className = `key s-${name}`;
      item.textContent = `${name} ${last === null || last === undefined ? "-" : last.toFixed(1)}/s`;
      legend.append(item);
    }
    const note = document.createElement("p");
    note.className = "hint";
    note.textContent = points.length < 2
      ? "no history yet: the consumers write a snapshot every 5 s while they run"
      : `y: per second · ${points.length} intervals of about 5 s`;
    container.replaceChildren(legend, root, note);
  }

  return { draw };
})();
