// The memory report's interactive chart: it redraws every authority's
// ledger from the data the page embeds, at the width of the window, over
// the time window chosen by zooming and panning, with the holders that are
// switched on. The state lives in the URL's fragment
// (#t0=..&t1=..&hide=a,b&cursor=..), so a view can be linked, and a
// headless browser can load one and dump the page.
(function () {
  "use strict";
  var el = document.getElementById("memreport-data");
  if (!el) { return; }
  var data = JSON.parse(el.textContent);
  var SVG = "http://www.w3.org/2000/svg";
  var tmax = 0;
  data.authorities.forEach(function (a) {
    if (a.times.length) { tmax = Math.max(tmax, a.times[a.times.length - 1]); }
    a.events.forEach(function (e) { tmax = Math.max(tmax, e.time); });
  });
  if (tmax <= 0) { tmax = 1; }
  var state = { t0: 0, t1: tmax, hide: {}, cursor: null, kinds: null };

  function fmtBytes(n) {
    if (n < 1024) { return n + " B"; }
    var u = ["KiB", "MiB", "GiB", "TiB", "PiB"], i = -1;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (Math.round(n * 100) / 100) + " " + u[i];
  }
  function fmtTime(t) { return (Math.round(t * 1000) / 1000).toString(); }
  function timeTicks(t0, t1) {
    var span = t1 - t0;
    if (span <= 0) { return [t0]; }
    var raw = span / 6, mag = Math.pow(10, Math.floor(Math.log10(raw))), step = mag;
    [1, 2, 5, 10].some(function (m) { if (m * mag >= raw) { step = m * mag; return true; } return false; });
    var out = [];
    for (var t = Math.ceil(t0 / step) * step; t <= t1 * (1 + 1e-9); t += step) { out.push(Math.round(t / step) * step); }
    return out;
  }
  function readHash() {
    var h = location.hash.replace(/^#/, "");
    h.split("&").forEach(function (kv) {
      var p = kv.split("="), k = p[0], v = decodeURIComponent(p[1] || "");
      if (k === "t0" && !isNaN(parseFloat(v))) { state.t0 = parseFloat(v); }
      if (k === "t1" && !isNaN(parseFloat(v))) { state.t1 = parseFloat(v); }
      if (k === "cursor" && !isNaN(parseFloat(v))) { state.cursor = parseFloat(v); }
      if (k === "hide" && v) { v.split(",").forEach(function (x) { state.hide[x] = true; }); }
      if (k === "kinds") { state.kinds = {}; v.split(",").forEach(function (x) { if (x) { state.kinds[x] = true; } }); }
    });
    clampWindow();
  }
  function writeHash() {
    var hidden = Object.keys(state.hide).filter(function (k) { return state.hide[k]; });
    var h = "t0=" + fmtTime(state.t0) + "&t1=" + fmtTime(state.t1);
    if (hidden.length) { h += "&hide=" + hidden.map(encodeURIComponent).join(","); }
    if (state.cursor !== null) { h += "&cursor=" + fmtTime(state.cursor); }
    if (state.kinds !== null) { h += "&kinds=" + Object.keys(state.kinds).filter(function (k) { return state.kinds[k]; }).sort().join(","); }
    if (history.replaceState) { history.replaceState(null, "", "#" + h); }
  }
  function clampWindow() {
    var w = state.t1 - state.t0;
    if (!(w > 0)) { state.t0 = 0; state.t1 = tmax; w = tmax; }
    w = Math.max(Math.min(w, tmax), tmax * 1e-6);
    state.t0 = Math.min(Math.max(state.t0, 0), tmax - w);
    state.t1 = state.t0 + w;
  }
  function mk(name, attrs, parent) {
    var e = document.createElementNS(SVG, name);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (parent) { parent.appendChild(e); }
    return e;
  }
  // index returns the last sample at or before t (the ledger holds from
  // one sample to the next), or 0.
  function index(times, t) {
    var lo = 0, hi = times.length - 1, best = 0;
    while (lo <= hi) {
      var mid = (lo + hi) >> 1;
      if (times[mid] <= t) { best = mid; lo = mid + 1; } else { hi = mid - 1; }
    }
    return best;
  }

  function draw(a, box) {
    var W = Math.max(box.clientWidth, 320), H = W < 700 ? 300 : 400;
    var L = W < 700 ? 64 : 84, R = 14, T = 26, B = 44, pw = W - L - R, ph = H - T - B;
    box.innerHTML = "";
    var svg = mk("svg", { "class": "timeline live", "data-authority": a.authority, width: W, height: H, viewBox: "0 0 " + W + " " + H,
      "data-t0": fmtTime(state.t0), "data-t1": fmtTime(state.t1) }, box);
    var span = state.t1 - state.t0;
    function x(t) { return L + (t - state.t0) / span * pw; }
    var layers = a.layers.filter(function (l) { return !(l.holder && state.hide[l.holder]); });
    var n = a.times.length, lo = Math.max(index(a.times, state.t0), 0), hi = Math.min(index(a.times, state.t1) + 1, n - 1);
    var vmax = 1;
    for (var i = lo; i <= hi; i++) {
      var s = 0;
      layers.forEach(function (l) { s += l.values[i]; });
      vmax = Math.max(vmax, s, a.capacity[i]);
    }
    vmax = niceCeil(vmax);
    function y(v) { return T + ph - v / vmax * ph; }
    var clipId = "clip-" + a.authority.replace(/[^A-Za-z0-9_-]/g, "_");
    var defs = mk("defs", {}, svg);
    var clip = mk("clipPath", { id: clipId }, defs);
    mk("rect", { x: L, y: T - 16, width: pw, height: ph + 16 }, clip);
    for (var k = 0; k <= 4; k++) {
      var v = vmax * k / 4;
      mk("line", { "class": "grid", x1: L, x2: L + pw, y1: y(v), y2: y(v) }, svg);
      mk("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end" }, svg).textContent = fmtBytes(Math.round(v));
    }
    timeTicks(state.t0, state.t1).forEach(function (t) {
      mk("line", { "class": "axis", x1: x(t), x2: x(t), y1: T + ph, y2: T + ph + 5 }, svg);
      mk("text", { "class": "tick", x: x(t), y: T + ph + 18, "text-anchor": "middle" }, svg).textContent = fmtTime(t);
    });
    mk("text", { x: L + pw / 2, y: H - 8, "text-anchor": "middle" }, svg).textContent = data.time_label;
    var g = mk("g", { "clip-path": "url(#" + clipId + ")" }, svg);
    var base = [];
    for (i = lo; i <= hi; i++) { base.push(0); }
    layers.forEach(function (l) {
      var top = [], pts = [];
      for (var i = lo; i <= hi; i++) { top.push(base[i - lo] + l.values[i]); pts.push(x(a.times[i]).toFixed(1) + "," + y(top[i - lo]).toFixed(1)); }
      for (i = hi; i >= lo; i--) { pts.push(x(a.times[i]).toFixed(1) + "," + y(base[i - lo]).toFixed(1)); }
      mk("polygon", { "class": "layer", "data-kind": l.kind, "data-holder": l.holder, fill: l.colour, "fill-opacity": String(l.opacity || 0.9), points: pts.join(" ") }, g);
      base = top;
    });
    var cap = [];
    for (i = lo; i <= hi; i++) {
      if (i > lo && a.capacity[i] !== a.capacity[i - 1]) { cap.push(x(a.times[i]).toFixed(1) + "," + y(a.capacity[i - 1]).toFixed(1)); }
      cap.push(x(a.times[i]).toFixed(1) + "," + y(a.capacity[i]).toFixed(1));
    }
    mk("polyline", { "class": "cap", points: cap.join(" ") }, g);
    var shown = 0, mg = mk("g", { "clip-path": "url(#" + clipId + ")" }, svg);
    a.events.forEach(function (e) {
      if (e.time < state.t0 || e.time > state.t1) { return; }
      shown++;
      var j = e.index;
      var m = mk("line", { "class": "mark", "data-kind": e.kind, "data-event": j, x1: x(e.time), x2: x(e.time), y1: T - 14, y2: T - 3, stroke: kindColour(e.kind) }, mg);
      m.addEventListener("click", function () { showRow(a.authority, j); });
    });
    svg.setAttribute("data-marks", shown);
    mk("line", { "class": "axis", x1: L, x2: L, y1: T, y2: T + ph }, svg);
    mk("line", { "class": "axis", x1: L, x2: L + pw, y1: T + ph, y2: T + ph }, svg);
    var cursor = mk("line", { "class": "cursor", x1: 0, x2: 0, y1: T, y2: T + ph, visibility: "hidden" }, svg);
    var sel = mk("rect", { "class": "sel", x: 0, y: T, width: 0, height: ph, visibility: "hidden" }, svg);
    var hit = mk("rect", { x: L, y: T, width: pw, height: ph, fill: "transparent" }, svg);
    svg.appendChild(mg); // the marks stay clickable above the hit area

    function tAt(ev) {
      var r = svg.getBoundingClientRect();
      return state.t0 + (ev.clientX - r.left - L) / pw * span;
    }
    function setCursor(t) {
      if (t === null) { cursor.setAttribute("visibility", "hidden"); return; }
      cursor.setAttribute("x1", x(t)); cursor.setAttribute("x2", x(t));
      cursor.setAttribute("visibility", t >= state.t0 && t <= state.t1 ? "visible" : "hidden");
    }
    setCursor(state.cursor);
    readout(a, state.cursor);
    var drag = null;
    hit.addEventListener("mousemove", function (ev) {
      var t = tAt(ev);
      state.cursor = t;
      redrawCursors();
      if (drag !== null) {
        sel.setAttribute("x", Math.min(x(drag), x(t))); sel.setAttribute("width", Math.abs(x(t) - x(drag)));
        sel.setAttribute("visibility", "visible");
      }
    });
    hit.addEventListener("mousedown", function (ev) { drag = tAt(ev); ev.preventDefault(); });
    hit.addEventListener("mouseup", function (ev) {
      var t = tAt(ev), d = drag;
      drag = null;
      sel.setAttribute("visibility", "hidden");
      if (d !== null && Math.abs(x(t) - x(d)) > 4) { setWindow(Math.min(d, t), Math.max(d, t)); }
    });
    hit.addEventListener("mouseleave", function () { drag = null; sel.setAttribute("visibility", "hidden"); });
    hit.addEventListener("dblclick", function () { setWindow(0, tmax); });
    hit.addEventListener("wheel", function (ev) {
      ev.preventDefault();
      var t = tAt(ev), f = ev.deltaY < 0 ? 0.8 : 1.25;
      if (ev.shiftKey) { var d = (ev.deltaY < 0 ? -0.1 : 0.1) * span; setWindow(state.t0 + d, state.t1 + d); return; }
      setWindow(t - (t - state.t0) * f, t + (state.t1 - t) * f);
    }, { passive: false });
    a.setCursor = setCursor;
  }

  function niceCeil(v) {
    var unit = 1;
    while (unit * 1024 <= v && unit < Math.pow(2, 50)) { unit *= 1024; }
    var ms = [1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 40, 50, 64, 80, 100, 128, 160, 200, 256, 320, 400, 500, 512, 640, 800, 1000, 1024];
    for (var i = 0; i < ms.length; i++) { if (ms[i] * unit >= v) { return ms[i] * unit; } }
    return 1024 * unit;
  }
  function kindColour(k) {
    return { pressure: "#c0392b", ticket: "#e67e22", offload: "#8e44ad", reload: "#2980b9", preemption: "#6d4c41", resume: "#27ae60" }[k] || "#7f8c8d";
  }

  function readout(a, t) {
    var out = document.querySelector(".readout[data-authority=\"" + a.authority + "\"]");
    if (!out) { return; }
    if (t === null || a.times.length === 0) { out.textContent = "Move over the chart for each holder's bytes; drag or wheel to zoom, shift+wheel to pan, double-click to reset."; return; }
    var i = index(a.times, t), parts = ["t = " + fmtTime(t) + " s"];
    a.layers.slice().reverse().forEach(function (l) {
      if (l.holder && state.hide[l.holder]) { return; }
      parts.push(l.label + " " + fmtBytes(l.values[i]));
    });
    parts.push("capacity " + fmtBytes(a.capacity[i]));
    out.textContent = parts.join(" \u00b7 ");
    out.setAttribute("data-time", fmtTime(t));
  }
  function redrawCursors() {
    data.authorities.forEach(function (a) { if (a.setCursor) { a.setCursor(state.cursor); } readout(a, state.cursor); });
    writeHash();
  }

  function filterRows() {
    document.querySelectorAll("table.events").forEach(function (tb) {
      var rows = tb.querySelectorAll("tr[data-time]"), shown = 0;
      rows.forEach(function (r) {
        var t = parseFloat(r.getAttribute("data-time")), h = r.getAttribute("data-holder");
        var kind = r.getAttribute("data-kind");
        var vis = t >= state.t0 && t <= state.t1 && !(h && state.hide[h] && kind !== "pressure") && kindShown(kind);
        r.className = (r.className.replace(/\bout\b/g, "") + (vis ? "" : " out")).trim();
        if (vis) { shown++; }
      });
      var c = document.querySelector(".events-count[data-authority=\"" + tb.getAttribute("data-authority") + "\"]");
      if (c) { c.textContent = shown + " of " + rows.length + " kept events in the window " + fmtTime(state.t0) + "\u2013" + fmtTime(state.t1) + " s"; }
    });
  }
  // kindShown says whether the events table lists events of kind: as the
  // fragment says, else as the page's kind boxes start.
  function kindShown(kind) {
    if (state.kinds !== null) { return !!state.kinds[kind]; }
    var c = document.querySelector("input.kind[data-kind=\"" + kind + "\"]");
    return !c || c.hasAttribute("checked");
  }
  function showRow(auth, j) {
    var r = document.querySelector("table.events[data-authority=\"" + auth + "\"] tr[data-event=\"" + j + "\"]");
    if (!r) { return; }
    document.querySelectorAll("tr.hit").forEach(function (x) { x.className = x.className.replace(/\bhit\b/g, "").trim(); });
    r.className += " hit";
    if (r.scrollIntoView) { r.scrollIntoView({ block: "nearest" }); }
  }

  function setWindow(t0, t1) {
    state.t0 = t0; state.t1 = t1;
    clampWindow();
    render();
  }
  function render() {
    data.authorities.forEach(function (a) {
      var box = document.querySelector(".chart[data-authority=\"" + a.authority + "\"]");
      if (box) { draw(a, box); }
    });
    var w = document.getElementById("window");
    if (w) { w.textContent = "window " + fmtTime(state.t0) + "\u2013" + fmtTime(state.t1) + " s of " + fmtTime(tmax) + " s"; }
    document.body.setAttribute("data-t0", fmtTime(state.t0));
    document.body.setAttribute("data-t1", fmtTime(state.t1));
    document.body.setAttribute("data-hidden", Object.keys(state.hide).filter(function (k) { return state.hide[k]; }).sort().join(","));
    document.querySelectorAll("input.toggle").forEach(function (c) { c.checked = !state.hide[c.getAttribute("data-holder")]; });
    document.querySelectorAll("input.kind").forEach(function (c) { c.checked = kindShown(c.getAttribute("data-kind")); });
    filterRows();
    writeHash();
  }

  readHash();
  document.querySelectorAll("input.toggle").forEach(function (c) {
    c.addEventListener("change", function () { state.hide[c.getAttribute("data-holder")] = !c.checked; render(); });
  });
  document.querySelectorAll("input.kind").forEach(function (c) {
    c.addEventListener("change", function () {
      if (state.kinds === null) {
        state.kinds = {};
        document.querySelectorAll("input.kind").forEach(function (o) { if (o.hasAttribute("checked")) { state.kinds[o.getAttribute("data-kind")] = true; } });
      }
      state.kinds[c.getAttribute("data-kind")] = c.checked;
      render();
    });
  });
  function button(id, f) { var b = document.getElementById(id); if (b) { b.addEventListener("click", f); } }
  button("zoom-in", function () { var m = (state.t0 + state.t1) / 2, w = (state.t1 - state.t0) / 4; setWindow(m - w, m + w); });
  button("zoom-out", function () { var m = (state.t0 + state.t1) / 2, w = state.t1 - state.t0; setWindow(m - w, m + w); });
  button("pan-left", function () { var w = (state.t1 - state.t0) / 4; setWindow(state.t0 - w, state.t1 - w); });
  button("pan-right", function () { var w = (state.t1 - state.t0) / 4; setWindow(state.t0 + w, state.t1 + w); });
  button("reset", function () { setWindow(0, tmax); });
  document.querySelectorAll("table.events tr[data-time]").forEach(function (r) {
    r.addEventListener("click", function () {
      var t = parseFloat(r.getAttribute("data-time")), w = Math.min(state.t1 - state.t0, tmax / 20);
      state.cursor = t;
      setWindow(t - w / 2, t + w / 2);
      showRow(r.closest("table").getAttribute("data-authority"), r.getAttribute("data-event"));
    });
  });
  var pending = null;
  window.addEventListener("resize", function () { if (pending) { clearTimeout(pending); } pending = setTimeout(render, 100); });
  document.body.classList.add("live");
  render();
})();
