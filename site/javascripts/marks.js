// attnmatrix: evidence marks are plain letters in the pages (V validated, C compiled, S shipped, D declared,
// X unsupported, ? unknown), so they read in any font; here each one in a table becomes a coloured badge whose
// title says what it means. Without JavaScript the letters and the page's legend still say it all.
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

  window.attnmatrixMarks = enhance;
  const run = () => enhance(document.querySelector(".md-content") || document.body);
  if (typeof document$ !== "undefined") document$.subscribe(run);
  else if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", run);
  else run();
})();
