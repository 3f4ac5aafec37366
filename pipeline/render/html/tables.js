/* tracepipe tables: sort by a column (click its header), filter rows (the box above a table),
   the whole of a shortened value on hover. Every value is read from a cell's data-value; nothing
   here writes markup (text only). */
(function () {
  "use strict";

  function sortKey(cell, numeric) {
    var v = cell ? cell.getAttribute("data-value") : "";
    if (numeric) {
      var x = v === "" || v === null ? NaN : parseFloat(v);
      return isNaN(x) ? null : x;
    }
    return v === "" || v === null ? null : v.toLowerCase();
  }

  function sortBy(th) {
    var table = th.closest("table");
    var body = table.tBodies[0];
    if (!body) { return; }
    var idx = th.cellIndex;
    var numeric = th.classList.contains("num");
    var rows = Array.prototype.slice.call(body.rows);
    if (!body.hasAttribute("data-ordered")) {
      rows.forEach(function (r, i) { r.setAttribute("data-i", String(i)); });
      body.setAttribute("data-ordered", "1");
    }
    var was = th.getAttribute("aria-sort");
    var first = numeric ? "descending" : "ascending";
    var second = numeric ? "ascending" : "descending";
    var next = was === first ? second : was === second ? "none" : first;
    Array.prototype.forEach.call(th.parentNode.cells, function (c) { c.removeAttribute("aria-sort"); });
    var keyed = rows.map(function (r) {
      return { k: sortKey(r.cells[idx], numeric), i: +r.getAttribute("data-i"), r: r };
    });
    var dir = next === "descending" ? -1 : 1;
    keyed.sort(function (a, b) {
      if (next === "none") { return a.i - b.i; }
      if (a.k === b.k) { return a.i - b.i; }
      if (a.k === null) { return 1; }
      if (b.k === null) { return -1; }
      return (a.k < b.k ? -1 : 1) * dir;
    });
    if (next !== "none") { th.setAttribute("aria-sort", next); }
    var frag = document.createDocumentFragment();
    keyed.forEach(function (x) { frag.appendChild(x.r); });
    body.appendChild(frag);
  }

  function rowText(r) {
    var t = r.tpText;
    if (t === undefined) {
      var parts = [];
      Array.prototype.forEach.call(r.cells, function (c) {
        parts.push(c.getAttribute("data-value") || "", c.textContent);
      });
      t = parts.join(" ").toLowerCase();
      r.tpText = t;
    }
    return t;
  }

  function filter(input) {
    var box = input.closest(".tbl");
    var terms = input.value.toLowerCase().split(/\s+/).filter(Boolean);
    var body = box.querySelector("tbody");
    var shown = 0;
    Array.prototype.forEach.call(body.rows, function (r) {
      var t = terms.length ? rowText(r) : "";
      var ok = terms.every(function (w) {
        return w.charAt(0) === "-" && w.length > 1 ? t.indexOf(w.slice(1)) < 0 : t.indexOf(w) >= 0;
      });
      r.classList.toggle("hidden", !ok);
      if (ok) { shown += 1; }
    });
    var count = box.querySelector(".count");
    if (count) {
      var total = +count.getAttribute("data-rows");
      count.textContent = terms.length ? shown.toLocaleString() + " of " + total.toLocaleString() + " rows"
        : total.toLocaleString() + (total === 1 ? " row" : " rows");
    }
  }

  document.addEventListener("click", function (e) {
    var th = e.target.closest && e.target.closest(".tbl thead th");
    if (th) { sortBy(th); }
  });

  document.addEventListener("keydown", function (e) {
    var th = (e.key === "Enter" || e.key === " ") && e.target.closest && e.target.closest(".tbl thead th");
    if (th) { e.preventDefault(); sortBy(th); }
  });

  var timer = null;
  document.addEventListener("input", function (e) {
    var input = e.target;
    if (!input.classList || !input.classList.contains("filter")) { return; }
    clearTimeout(timer);
    timer = setTimeout(function () { filter(input); }, 120);
  });

  document.addEventListener("mouseover", function (e) {
    var td = e.target.closest && e.target.closest("td.cut");
    if (!td || td.hasAttribute("title")) { return; }
    var v = td.getAttribute("data-value") || "";
    if (v.charAt(0) === "[") {
      try { v = JSON.parse(v).join("\n\u2192 "); } catch (err) { /* not a list: shown as it is */ }
    }
    td.setAttribute("title", v);
  });
})();
