// cronstream dashboard: the only script. Live views over server-sent events (the Runs
// page, an execution's log); nothing else needs JavaScript (actions are plain forms). No
// inline script anywhere: the Content-Security-Policy allows scripts from this origin only.
"use strict";

// Follow the server-sent events `name` of `url`: `render(view)` with each one's JSON (the
// HTML in it is rendered and escaped by the server); `show(on)` says whether the stream is
// up. A dropped stream reconnects by itself; a refused one (503: the server's stream cap)
// is closed for good: come back in 10 to 30 s, not all at once. Returns a way to stop.
function follow(url, name, render, show) {
  let source = null;
  let stopped = false;
  function connect() {
    source = new EventSource(url);
    source.addEventListener("open", function () { show(true); });
    source.addEventListener(name, function (event) {
      let view;
      try {
        view = JSON.parse(event.data);
      } catch (e) {
        return;
      }
      render(view);
    });
    source.addEventListener("error", function () {
      show(false);
      if (source.readyState === EventSource.CLOSED && !stopped) {
        window.setTimeout(connect, 10000 + Math.random() * 20000);
      }
    });
  }
  function stop() {
    stopped = true;
    if (source) { source.close(); }
  }
  connect();
  window.addEventListener("pagehide", stop);
  return stop;
}

function counted(attribute) {
  document.body.setAttribute(attribute, String(Number(document.body.getAttribute(attribute) || "0") + 1));
}

// The Runs page: each event replaces the rows of every section and the counts.
(function () {
  const section = document.querySelector("[data-live]");
  if (!section || !window.EventSource) {
    return;
  }
  const state = document.getElementById("live-state");
  follow(section.getAttribute("data-live"), "runs", function (view) {
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
    counted("data-live-updates");
  }, function (on) {
    if (state) { state.classList.toggle("on", on); state.classList.toggle("off", !on); }
  });
})();

// The execution page's log, live while the execution runs: each event replaces the lines,
// the traceback and the status; the stream ends with the execution's log.
(function () {
  const section = document.querySelector("[data-log-live]");
  if (!section || !window.EventSource) {
    return;
  }
  const pre = section.querySelector("[data-log-lines]");
  const count = section.querySelector("[data-log-count]");
  const traceback = section.querySelector("[data-traceback]");
  const state = document.getElementById("log-state");
  const stop = follow(section.getAttribute("data-log-live"), "log", function (view) {
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
    counted("data-log-updates");
    if (!view.live) {
      stop();
      if (state) { state.classList.remove("on"); state.textContent = "ended"; }
      document.body.setAttribute("data-log-ended", "true");
    }
  }, function (on) {
    if (state) { state.classList.toggle("on", on); }
  });
})();
