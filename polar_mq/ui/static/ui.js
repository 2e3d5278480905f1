// polar_mq dashboard: live updates through server-sent events.
// An element with data-live-src subscribes to that stream; each `update` event carries the
// server-rendered (escaped) HTML of the element's content, which replaces it. Nothing else runs
// here: every page works without this script, it only keeps the page current.
// Two small helpers besides: a call's request/response is fetched when its <details> is opened
// (as text/plain, put in with textContent: shown, never run), and a button with data-confirm
// asks before its form is posted.
"use strict";
(function () {
  function follow(el) {
    var source = new EventSource(el.getAttribute("data-live-src"));
    el.setAttribute("data-live", "connecting");
    source.addEventListener("open", function () { el.setAttribute("data-live", "open"); });
    source.addEventListener("update", function (event) {
      var data = JSON.parse(event.data);
      var open = Array.prototype.map.call(el.querySelectorAll("details[open]"), function (d) {
        return d.id;
      });
      el.innerHTML = data.html;
      open.forEach(function (id) {
        var d = id && document.getElementById(id);
        if (d) { d.open = true; }
      });
      var n = Number(el.getAttribute("data-updates") || "0") + 1;
      el.setAttribute("data-updates", String(n));
      if (data.done) { el.setAttribute("data-live", "done"); }
    });
    source.addEventListener("end", function () {
      el.setAttribute("data-live", "done");
      source.close();
    });
  }
  function loadLazy(event) {
    var d = event.target;
    if (!d.open || !d.querySelector) { return; }
    var pre = d.querySelector(":scope > pre[data-lazy-src]");
    if (!pre || pre.getAttribute("data-loaded")) { return; }
    pre.setAttribute("data-loaded", "loading");
    pre.textContent = "loading…";
    fetch(pre.getAttribute("data-lazy-src"), { credentials: "same-origin" })
      .then(function (r) {
        return r.text().then(function (text) {
          pre.textContent = r.ok ? text : "could not load (" + r.status + ")";
          pre.setAttribute("data-loaded", r.ok ? "yes" : "error");
        });
      })
      .catch(function () {
        pre.textContent = "could not load";
        pre.setAttribute("data-loaded", "error");
      });
  }
  document.addEventListener("toggle", loadLazy, true);  // toggle does not bubble: capture it
  document.addEventListener("submit", function (event) {
    var button = event.submitter || event.target.querySelector("[data-confirm]");
    var question = button && button.getAttribute("data-confirm");
    if (question && !window.confirm(question)) { event.preventDefault(); }
  }, true);
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live-src]").forEach(follow);
  });
})();
