"use strict";
// The review page's behaviour: filters, sorting and pages over the items embedded in the page. Only the
// current page's rows are in the document and thumbnails load lazily, so 10,000 clips stay quick; a
// video loads only when its thumbnail is clicked.
const DATA = JSON.parse(document.getElementById("data").textContent);
const state = {
  status: "all", // "all" | "kept" | "rejected" | a reason
  source: "",
  group: "",
  sort: null,
  desc: false,
  scoreKey: "",
  min: "",
  max: "",
  text: "",
  page: 0,
  size: DATA.kind === "curation" ? 50 : 24,
};

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function fmt(value) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "number" && !Number.isInteger(value)) return Number(value.toPrecision(4)).toString();
  return String(value);
}

function basename(path) {
  return path.split("/").pop();
}

function count(list, key) {
  const counts = new Map();
  for (const item of list) for (const k of key(item)) counts.set(k, (counts.get(k) || 0) + 1);
  return counts;
}

function header() {
  document.getElementById("title").textContent = DATA.title;
  const summary = document.getElementById("summary");
  for (const [name, value] of DATA.summary) summary.append(el("div", {}, el("dt", {}, name), el("dd", {}, value)));
  const notes = document.getElementById("notes");
  for (const note of DATA.notes) notes.append(el("li", {}, note));
  const plots = document.getElementById("plots");
  for (const plot of DATA.plots)
    plots.append(el("figure", {}, el("img", { src: plot.src, alt: plot.title }), el("figcaption", {}, plot.title)));
}

function chip(label, on, onclick, attrs, extraClass = "") {
  return el("button", { class: "chip" + (on ? " on" : "") + extraClass, onclick, ...attrs }, label);
}

function controls() {
  const box = document.getElementById("controls");
  box.replaceChildren();
  const set = (changes) => {
    Object.assign(state, changes, { page: 0 });
    controls();
    render();
  };
  if (DATA.kind === "curation") {
    const kept = DATA.items.filter((i) => i.keep).length;
    const reasons = count(DATA.items, (i) => i.reasons);
    const statuses = [
      ["all", `all (${DATA.items.length})`],
      ["kept", `kept (${kept})`],
      ["rejected", `rejected (${DATA.items.length - kept})`],
      ...[...reasons].sort().map(([r, n]) => [r, `${r} (${n})`]),
    ];
    box.append(
      el("div", { class: "chips", id: "status" },
        statuses.map(([key, label]) =>
          chip(label, state.status === key, () => set({ status: key }), { dataset: { filter: key } },
            reasons.has(key) ? " reject" : ""))),
    );
    const sources = [...count(DATA.items, (i) => [i.source])].sort();
    if (sources.length > 1) {
      const select = el("select", { id: "source", onchange: (e) => set({ source: e.target.value }) },
        el("option", { value: "" }, `every source (${sources.length})`),
        sources.map(([s, n]) => el("option", { value: s, selected: s === state.source }, `${basename(s)} (${n})`)));
      box.append(el("label", {}, "source ", select));
    }
    if (DATA.scores.length) {
      const keySelect = el("select", { id: "score-key", onchange: (e) => set({ scoreKey: e.target.value }) },
        el("option", { value: "" }, "score…"),
        DATA.scores.map((k) => el("option", { value: k, selected: k === state.scoreKey }, k)));
      const bound = (id, name) => el("input", { id, type: "number", step: "any", placeholder: name, value: state[name],
        onchange: (e) => set({ [name]: e.target.value }) });
      box.append(el("label", {}, "filter ", keySelect, " ", bound("score-min", "min"), " to ", bound("score-max", "max")));
    }
  }
  const groups = [...new Set(DATA.items.map((i) => i.group).filter(Boolean))];
  if (groups.length > 1)
    box.append(el("div", { class: "chips", id: "groups" },
      chip("all", state.group === "", () => set({ group: "" }), { dataset: { group: "" } }),
      groups.map((g) => chip(g, state.group === g, () => set({ group: g }), { dataset: { group: g } }))));
  box.append(el("label", {}, "search ", el("input", { id: "search", type: "search", value: state.text,
    placeholder: DATA.kind === "curation" ? "caption, id or source" : "prompt",
    onchange: (e) => set({ text: e.target.value }) })));
}

function visible() {
  const text = state.text.toLowerCase();
  const lo = state.min === "" ? -Infinity : Number(state.min);
  const hi = state.max === "" ? Infinity : Number(state.max);
  let list = DATA.items.filter((item) => {
    if (state.status === "kept" && !item.keep) return false;
    if (state.status === "rejected" && item.keep !== false) return false;
    if (!["all", "kept", "rejected"].includes(state.status) && !(item.reasons || []).includes(state.status)) return false;
    if (state.source && item.source !== state.source) return false;
    if (state.group && item.group !== state.group) return false;
    if (state.scoreKey) {
      const v = item.scores[state.scoreKey];
      if (v === undefined || v === null || v < lo || v > hi) return false;
    }
    if (text && ![item.caption, item.id, item.source].some((s) => (s || "").toLowerCase().includes(text))) return false;
    return true;
  });
  if (state.sort) {
    const key = state.sort, sign = state.desc ? -1 : 1;
    const value = (item) => item.scores[key];
    // Clips without the score go last either way; equal scores keep the run's order (sort is stable).
    list = list.slice().sort((a, b) => {
      const va = value(a), vb = value(b);
      const ma = va === undefined || va === null, mb = vb === undefined || vb === null;
      if (ma || mb) return ma - mb;
      return sign * (va - vb);
    });
  }
  return list;
}

function mediaCell(item) {
  const box = el("div", { class: "media" });
  if (!item.thumb && !item.media) {
    box.append(el("span", { class: "missing" }, "no media"));
    return box;
  }
  const play = () => box.replaceChildren(el("video", { src: item.media, controls: true, autoplay: true, muted: true, loop: true }));
  if (item.thumb) box.append(el("img", { src: item.thumb, loading: "lazy", alt: item.id, title: "click to play", onclick: item.media ? play : null }));
  else box.append(el("button", { class: "chip", onclick: play }, "play"));
  return box;
}

function status(item) {
  if (item.keep) return el("span", { class: "kept" }, "kept");
  const reasons = (item.reasons.length ? item.reasons : ["rejected"]).map((r) => el("span", { class: "reason" }, r));
  return [reasons, item.detail ? el("div", { class: "detail" }, item.detail) : null];
}

function clipRange(item) {
  const range = item.start_s === null || item.start_s === undefined ? "" : `${fmt(item.start_s)}–${fmt(item.end_s)} s`;
  return [el("div", { title: item.id }, item.id.slice(0, 12)), el("div", { title: item.source }, basename(item.source || "")), el("div", {}, range)];
}

function table(rows) {
  const sortBy = (key) => () => {
    Object.assign(state, { desc: state.sort === key ? !state.desc : false, sort: key, page: 0 });
    render();
  };
  // The decision comes before the scores, so it is in view however many scores a run measured; a
  // score's name may break after an underscore so that its column is as narrow as its numbers.
  const head = el("tr", {}, el("th", {}, "frames"), el("th", {}, "clip"), el("th", {}, "caption"),
    el("th", {}, "decision"),
    DATA.scores.map((k) => el("th", {
      class: "sortable" + (state.sort === k ? " sorted" + (state.desc ? " desc" : "") : ""),
      dataset: { sort: k }, title: "click to sort", onclick: sortBy(k) },
      k.split(/(?<=_)/).map((part, i) => (i ? [el("wbr"), part] : part)))));
  const body = rows.map((item) => el("tr", { class: "item", dataset: { id: item.id, reasons: item.reasons.join(" "), keep: item.keep } },
    el("td", {}, mediaCell(item)),
    el("td", { class: "clip" }, clipRange(item)),
    el("td", { class: "caption" }, item.caption),
    el("td", { class: "decision" }, status(item)),
    DATA.scores.map((k) => el("td", { class: "score", dataset: { key: k, value: item.scores[k] ?? "" } }, fmt(item.scores[k])))));
  // Scores past the window's width scroll inside this box, not the page (which keeps the decision in view).
  return el("div", { class: "table-scroll" }, el("table", {}, el("thead", {}, head), el("tbody", {}, body)));
}

function card(item) {
  const meta = Object.entries(item.meta || {}).filter(([, v]) => v !== null && v !== undefined);
  // What the sample started from (infer --image): its own small picture under the video's strip.
  const inputs = (item.inputs || []).filter((i) => i.thumb).map((i) =>
    el("figure", { class: "input" }, el("img", { src: i.thumb, alt: i.label, title: i.path }), el("figcaption", {}, i.label)));
  return el("div", { class: "item card", dataset: { id: item.id } }, mediaCell(item), inputs,
    el("div", { class: "caption" }, item.caption),
    el("dl", {}, meta.map(([k, v]) => [el("dt", {}, k.replace(/_/g, " ")), el("dd", { dataset: { key: k } }, fmt(v))])));
}

function pager(total, pages) {
  const go = (page) => () => { state.page = page; render(); };
  const first = total ? state.page * state.size + 1 : 0;
  const last = Math.min(total, (state.page + 1) * state.size);
  const sizes = el("select", { class: "page-size", onchange: (e) => { state.size = Number(e.target.value); state.page = 0; render(); } },
    [24, 50, 100, 200].map((n) => el("option", { value: n, selected: n === state.size }, `${n} a page`)));
  return [
    el("button", { class: "chip prev", disabled: state.page === 0, onclick: go(state.page - 1) }, "‹ previous"),
    el("span", { class: "showing" }, `${first}–${last} of ${total}`, pages > 1 ? ` (page ${state.page + 1} of ${pages})` : ""),
    el("button", { class: "chip next", disabled: state.page >= pages - 1, onclick: go(state.page + 1) }, "next ›"),
    sizes,
  ];
}

function render() {
  if (!DATA.items.length) {
    // Nothing to list (a train run without validation samples): the notes say why; no empty controls.
    for (const id of ["controls", "pager", "pager-bottom"]) document.getElementById(id).hidden = true;
    document.body.dataset.rendered = "1";
    return;
  }
  const list = visible();
  const pages = Math.max(1, Math.ceil(list.length / state.size));
  state.page = Math.min(state.page, pages - 1);
  const rows = list.slice(state.page * state.size, (state.page + 1) * state.size);
  const main = document.getElementById("items");
  if (DATA.kind === "curation") {
    main.className = "table";
    main.replaceChildren(table(rows));
  } else {
    main.className = "cards";
    const nodes = [];
    let group = null;
    for (const item of rows) {
      if (item.group && item.group !== group) nodes.push(el("h2", { class: "group" }, (group = item.group)));
      nodes.push(card(item));
    }
    if (!list.length) nodes.push(el("p", {}, "nothing matches"));
    main.replaceChildren(...nodes);
  }
  document.getElementById("pager").replaceChildren(...pager(list.length, pages));
  document.getElementById("pager-bottom").replaceChildren(...pager(list.length, pages));
  document.body.dataset.rendered = String(Number(document.body.dataset.rendered || 0) + 1);
}

header();
controls();
render();
