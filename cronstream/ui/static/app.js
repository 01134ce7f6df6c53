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
  const source = new EventSource(section.getAttribute("data-live"));
  source.addEventListener("open", function () {
    if (state) { state.classList.add("on"); state.classList.remove("off"); }
  });
  source.addEventListener("error", function () {
    if (state) { state.classList.add("off"); state.classList.remove("on"); }
  });
  source.addEventListener("runs", function (event) {
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
  });
  window.addEventListener("pagehide", function () { source.close(); });
})();
