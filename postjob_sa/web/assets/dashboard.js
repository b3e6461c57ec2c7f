// postjob dashboard: live regions without a full reload, and relative times.
// The server renders every fragment; this script only fetches them again and swaps the ones
// whose content changed. No framework, no build step, nothing loaded from elsewhere.
"use strict";
(function () {
  var body = document.body;
  var every = parseFloat(body.getAttribute("data-refresh") || "0") * 1000;
  var offset = 0; // the database's clock minus this browser's, in ms
  var etag = null;
  var busy = false;
  var state = document.getElementById("live-state");

  function setNow(iso) {
    var t = Date.parse(iso || "");
    if (!isNaN(t)) offset = t - Date.now();
  }

  function span(seconds) {
    var s = Math.round(seconds);
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
    if (s < 86400) return Math.floor(s / 3600) + "h" + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
    return Math.floor(s / 86400) + "d" + String(Math.floor(s % 86400 / 3600)).padStart(2, "0") + "h";
  }

  function relativeTimes(root) {
    var now = Date.now() + offset;
    root.querySelectorAll("time[data-rel]").forEach(function (el) {
      var t = Date.parse(el.getAttribute("datetime"));
      if (isNaN(t)) return;
      if (!el.title) el.title = el.textContent;
      var d = (now - t) / 1000;
      el.textContent = d >= 0 ? span(d) + " ago" : "in " + span(-d);
    });
  }

  // A region someone is typing in is left alone until they are done.
  function editing(region) {
    var active = document.activeElement;
    if (active && active !== body && region.contains(active) && active.matches("input, textarea, select")) return true;
    var fields = region.querySelectorAll("input, textarea");
    for (var i = 0; i < fields.length; i++) {
      if (fields[i].type !== "hidden" && fields[i].value !== fields[i].defaultValue) return true;
    }
    return false;
  }

  function mark(name, text) {
    if (!state) return;
    state.className = "live-state " + name;
    state.textContent = text;
  }

  function swap(html) {
    var doc = new DOMParser().parseFromString(html, "text/html");
    var complete = true;
    doc.querySelectorAll("[data-fragment]").forEach(function (fresh) {
      var name = fresh.getAttribute("data-fragment");
      var old = document.querySelector('[data-fragment="' + name + '"]');
      if (!old || old.getAttribute("data-hash") === fresh.getAttribute("data-hash")) return;
      if (editing(old)) { complete = false; return; }
      var node = document.importNode(fresh, true);
      old.replaceWith(node);
      relativeTimes(node);
    });
    return complete;
  }

  function poll() {
    if (busy || document.hidden || !document.querySelector("[data-fragment]")) return;
    busy = true;
    var url = new URL(window.location.href);
    url.searchParams.set("live", "1");
    url.searchParams.delete("done");
    var headers = { "Accept": "text/html" };
    if (etag) headers["If-None-Match"] = etag;
    fetch(url.toString(), { headers: headers, credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        setNow(response.headers.get("X-Postjob-Now"));
        if (response.status === 304) return null;
        if (!response.ok) throw new Error("HTTP " + response.status);
        var tag = response.headers.get("ETag");
        return response.text().then(function (html) { etag = swap(html) ? tag : null; });
      })
      .then(function () { mark("live", "live · " + new Date().toLocaleTimeString()); })
      .catch(function () { mark("offline", "offline"); })
      .then(function () { busy = false; });
  }

  setNow(body.getAttribute("data-now"));
  relativeTimes(document);
  window.setInterval(function () { relativeTimes(document); }, 1000);
  if (every > 0) {
    mark("live", "live");
    window.setInterval(poll, every);
    document.addEventListener("visibilitychange", function () { if (!document.hidden) poll(); });
  }
})();
