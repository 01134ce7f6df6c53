// cronstream dashboard: the only script. Live Runs over server-sent events; nothing
// else needs JavaScript (actions are plain forms). No inline script anywhere: the
// Content-Security-Policy allows scripts from this origin only.
"use strict";

(function () {
  const section = document.querySelector("[data-live]");
  if (!section || !window.EventSource) {
    return;
  }
  const state = document.getElementById("live-state");
  let source = null;
  function show(on) {
    if (state) { state.classList.toggle("on", on); state.classList.toggle("off", !on); }
  }
  function render(event) {
    let view;
    try {
      view = JSON.parse(event.data);
    } catch (e) {
      return;
    }
    // Each section's rows are rendered and escaped by the server.
    for (const name of ["running", "queued", "awaiting", "recent"]) {
      const body = section.querySelector('tbody[data-section="' + name + '"]');
      if (body && typeof view[name] === "string") {
        body.innerHTML = view[name];
      }
    }
    for (const [status, n] of Object.entries(view.counts || {})) {
      const el = section.querySelector('[data-count="' + status + '"]');
      if (el) { el.textContent = String(n); }
    }
    document.body.setAttribute("data-live-updates",
      String(Number(document.body.getAttribute("data-live-updates") || "0") + 1));
  }
  function connect() {
    source = new EventSource(section.getAttribute("data-live"));
    source.addEventListener("open", function () { show(true); });
    source.addEventListener("runs", render);
    source.addEventListener("error", function () {
      show(false);
      // A dropped stream reconnects by itself; a refused one (503: the server's stream
      // cap) is closed for good: come back in 10 to 30 s, not all at once.
      if (source.readyState === EventSource.CLOSED) {
        window.setTimeout(connect, 10000 + Math.random() * 20000);
      }
    });
  }
  connect();
  window.addEventListener("pagehide", function () { if (source) { source.close(); } });
})();

// The execution page's log, live while the execution runs: each event replaces the
// lines (rendered and escaped by the server) and the traceback; the stream ends with the
// execution's log.
(function () {
  const section = document.querySelector("[data-log-live]");
  if (!section || !window.EventSource) {
    return;
  }
  const pre = section.querySelector("[data-log-lines]");
  const count = section.querySelector("[data-log-count]");
  const traceback = section.querySelector("[data-traceback]");
  const state = document.getElementById("log-state");
  let source = null;
  function render(event) {
    let view;
    try {
      view = JSON.parse(event.data);
    } catch (e) {
      return;
    }
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    if (typeof view.lines === "string") { pre.innerHTML = view.lines; }
    if (atBottom) { pre.scrollTop = pre.scrollHeight; }
    if (count) { count.textContent = String(view.count) + " lines" + (view.cut ? ", the last shown" : ""); }
    const badge = document.querySelector("h1 .status");
    if (badge && view.status && badge.textContent !== view.status) {
      badge.textContent = view.status;
      badge.className = "status st-" + view.status.toLowerCase().replace(/_/g, "-");
    }
    if (traceback && view.traceback) {
      traceback.hidden = false;
      traceback.querySelector("[data-traceback-text]").textContent = view.traceback;
    }
    document.body.setAttribute("data-log-updates",
      String(Number(document.body.getAttribute("data-log-updates") || "0") + 1));
    if (!view.live) {
      source.close();
      if (state) { state.classList.remove("on"); state.textContent = "ended"; }
      document.body.setAttribute("data-log-ended", "true");
    }
  }
  function connect() {
    source = new EventSource(section.getAttribute("data-log-live"));
    source.addEventListener("open", function () { if (state) { state.classList.add("on"); } });
    source.addEventListener("log", render);
    source.addEventListener("error", function () {
      if (state) { state.classList.remove("on"); }
      if (source.readyState === EventSource.CLOSED && document.body.getAttribute("data-log-ended") !== "true") {
        window.setTimeout(connect, 10000 + Math.random() * 20000);
      }
    });
  }
  connect();
  window.addEventListener("pagehide", function () { if (source) { source.close(); } });
})();
