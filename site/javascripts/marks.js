// attnmatrix: evidence marks are plain letters in the pages (V validated, C compiled, S shipped, D declared,
// X unsupported, ? unknown), so they read in any font; here each one in a table becomes a coloured badge whose
// title says what it means, and reason and source ids get their text as a preview. Without JavaScript the
// letters and the page's legend still say it all.
(function () {
  "use strict";
  const MEANING = {V: "validated", C: "compiled", S: "shipped", D: "declared", X: "unsupported", "?": "unknown"};
  const TOKEN = /(^|[\s(])([VCSDX?])(?=[\s,;)]|$)/g;

  function badge(mark) {
    const span = document.createElement("span");
    span.className = "am-mark am-mark-" + MEANING[mark];
    span.title = MEANING[mark];
    span.textContent = mark;
    return span;
  }

  function enhance(root) {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    const nodes = [];
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      const p = n.parentElement;
      if (!p || p.closest("code, pre, .am-mark, .am-nomarks")) continue;
      if (!p.closest("td, th, .am-legend")) continue;
      TOKEN.lastIndex = 0;
      if (TOKEN.test(n.nodeValue)) nodes.push(n);
    }
    for (const n of nodes) {
      const frag = document.createDocumentFragment();
      let last = 0;
      const text = n.nodeValue;
      TOKEN.lastIndex = 0;
      for (let m = TOKEN.exec(text); m; m = TOKEN.exec(text)) {
        const at = m.index + m[1].length;
        frag.append(text.slice(last, at), badge(m[2]));
        last = at + 1;
      }
      frag.append(text.slice(last));
      n.replaceWith(frag);
    }
  }

  // Reason and source ids (`r3fa`, `s9e2`) link to the page's lists: their title previews the text.
  function previews(root) {
    for (const a of root.querySelectorAll('a[href^="#r"], a[href^="#s"]')) {
      const target = document.getElementById(decodeURIComponent(a.getAttribute("href").slice(1)));
      const item = target && target.closest("li");
      if (item && !a.title) a.title = item.textContent.replace(/\s+/g, " ").trim().slice(0, 400);
    }
  }

  window.attnmatrixMarks = enhance;
  const run = () => {
    const root = document.querySelector(".md-content") || document.body;
    enhance(root);
    previews(root);
  };
  if (typeof document$ !== "undefined") document$.subscribe(run);
  else if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", run);
  else run();
})();
