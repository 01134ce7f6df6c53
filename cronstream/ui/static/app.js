// cronstream dashboard: the only script. Live views over server-sent events (the Runs
// page, an execution's log), and the trigger's params checked before they are sent;
// nothing else needs JavaScript (actions are plain forms, which the server checks again).
// No inline script anywhere: the Content-Security-Policy allows scripts from this origin
// only.
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
    for (const name of ["running", "queued", "waiting", "awaiting", "recent"]) {
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

// The trigger's params: a JSON object (the job's params, edited), checked before the form
// is sent; what is wrong is said next to the field, and nothing is sent.
(function () {
  const LIMIT = 64 * 1024;  // bytes of JSON, as a definition's params
  for (const form of document.querySelectorAll("form[data-params-form]")) {
    const field = form.querySelector("[data-params]");
    const error = form.querySelector("[data-params-error]");
    if (!field || !error) { continue; }
    const problem = function () {
      const text = field.value.trim();
      if (text === "") { return null; }
      let value;
      try {
        value = JSON.parse(text);
      } catch (e) {
        return "params: not valid JSON: " + e.message;
      }
      if (value === null || typeof value !== "object" || Array.isArray(value)) {
        return "params: must be a JSON object ({\"key\": value, ...})";
      }
      const size = new TextEncoder().encode(JSON.stringify(value)).length;
      if (size > LIMIT) {
        return "params: " + size + " bytes of JSON; the limit is " + LIMIT;
      }
      return null;
    };
    const show = function (message) {
      error.textContent = message || "";
      error.hidden = !message;
      field.setAttribute("aria-invalid", message ? "true" : "false");
    };
    field.addEventListener("input", function () { if (!error.hidden) { show(problem()); } });
    form.addEventListener("submit", function (event) {
      const message = problem();
      if (message) {
        event.preventDefault();
        form.querySelector("details").open = true;
        show(message);
        field.focus();
      }
    });
  }
})();
