/* tracepipe charts: SVG drawn from each chart's JSON spec (<script type="application/json"
   class="chart-spec">, made by pipeline/render/html/charts.py). Four kinds: bars, scatter,
   lines (zoom: drag across, double-click to zoom out), heatmap. Names from the trace are put on
   the page as text (textContent), never as markup. */
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var CHAR = 6.6; // px per character at the charts' font size, for laying out labels
  var DOTS = 60; // a line of at most this many points shows them

  // ---------------------------------------------------------------- elements
  function el(tag, attrs, parent) {
    var e = document.createElementNS(NS, tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (attrs[k] !== undefined && attrs[k] !== null) { e.setAttribute(k, String(attrs[k])); }
    });
    if (parent) { parent.appendChild(e); }
    return e;
  }
  function text(parent, x, y, s, anchor, cls) {
    var t = el("text", { x: x, y: y, "text-anchor": anchor || "start", "class": cls || null }, parent);
    t.textContent = s;
    return t;
  }
  function html(tag, cls, parent, s) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (s !== undefined) { e.textContent = s; }
    if (parent) { parent.appendChild(e); }
    return e;
  }
  // the names of a chart's series (when there are several) and lines (a swatch drawn as a line)
  function legend(box, series, lines) {
    var named = series.filter(function (s) { return s.name; });
    if (named.length < 2) { named = []; }
    var all = named.concat((lines || []).map(function (l) { return { name: l.name, color: l.color, line: l.dash ? "dash" : "solid" }; }));
    if (!all.length) { return; }
    var div = html("div", "legend", box);
    all.forEach(function (s) {
      var item = html("span", null, div);
      var sw = html("i", null, item);
      if (s.line) {
        sw.className = "line";
        sw.style.borderTop = "2px " + (s.line === "dash" ? "dashed " : "solid ") + s.color;
      } else {
        sw.style.background = s.color;
      }
      item.appendChild(document.createTextNode(s.name));
    });
  }

  // ---------------------------------------------------------------- numbers
  function sig(v) {
    var a = Math.abs(v);
    if (a >= 1000) { return Math.round(v).toLocaleString("en-US"); }
    if (a >= 100) { return v.toFixed(1); }
    if (a >= 10) { return v.toFixed(2); }
    if (a >= 0.001) { return v.toFixed(3); }
    return a ? v.toPrecision(2) : "0";
  }
  function trim(s) { return s.indexOf(".") >= 0 ? s.replace(/\.?0+$/, "") : s; }
  function duration(us) {
    var a = Math.abs(us);
    if (a >= 1e6) { return sig(us / 1e6) + " s"; }
    if (a >= 1e3) { return sig(us / 1e3) + " ms"; }
    return a ? sig(us) + " \u00b5s" : "0";
  }
  var PREFIX = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
  function eng(v, unit) {
    var a = Math.abs(v);
    for (var i = 0; i < PREFIX.length; i++) {
      if (a >= PREFIX[i][0]) { return trim((v / PREFIX[i][0]).toPrecision(3)) + " " + PREFIX[i][1] + unit; }
    }
    return (a ? trim(v.toPrecision(3)) : "0") + (unit ? " " + unit : "");
  }
  var FORMAT = {
    us: duration,
    pct: function (v) { return (Math.abs(v) < 0.05 && v ? "<0.1" : v.toFixed(1)) + "%"; },
    bytes: function (v) { return eng(v, "B"); },
    flops: function (v) { return eng(v, ""); },
    gbps: function (v) { return sig(v) + " GB/s"; },
    count: function (v) { return Math.round(v).toLocaleString("en-US"); },
    plain: sig
  };
  function fmt(unit, v) {
    if (v === null || v === undefined || isNaN(v)) { return ""; }
    return (FORMAT[unit] || FORMAT.plain)(v);
  }
  // ticks of an axis in `unit`: the values, their labels, and the unit they are written in
  function timeScale(span) {
    if (span >= 2e6) { return [1e6, "s"]; }
    if (span >= 2e3) { return [1e3, "ms"]; }
    return [1, "\u00b5s"];
  }
  function niceTicks(lo, hi, n) {
    var span = hi - lo;
    if (!(span > 0)) { return [lo]; }
    var step = Math.pow(10, Math.floor(Math.log(span / n) / Math.LN10));
    var err = span / n / step;
    if (err >= 7.5) { step *= 10; } else if (err >= 3.5) { step *= 5; } else if (err >= 1.5) { step *= 2; }
    var out = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) { out.push(+v.toPrecision(12)); }
    return out;
  }
  // ticks from lo up to the first at or above hi (an axis that holds every value)
  function coverTicks(lo, hi, n) {
    var t = niceTicks(lo, hi, n);
    if (t.length > 1 && t[t.length - 1] < hi) { t.push(+(2 * t[t.length - 1] - t[t.length - 2]).toPrecision(12)); }
    return t;
  }
  function logTicks(lo, hi) {
    var out = [];
    for (var e = Math.floor(Math.log(lo) / Math.LN10); e <= Math.ceil(Math.log(hi) / Math.LN10); e++) {
      var v = Math.pow(10, e);
      if (v >= lo * 0.999 && v <= hi * 1.001) { out.push(v); }
    }
    return out;
  }
  function tickText(unit, v, timeUnit) {
    if (unit === "us") { return trim(sig(v / timeUnit[0])); }
    if (unit === "bytes") { return eng(v, "B"); }
    if (unit === "count") { return eng(v, ""); }
    if (unit === "pct") { return trim(sig(v)) + "%"; }
    if (v && Math.abs(v) < 0.001) { return v.toExponential(0).replace("e-", "e\u2212"); }
    return eng(v, "");
  }
  function scale(lo, hi, a, b, log) {
    if (log) {
      var l0 = Math.log(lo), l1 = Math.log(hi);
      return function (v) { return a + (Math.log(v) - l0) / (l1 - l0 || 1) * (b - a); };
    }
    return function (v) { return a + (v - lo) / (hi - lo || 1) * (b - a); };
  }

  // ---------------------------------------------------------------- tooltip
  var tipBox = null;
  function showTip(e, lines) {
    if (!tipBox) { tipBox = html("div", null, document.body); tipBox.id = "tip"; }
    tipBox.textContent = "";
    lines.forEach(function (l) { html("div", null, tipBox, l); });
    tipBox.style.display = "block";
    var w = tipBox.offsetWidth, h = tipBox.offsetHeight;
    var x = e.clientX + 14, y = e.clientY + 14;
    if (x + w > window.innerWidth - 4) { x = Math.max(4, e.clientX - w - 14); }
    if (y + h > window.innerHeight - 4) { y = Math.max(4, e.clientY - h - 14); }
    tipBox.style.left = x + "px";
    tipBox.style.top = y + "px";
  }
  function hideTip() { if (tipBox) { tipBox.style.display = "none"; } }
  function tips(svg) {
    svg.addEventListener("mousemove", function (e) {
      var t = e.target;
      if (t && t.tip) { showTip(e, t.tip); } else if (!svg.live) { hideTip(); }
    });
    svg.addEventListener("mouseleave", hideTip);
  }

  // ---------------------------------------------------------------- axes
  function axes(svg, box, x, y, ticks) {
    var g = el("g", { "class": "grid" }, svg), a = el("g", { "class": "axis" }, svg);
    ticks.x.forEach(function (t) {
      var px = x.f(t);
      el("line", { x1: px, x2: px, y1: box.t, y2: box.t + box.h }, g);
      var s = x.labels ? (t === Math.round(t) && x.labels[t] !== undefined ? x.labels[t] : "") : tickText(x.unit, t, x.tu);
      text(a, px, box.t + box.h + 14, s, "middle");
    });
    ticks.y.forEach(function (t) {
      var py = y.f(t);
      el("line", { x1: box.l, x2: box.l + box.w, y1: py, y2: py }, g);
      text(a, box.l - 5, py + 3.5, tickText(y.unit, t, y.tu), "end");
    });
    el("path", { d: "M" + box.l + "," + box.t + "V" + (box.t + box.h) + "H" + (box.l + box.w), fill: "none" }, a);
    var xl = x.label + (x.unit === "us" ? " (" + x.tu[1] + ")" : "");
    text(a, box.l + box.w / 2, box.t + box.h + 30, xl, "middle");
    var yl = text(a, 0, 0, y.label + (y.unit === "us" ? " (" + y.tu[1] + ")" : ""), "middle");
    yl.setAttribute("transform", "translate(" + (box.l - 44) + "," + (box.t + box.h / 2) + ") rotate(-90)");
  }

  // ---------------------------------------------------------------- bars
  function drawBars(box, spec) {
    legend(box, spec.series);
    var W = Math.max(box.clientWidth || 600, 320);
    var rows = spec.rows;
    var longest = rows.reduce(function (m, r) { return Math.max(m, r.label.trim().length); }, 4);
    var labelW = Math.min(W * 0.42, 12 + CHAR * longest);
    var endW = 150;
    var plotW = Math.max(W - labelW - endW * (spec.signed ? 2 : 1), 80);
    var rowH = 22;
    var svg = el("svg", { width: W, height: rows.length * rowH + 6, role: "img", "aria-label": spec.title }, box);
    var totals = rows.map(function (r) { return r.values.reduce(function (s, v) { return s + v; }, 0); });
    var most = spec.max || Math.max.apply(null, totals.map(Math.abs).concat([1e-12]));
    var zero = spec.signed ? labelW + endW + plotW / 2 : labelW;
    var per = (spec.signed ? plotW / 2 : plotW) / most;
    if (spec.signed) { el("line", { x1: zero, x2: zero, y1: 0, y2: rows.length * rowH + 4, stroke: "#b8c0ca" }, svg); }
    rows.forEach(function (r, i) {
      var y = 3 + i * rowH;
      var sub = r.label.charAt(0) === " ";
      var lbl = text(svg, labelW - 6, y + 14, r.label.trim(), "end", sub ? "muted" : null);
      lbl.tip = [r.full.trim()];
      var x = zero;
      r.values.forEach(function (v, j) {
        if (!v) { return; }
        var w = Math.abs(v) * per;
        var left = v < 0 ? x - w : x;
        var s = spec.series[j] || {};
        var rect = el("rect", { x: left, y: y + 3, width: Math.max(w, 0.5), height: 15, rx: 2,
          fill: r.color || s.color || "#4c72b0", "class": "hit" }, svg);
        var share = totals[i] && r.values.length > 1 ? " (" + (100 * v / totals[i]).toFixed(1) + "%)" : "";
        rect.tip = (r.tip || [r.full.trim()]).concat([(s.name ? s.name + ": " : "") + fmt(spec.unit, v) + share]);
        if (v > 0) { x += w; } else { x -= w; }
      });
      var end = r.text !== undefined ? r.text : fmt(spec.unit, totals[i]);
      if (spec.signed && totals[i] < 0) {
        text(svg, Math.min(zero, x) - 4, y + 14, end, "end", "muted");
      } else {
        text(svg, Math.max(zero, x) + 5, y + 14, end, "start", "muted");
      }
    });
    tips(svg);
  }

  // ---------------------------------------------------------------- scatter
  function extent(values, log) {
    var v = values.filter(function (x) { return x !== null && isFinite(x) && (!log || x > 0); });
    if (!v.length) { return log ? [1, 10] : [0, 1]; }
    var lo = Math.min.apply(null, v), hi = Math.max.apply(null, v);
    if (log) {
      return [Math.pow(10, Math.floor(Math.log(lo) / Math.LN10)), Math.pow(10, Math.ceil(Math.log(hi * 1.6) / Math.LN10))];
    }
    var t = coverTicks(Math.min(0, lo), hi * 1.04 || 1, 5);
    return [Math.min(0, lo), t[t.length - 1]];
  }
  function drawScatter(box, spec) {
    legend(box, spec.series, spec.lines);
    var W = Math.max(box.clientWidth || 600, 320), H = 380;
    var b = { l: 64, t: 10, w: W - 64 - 16, h: H - 10 - 44 };
    var xs = [], ys = [];
    spec.points.forEach(function (p) { xs.push(p.x); ys.push(p.y); });
    var ptsX = xs.slice(), ptsY = ys.slice();
    spec.lines.forEach(function (l) { l.points.forEach(function (p) { xs.push(p[0]); ys.push(p[1]); }); });
    var xd = extent(spec.x.log ? ptsX.concat(xs) : xs, spec.x.log), yd = extent(ys, spec.y.log);
    if (spec.y.log) { yd[0] = Math.max(yd[0], Math.pow(10, Math.floor(Math.log(Math.min.apply(null, ptsY.filter(function (v) { return v > 0; }).concat([yd[1]]))) / Math.LN10))); }
    var svg = el("svg", { width: W, height: H, role: "img", "aria-label": spec.title }, box);
    var x = { f: scale(xd[0], xd[1], b.l, b.l + b.w, spec.x.log), unit: spec.x.unit, label: spec.x.label, tu: timeScale(xd[1]) };
    var y = { f: scale(yd[0], yd[1], b.t + b.h, b.t, spec.y.log), unit: spec.y.unit, label: spec.y.label, tu: timeScale(yd[1]) };
    axes(svg, b, x, y, {
      x: spec.x.log ? logTicks(xd[0], xd[1]) : niceTicks(xd[0], xd[1], 6),
      y: spec.y.log ? logTicks(yd[0], yd[1]) : coverTicks(yd[0], yd[1], 5)
    });
    var clip = el("clipPath", { id: "c" + Math.random().toString(36).slice(2) }, el("defs", {}, svg));
    el("rect", { x: b.l, y: b.t, width: b.w, height: b.h }, clip);
    var inner = el("g", { "clip-path": "url(#" + clip.id + ")" }, svg);
    spec.lines.forEach(function (l) {
      var d = l.points.map(function (p, i) { return (i ? "L" : "M") + x.f(p[0]).toFixed(1) + "," + y.f(p[1]).toFixed(1); }).join("");
      var path = el("path", { d: d, fill: "none", stroke: l.color, "stroke-width": 1.6, "stroke-dasharray": l.dash ? "5 4" : null, "class": "hit" }, inner);
      path.tip = [l.name];
    });
    spec.points.forEach(function (p) {
      if (p.x === null || p.y === null || (spec.x.log && p.x <= 0) || (spec.y.log && p.y <= 0)) { return; }
      var s = spec.series[p.s] || {};
      var c = el("circle", { cx: x.f(p.x).toFixed(1), cy: y.f(p.y).toFixed(1), r: p.r || 4, fill: s.color || "#4c72b0",
        "fill-opacity": 0.55, stroke: s.color || "#4c72b0" }, inner);
      c.tip = p.tip;
    });
    tips(svg);
  }

  // ---------------------------------------------------------------- lines (zoomable)
  function lowerBound(a, v) {
    var lo = 0, hi = a.length;
    while (lo < hi) { var mid = (lo + hi) >> 1; if (a[mid] < v) { lo = mid + 1; } else { hi = mid; } }
    return lo;
  }
  // whole-number ticks within the domain, one every k so that their labels do not overlap
  function labelTicks(dom, labels, width) {
    var lo = Math.max(0, Math.ceil(dom[0])), hi = Math.min(labels.length - 1, Math.floor(dom[1]));
    var longest = labels.reduce(function (m, l) { return Math.max(m, String(l).length); }, 1);
    var every = Math.max(1, Math.ceil((hi - lo + 1) * (CHAR * longest + 12) / Math.max(width, 1)));
    var out = [];
    for (var i = lo; i <= hi; i += every) { out.push(i); }
    return out;
  }
  function nearest(a, v) {
    var i = lowerBound(a, v);
    if (i >= a.length) { return a.length - 1; }
    return i > 0 && v - a[i - 1] < a[i] - v ? i - 1 : i;
  }
  function drawLines(box, spec) {
    spec.series.forEach(function (s) { if (!s.x) { s.x = spec.series[0].x; } });
    legend(box, spec.series);
    var all = [];
    spec.series.forEach(function (s) { if (s.x.length) { all.push(s.x[0], s.x[s.x.length - 1]); } });
    var full = all.length ? [Math.min.apply(null, all), Math.max.apply(null, all)] : [0, 1];
    if (full[1] <= full[0]) { full[1] = full[0] + 1; }
    var dom = box.zoom || full;
    var W = Math.max(box.clientWidth || 600, 320), H = 280;
    var b = { l: 64, t: 12, w: W - 64 - 16, h: H - 12 - 44 };
    var x = { f: scale(dom[0], dom[1], b.l, b.l + b.w, false), unit: spec.x.unit, label: spec.x.label, tu: timeScale(dom[1] - dom[0]), labels: spec.x.labels };
    var views = spec.series.map(function (s) {
      var i0 = Math.max(lowerBound(s.x, dom[0]) - 1, 0), i1 = Math.min(lowerBound(s.x, dom[1]) + 1, s.x.length);
      return { s: s, i0: i0, i1: i1 };
    });
    var top = 0;
    views.forEach(function (v) { for (var i = v.i0; i < v.i1; i++) { if (v.s.y[i] > top) { top = v.s.y[i]; } } });
    spec.marks.forEach(function (m) { if (m.x >= dom[0] && m.x <= dom[1] && m.y > top) { top = m.y; } });
    var yt = coverTicks(0, (top || 1) * 1.04, 5);
    var y = { f: scale(0, yt[yt.length - 1], b.t + b.h, b.t, false), unit: spec.y.unit, label: spec.y.label, tu: timeScale(top) };
    var svg = el("svg", { width: W, height: H, role: "img", "aria-label": spec.title }, box);
    axes(svg, b, x, y, { x: x.labels ? labelTicks(dom, x.labels, b.w) : niceTicks(dom[0], dom[1], 7), y: yt });
    var clip = el("clipPath", { id: "c" + Math.random().toString(36).slice(2) }, el("defs", {}, svg));
    el("rect", { x: b.l, y: b.t - 2, width: b.w, height: b.h + 4 }, clip);
    var inner = el("g", { "clip-path": "url(#" + clip.id + ")" }, svg);
    views.forEach(function (v) {
      var d = [], s = v.s;
      for (var i = v.i0; i < v.i1; i++) {
        var px = x.f(s.x[i]).toFixed(1), py = y.f(s.y[i]).toFixed(1);
        if (i === v.i0) { d.push("M" + px + "," + py); } else if (spec.step) { d.push("H" + px + "V" + py); } else { d.push("L" + px + "," + py); }
      }
      if (d.length) { el("path", { d: d.join(""), fill: "none", stroke: s.color, "stroke-width": 1.4 }, inner); }
      if (!spec.step && v.i1 - v.i0 <= DOTS) {
        for (var k = v.i0; k < v.i1; k++) { el("circle", { cx: x.f(s.x[k]), cy: y.f(s.y[k]), r: 2.5, fill: s.color }, inner); }
      }
    });
    spec.marks.forEach(function (m) {
      if (m.x < dom[0] || m.x > dom[1]) { return; }
      var px = x.f(m.x), py = y.f(m.y);
      el("circle", { cx: px, cy: py, r: 4, fill: "#b22222" }, svg);
      var right = px > b.l + b.w * 0.6;
      var where = spec.x.labels ? String(spec.x.labels[m.x] || "") : spec.x.unit === "us" ? duration(m.x) : sig(m.x);
      text(svg, px + (right ? -8 : 8), Math.max(py - 6, b.t + 10), m.label + ": " + fmt(spec.y.unit, m.y) + " at " + where, right ? "end" : "start");
    });
    var cross = el("line", { y1: b.t, y2: b.t + b.h, stroke: "#9aa5b1", "stroke-dasharray": "3 3", visibility: "hidden" }, svg);
    var sel = el("rect", { y: b.t, height: b.h, width: 0, "class": "sel", visibility: "hidden" }, svg);
    var pad = el("rect", { x: b.l, y: b.t, width: b.w, height: b.h, fill: "transparent", cursor: "crosshair" }, svg);
    var start = null;
    function at(e) { var r = svg.getBoundingClientRect(); return Math.min(Math.max(e.clientX - r.left, b.l), b.l + b.w); }
    function value(px) { return dom[0] + (px - b.l) / b.w * (dom[1] - dom[0]); }
    svg.live = true;
    pad.addEventListener("mousedown", function (e) { start = at(e); e.preventDefault(); });
    pad.addEventListener("mousemove", function (e) {
      var px = at(e), t = value(px);
      cross.setAttribute("x1", px); cross.setAttribute("x2", px); cross.setAttribute("visibility", "visible");
      if (start !== null) {
        sel.setAttribute("x", Math.min(start, px)); sel.setAttribute("width", Math.abs(px - start));
        sel.setAttribute("visibility", "visible");
      }
      var lines = [spec.x.labels ? String(spec.x.labels[Math.max(0, Math.round(t))] || "") : spec.x.unit === "us" ? duration(t) + " from the first event" : spec.x.label + " " + sig(t)];
      spec.series.forEach(function (s) {
        var i = spec.step ? lowerBound(s.x, t + 1e-9) - 1 : nearest(s.x, t);
        if (i >= 0) { lines.push(s.name + ": " + fmt(spec.y.unit, s.y[i])); }
      });
      showTip(e, lines);
    });
    pad.addEventListener("mouseleave", function () { cross.setAttribute("visibility", "hidden"); hideTip(); });
    svg.addEventListener("mouseup", function (e) {
      if (start === null) { return; }
      var end = at(e), a = Math.min(start, end), z = Math.max(start, end);
      start = null;
      sel.setAttribute("visibility", "hidden");
      if (z - a > 4) { box.zoom = [value(a), value(z)]; redraw(box); }
    });
    pad.addEventListener("dblclick", function () { if (box.zoom) { box.zoom = null; redraw(box); } });
    if (box.zoom) {
      var out = html("button", null, box, "zoom out");
      out.type = "button";
      out.addEventListener("click", function () { box.zoom = null; redraw(box); });
    }
  }

  // ---------------------------------------------------------------- heat map
  function heat(v, most) {
    var t = most > 0 ? Math.min(Math.max(v / most, 0), 1) : 0;
    var a = [255, 245, 235], z = [127, 39, 4];
    var c = a.map(function (x, i) { return Math.round(x + (z[i] - x) * Math.pow(t, 0.8)); });
    return "rgb(" + c.join(",") + ")";
  }
  function drawHeatmap(box, spec) {
    var W = Math.max(box.clientWidth || 600, 320);
    var rows = spec.rows, cols = spec.cols;
    var labelW = 16 + CHAR * Math.max(rows.reduce(function (m, r) { return Math.max(m, String(r).length); }, 2), spec.rowLabel.length);
    var cw = Math.max(3, Math.min(96, (W - labelW - 12) / Math.max(cols.length, 1)));
    var chh = rows.length > 48 ? Math.max(3, Math.floor(720 / rows.length)) : 20;
    var longestCol = cols.reduce(function (m, c) { return Math.max(m, String(c).length); }, 1);
    var rotate = cw < CHAR * longestCol + 6;
    var bottom = rotate ? Math.min(14 + CHAR * longestCol * 0.75, 120) : 22;
    var H = 20 + rows.length * chh + bottom + 34;
    var svg = el("svg", { width: W, height: H, role: "img", "aria-label": spec.title }, box);
    var most = 0;
    spec.values.forEach(function (r) { r.forEach(function (v) { if (v !== null && v > most) { most = v; } }); });
    text(svg, labelW - 6, 13, spec.rowLabel, "end", "muted");
    var everyRow = Math.max(1, Math.ceil(12 / chh)), everyCol = Math.max(1, Math.ceil(12 / cw));
    rows.forEach(function (r, i) {
      var y = 20 + i * chh;
      if (i % everyRow === 0) { text(svg, labelW - 6, y + chh / 2 + 4, String(r), "end"); }
      cols.forEach(function (c, j) {
        var v = spec.values[i][j];
        var rect = el("rect", { x: labelW + j * cw, y: y, width: Math.max(cw - 1, 1), height: Math.max(chh - 1, 1),
          fill: v === null ? "#eef0f3" : heat(v, most), "class": "hit" }, svg);
        rect.tip = [spec.rowLabel + " " + r + ", " + spec.colLabel + " " + c, v === null ? "no value" : fmt(spec.unit, v)];
        if (v && cw >= 46 && chh >= 16) {
          var t = text(svg, labelW + j * cw + cw / 2, y + chh / 2 + 4, fmt(spec.unit, v), "middle");
          if (most && v / most > 0.55) { t.setAttribute("style", "fill:#fff"); }
          t.setAttribute("pointer-events", "none");
        }
      });
    });
    var yb = 20 + rows.length * chh;
    cols.forEach(function (c, j) {
      if (j % everyCol !== 0) { return; }
      var x = labelW + j * cw + cw / 2;
      var t = text(svg, x, yb + 12, String(c), rotate ? "end" : "middle", "muted");
      if (rotate) { t.setAttribute("transform", "rotate(-40 " + x + " " + (yb + 8) + ")"); }
    });
    var ly = yb + bottom + 12;
    text(svg, labelW, ly + 10, "columns: " + spec.colLabel, "start", "muted");
    var sx = labelW + CHAR * (spec.colLabel.length + 14);
    text(svg, sx - 6, ly + 10, "0", "end", "muted");
    for (var k = 0; k <= 10; k++) { el("rect", { x: sx + k * 14, y: ly, width: 14, height: 12, fill: heat(most * k / 10, most) }, svg); }
    text(svg, sx + 11 * 14 + 6, ly + 10, fmt(spec.unit, most), "start", "muted");
    tips(svg);
  }

  // ---------------------------------------------------------------- all charts
  var KINDS = { bars: drawBars, scatter: drawScatter, lines: drawLines, heatmap: drawHeatmap };
  function redraw(box) {
    box.textContent = "";
    try {
      KINDS[box.spec.kind](box, box.spec);
    } catch (err) {
      box.textContent = "This chart could not be drawn: " + err;
      if (window.console) { console.error("tracepipe chart:", err); }
    }
  }
  function drawAll() {
    Array.prototype.forEach.call(document.querySelectorAll("script.chart-spec"), function (s) {
      var box = s.parentNode.querySelector(".plot");
      if (!box.spec) { box.spec = JSON.parse(s.textContent); }
      redraw(box);
    });
  }
  var width = window.innerWidth, pending = null;
  window.addEventListener("resize", function () {
    if (window.innerWidth === width) { return; }
    width = window.innerWidth;
    clearTimeout(pending);
    pending = setTimeout(drawAll, 200);
  });
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", drawAll); } else { drawAll(); }
})();
