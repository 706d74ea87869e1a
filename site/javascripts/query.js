// attnmatrix query page: looks up the query engine's own answers (site/data/query/*.json, written by
// `attnmatrix generate` from attnmatrix/selector_engine.py) and lays them out. It decides nothing itself:
// the order, tiers, reasons and evidence are the engine's `explain` texts, shown verbatim in each row's
// data-explain attribute and in its words below the table.
(function () {
  "use strict";
  const root = document.getElementById("am-query");
  if (!root) return;
  const base = root.dataset.base;
  const cache = {};
  let index = null;

  const el = (tag, attrs, ...kids) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v; else if (k.startsWith("data-")) e.setAttribute(k, v); else e[k] = v;
    }
    for (const k of kids) if (k !== null && k !== undefined) e.append(k);
    return e;
  };
  const $ = (id) => document.getElementById(id);
  const fetchJson = (file) => cache[file] || (cache[file] = fetch(base + file).then((r) => {
    if (!r.ok) throw new Error(file + ": HTTP " + r.status);
    return r.json();
  }));

  const FLAGS = ["causal", "sliding_window", "softcap", "alibi", "sinks", "gqa", "varlen", "fp8"];
  const dimsText = (d) => (d[0] === d[1] ? String(d[0]) : d[0] + "x" + d[1]);
  const sig2 = (x) => {
    if (!isFinite(x) || x === 0) return String(x);
    const e = Math.floor(Math.log10(Math.abs(x)));
    return (Math.round(x / Math.pow(10, e - 1)) * Math.pow(10, e - 1)).toFixed(Math.max(0, 1 - e));
  };

  function archOf(gpuValue) { return gpuValue.split("|")[0]; }
  function archEntry(arch) { return index.archs.find((a) => a.arch === arch); }
  function opEntry(arch, op) { const a = archEntry(arch); return a && a.ops.find((o) => o.op === op); }

  function fillSelect(sel, options, keep) {
    const prev = keep ? sel.value : null;
    sel.replaceChildren(...options.map(([v, t]) => el("option", {value: v, textContent: t})));
    if (prev !== null && options.some(([v]) => v === prev)) sel.value = prev;
  }

  function refreshControls() {
    const arch = archOf($("am-gpu").value);
    const a = archEntry(arch);
    fillSelect($("am-op"), a.ops.map((o) => [o.op, o.op]), true);
    const o = opEntry(arch, $("am-op").value);
    fillSelect($("am-dtype"), Object.keys(o.files).map((d) => [d, d]), true);
    fillSelect($("am-hd"), o.head_sizes.map((d) => [dimsText(d), dimsText(d)]), true);
    const flags = FLAGS.filter((f) => o.features.includes(f));
    const box = $("am-flags");
    const on = new Set([...box.querySelectorAll("input:checked")].map((i) => i.value));
    if (!box.dataset.init) { on.add("causal"); box.dataset.init = "1"; }
    box.replaceChildren(...flags.map((f) => el("label", {class: "am-flag"},
      el("input", {type: "checkbox", value: f, checked: on.has(f), onchange: run}), " " + f)));
    const pages = o.features.filter((f) => f.startsWith("paged_kv:")).map((f) => f.split(":")[1]);
    fillSelect($("am-page"), [["", "no paged KV"], ...pages.map((p) => [p, "paged KV, block " + p])], true);
    const ropes = o.features.filter((f) => f.startsWith("qk_rope:")).map((f) => f.split(":")[1]);
    fillSelect($("am-rope"), [["", "qk_rope: any split"], ...ropes.map((r) => [r, "qk_rope " + r])], true);
    $("am-rope").hidden = ropes.length === 0;
  }

  function currentQuery() {
    const [hd, hdv] = $("am-hd").value.split("x").map(Number);
    const feats = [...$("am-flags").querySelectorAll("input:checked")].map((i) => i.value);
    if ($("am-page").value) feats.push("paged_kv:" + $("am-page").value);
    if (!$("am-rope").hidden && $("am-rope").value) feats.push("qk_rope:" + $("am-rope").value);
    return {arch: archOf($("am-gpu").value), op: $("am-op").value, dtype: $("am-dtype").value,
            hd: hd, hdv: hdv === undefined ? hd : hdv, feats: feats};
  }

  const keyOf = (q) => [q.dtype, q.hd, q.hdv, [...q.feats].sort().join("+") || "none"].join("|");

  function cliCommand(q) {
    const flags = q.feats.map((f) => f.startsWith("paged_kv:") ? "--page-size " + f.split(":")[1]
      : f === "causal" ? null : f.startsWith("qk_rope:") ? null : "--" + f.replace(/_/g, "-")).filter(Boolean);
    if (!q.feats.includes("causal")) flags.push("--no-causal");
    return ["attnmatrix explain --arch", q.arch, "--op", q.op, "--dtype", q.dtype, "--head-size", q.hd,
            q.hdv !== q.hd ? "--head-size-v " + q.hdv : null, ...flags].filter(Boolean).join(" ");
  }

  function evidenceLinks(text, data) {
    const out = el("span", {class: "am-evidence"});
    const ids = [...new Set([...text.matchAll(/(?:: |\[evidence: )([^\s|\];]+)(?= \||\]|$)/g)].map((m) => m[1]))]
      .filter((id) => data.evidence[id]);
    ids.forEach((id, i) => {
      if (i) out.append("; ");
      const srcs = data.evidence[id];
      out.append(el("code", {textContent: id}));
      const linked = srcs.filter((s) => s[1]);
      const shown = linked.length ? linked : srcs.slice(0, 1);
      out.append(" (", ...shown.flatMap((s, j) => [j ? ", " : "", s[1] ? el("a", {href: s[1], textContent: s[0],
        rel: "noopener"}) : s[0]]), ")");
    });
    return out;
  }

  async function answer(q) {
    const o = opEntry(q.arch, q.op);
    if (!o || !o.files[q.dtype]) return null;
    const data = await fetchJson(o.files[q.dtype]);
    const flat = data.answers[keyOf(q)];
    if (!flat) return {data: data, rows: null};
    const rows = [];
    const text = (i) => data.texts[i].map((f) => data.fragments[f]).join("");
    for (let i = 0; i < flat.length; i += 2) rows.push([data.backends[flat[i]], text(flat[i + 1])]);
    const n = rows.filter(([, t]) => t.startsWith("supported ")).length;
    let pos = 0;
    return {data: data, rows: rows.map(([b, t]) => [b, t.startsWith("supported ")
      ? t.replace("(#{} of {}, ", "(#" + (++pos) + " of " + n + ", ") : t])};
  }

  function render(q, res, title) {
    const box = el("div", {class: "am-answer", "data-key": q.arch + "/" + q.op + "/" + keyOf(q)});
    const a = archEntry(q.arch);
    box.append(el("h3", {textContent: (title ? title + ": " : "") + a.title + ", " + q.op + " " + q.dtype +
      ", head size " + dimsText([q.hd, q.hdv]) + ", " + (q.feats.length ? q.feats.join(" + ") : "no features")}));
    if (!res || !res.rows) {
      box.append(el("p", {class: "am-missing"}, "This combination is not among the published answers for " +
        q.arch + " " + q.op + " (every probed cell, the decision tables' and the presets' queries). The selector " +
        "answers it: ", el("code", {textContent: cliCommand(q)})));
      return box;
    }
    const sup = res.rows.filter(([, t]) => t.startsWith("supported "));
    const rest = res.rows.filter(([, t]) => !t.startsWith("supported "));
    if (!sup.length) box.append(el("p", {class: "am-none"}, "No backend is known to work for this query."));
    else {
      const body = sup.map(([b, t]) => {
        const m = t.match(/^supported \(#(\d+) of \d+, (\w+), (.*?)\); evidence: (.*)$/);
        const lat = t.match(/latency ([0-9.e+-]+) ms/);
        return el("tr", {"data-backend": b, "data-explain": t},
          el("td", {"data-label": "#", textContent: m[1]}),
          el("td", {"data-label": "Backend"}, (index.labels[b] || b) + " ", el("code", {textContent: b})),
          el("td", {"data-label": "Tier"}, m[2]),
          el("td", {"data-label": "Latency (ms)", textContent: lat ? sig2(Number(lat[1])) : "unmeasured"}),
          el("td", {"data-label": "Ordered by", textContent: m[3].replace(/^latency [0-9.e+-]+ ms, /, "")}),
          el("td", {"data-label": "Evidence"}, evidenceLinks(t, res.data)));
      });
      box.append(el("div", {class: "md-typeset__scrollwrap"}, el("div", {class: "md-typeset__table"},
        el("table", {class: "am-ranked"},
          el("thead", {}, el("tr", {}, ...["#", "Backend", "Tier", "Latency (ms)", "Ordered by", "Evidence"]
            .map((h) => el("th", {textContent: h})))),
          el("tbody", {}, ...body)))));
    }
    if (rest.length) {
      box.append(el("details", {class: "am-out"}, el("summary", {textContent: rest.length +
        " backends not supported or unknown here, each with its reason"}),
        el("ul", {}, ...rest.map(([b, t]) => el("li", {"data-backend": b, "data-explain": t},
          el("code", {textContent: b}), ": " + t + " ", evidenceLinks(t, res.data))))));
    }
    return box;
  }

  let runs = 0;  // a newer question's answer is never overwritten by an older one that finished later

  async function run() {
    const q = currentQuery();
    const out = $("am-result");
    const mine = ++runs;
    out.dataset.state = "loading";
    try {
      const preset = $("am-preset").value;
      const blocks = [];
      if (preset) {
        const p = index.presets.find((x) => x.name === preset);
        for (const layer of p.queries) {
          const lq = {arch: q.arch, op: layer.op, dtype: layer.dtype, hd: layer.head_dim, hdv: layer.head_dim_v,
                      feats: layer.features};
          blocks.push(render(lq, await answer(lq), layer.label));
        }
        if (p.source) blocks.push(el("p", {}, "Preset: " + p.name + " (", el("a", {href: p.source,
          textContent: p.source}), ")."));
      } else {
        blocks.push(render(q, await answer(q), ""));
      }
      if (mine !== runs) return;
      out.replaceChildren(...blocks);
      out.dataset.query = preset ? "preset:" + preset + "@" + q.arch : q.arch + "/" + q.op + "/" + keyOf(q);
      history.replaceState(null, "", "#" + new URLSearchParams({gpu: $("am-gpu").value, op: q.op,
        dtype: q.dtype, hd: $("am-hd").value, f: q.feats.join(","), preset: preset}).toString());
      out.dataset.state = "done";
    } catch (err) {
      if (mine !== runs) return;
      out.replaceChildren(el("p", {class: "am-error"}, "Could not load the answers: " + err.message));
      out.dataset.state = "error";
    }
  }

  function applyHash() {
    const h = new URLSearchParams(location.hash.slice(1));
    const set = (id, v) => { if (v !== null && [...$(id).options].some((o) => o.value === v)) $(id).value = v; };
    const gpu = h.get("gpu");  // "sm_100|B200", or an arch alone ("sm_100"): its first product
    if (gpu !== null) {
      const opt = [...$("am-gpu").options].find((o) => o.value === gpu) ||
        [...$("am-gpu").options].find((o) => o.value.split("|")[0] === gpu.split("|")[0]);
      if (opt) $("am-gpu").value = opt.value;
    }
    refreshControls();
    set("am-op", h.get("op")); refreshControls();
    set("am-dtype", h.get("dtype")); set("am-hd", h.get("hd"));
    if (h.get("f") !== null) {
      const f = new Set(h.get("f").split(",").filter(Boolean));
      $("am-flags").querySelectorAll("input").forEach((i) => { i.checked = f.has(i.value); });
      set("am-page", [...f].find((x) => x.startsWith("paged_kv:"))?.split(":")[1] || "");
      set("am-rope", [...f].find((x) => x.startsWith("qk_rope:"))?.split(":")[1] || "");
    }
    set("am-preset", h.get("preset"));
  }

  async function start() {
    try {
      index = await fetchJson("index.json");
    } catch (err) {
      $("am-result").textContent = "Could not load the published answers: " + err.message;
      return;
    }
    const gpus = [];
    for (const a of index.archs) {
      for (const p of a.products) gpus.push([a.arch + "|" + p, p + " (" + a.arch + ")"]);
      if (!a.products.length) gpus.push([a.arch + "|", a.arch]);
    }
    fillSelect($("am-gpu"), gpus);
    fillSelect($("am-preset"), [["", "no preset: the query below"], ...index.presets.map((p) => [p.name, p.family + " (" + p.name + ", tp=" + p.tp + ")"])]);
    applyHash();
    for (const id of ["am-gpu", "am-op"]) $(id).addEventListener("change", () => { refreshControls(); run(); });
    for (const id of ["am-dtype", "am-hd", "am-page", "am-rope", "am-preset"]) $(id).addEventListener("change", run);
    root.dataset.ready = "1";
    run();
  }
  start();
})();
