"use strict";
// The curated run's "similar to" box, over the run's embedding store (DATA.search: clip ids and their
// vectors quantised to int8, base64). It ranks the page's clips by cosine to one clip's vector and shows
// the top k, most similar first, with a `similarity` column. Ranking by a text needs the embedding model's
// text tower, which the page does not carry: `vidforge search RUN "text" --review OUT` writes that page.
(function similarBox() {
  const S = DATA.search;
  if (!S || !S.ids.length) return;
  const raw = atob(S.int8);
  const vectors = new Int8Array(raw.length);
  for (let i = 0; i < raw.length; i++) vectors[i] = (raw.charCodeAt(i) << 24) >> 24;
  const row = new Map(S.ids.map((id, i) => [id, i]));
  const norms = S.ids.map((_, i) => {
    let s = 0;
    for (let j = i * S.dim; j < (i + 1) * S.dim; j++) s += vectors[j] * vectors[j];
    return Math.sqrt(s) || 1;
  });
  const baseVisible = visible;
  visible = function visibleSimilar() {
    const list = baseVisible();
    return state.similar ? list.filter((item) => state.similar.has(item.id)) : list;
  };
  const message = el("span", { id: "similar-msg" });
  const idBox = el("input", { id: "similar-id", type: "search", placeholder: "clip id (or its start)", size: 24 });
  const kBox = el("input", { id: "similar-k", type: "number", min: 1, value: 20 });
  const find = () => {
    const text = idBox.value.trim();
    const matches = S.ids.filter((id) => id === text || (text && id.startsWith(text)));
    if (matches.length !== 1) {
      message.textContent = matches.length ? `${matches.length} clips start with ${text}` : `no clip ${text}`;
      return;
    }
    const q = row.get(matches[0]);
    const sims = S.ids.map((_, i) => {
      let s = 0;
      for (let j = 0; j < S.dim; j++) s += vectors[q * S.dim + j] * vectors[i * S.dim + j];
      return s / (norms[q] * norms[i]);
    });
    const top = new Set([...S.ids.keys()].sort((a, b) => sims[b] - sims[a] || a - b)
      .slice(0, Math.max(1, Number(kBox.value) || 20)).map((i) => S.ids[i]));
    for (const item of DATA.items) {
      if (row.has(item.id)) item.scores.similarity = Number(sims[row.get(item.id)].toFixed(4));
    }
    if (!DATA.scores.includes("similarity")) DATA.scores.push("similarity");
    message.textContent = `${top.size} most similar to ${matches[0]}`;
    Object.assign(state, { similar: top, sort: "similarity", desc: true, page: 0 });
    controls();
    render();
  };
  const clear = () => {
    message.textContent = "";
    Object.assign(state, { similar: null, page: 0 });
    render();
  };
  idBox.addEventListener("keydown", (e) => { if (e.key === "Enter") find(); });
  const box = el("section", { id: "similar" }, el("label", {}, "similar to ", idBox), " top ", kBox,
    el("button", { class: "chip", id: "similar-go", onclick: find }, "find"),
    el("button", { class: "chip", id: "similar-clear", onclick: clear }, "clear"), " ", message);
  document.getElementById("controls").before(box);
})();
