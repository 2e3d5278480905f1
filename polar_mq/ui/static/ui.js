// polar_mq dashboard: live updates through server-sent events.
// An element with data-live-src subscribes to that stream; each `update` event carries the
// server-rendered (escaped) HTML of the element's content, which replaces it. Nothing else runs
// here: every page works without this script, it only keeps the page current.
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
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live-src]").forEach(follow);
  });
})();
