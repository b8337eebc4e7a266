// The task page's live parts: the log tail and the state, pushed over a websocket
// (portal/consumers.py); when the state or reason changes, the page's changing parts are
// fetched as the server renders them (portal:task_parts) and swapped in, so the page never
// disagrees with a reload. Without JavaScript the page still shows everything but the live log.
(function () {
  "use strict";
  const root = document.getElementById("task");
  if (!root) return;
  const text = document.getElementById("log-text");
  const status = document.getElementById("log-status");
  const follow = document.getElementById("log-follow");
  const pause = document.getElementById("log-pause");
  const picker = document.getElementById("log-attempt");
  const download = document.getElementById("log-download");
  let socket = null;
  let paused = false;
  let held = [];
  let retry = 500;
  // From Django's JavaScript catalogue (/jsi18n/), loaded before this script.
  const gettext = (t) => (window.django && window.django.gettext ? window.django.gettext(t) : t);
  const interpolate = (format, values) => format.replace(/%\((\w+)\)s/g, (_, key) => String(values[key]));

  // The state and reason the swappable parts were rendered at (portal/task/_head.html).
  function rendered() {
    const head = document.getElementById("task-head");
    return head ? head.dataset.state + "\n" + head.dataset.reason : "";
  }

  // A changed task (state, reason) brings new facts, GPUs, timeline entries, attempts and
  // charts: fetch them as the server renders them (portal:task_parts) and swap them in,
  // leaving the log as it is. One fetch at a time; a change heard meanwhile fetches again.
  let fetching = false;
  let again = false;
  async function refreshParts() {
    if (fetching) { again = true; return; }
    fetching = true;
    try {
      do {
        again = false;
        const response = await fetch(root.dataset.parts, { credentials: "same-origin" });
        if (!response.ok) break;
        const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
        fresh.querySelectorAll("[data-live-part]").forEach(function (part) {
          const old = document.getElementById(part.id);
          if (old) old.replaceWith(document.importNode(part, true));
        });
        tickRuntime();
        document.dispatchEvent(new CustomEvent("gp:task-parts"));
      } while (again);
    } catch (error) {
      // A network hiccup: the next change (or the socket's reconnect) fetches again.
    } finally {
      fetching = false;
    }
  }

  // Runtime counts on while the task runs: from the seconds the server counted when it
  // rendered the cell, by this browser's monotonic clock (no clock skew between the two).
  const runtimeSince = new WeakMap();
  function duration(seconds) {
    let rest = Math.max(0, Math.floor(seconds));
    const d = Math.floor(rest / 86400); rest %= 86400;
    const h = Math.floor(rest / 3600); rest %= 3600;
    const m = Math.floor(rest / 60);
    const s = rest % 60;
    if (d) return interpolate(gettext("%(d)s d %(h)s h"), { d, h });
    if (h) return interpolate(gettext("%(h)s h %(m)s min"), { h, m });
    if (m) return interpolate(gettext("%(m)s min %(s)s s"), { m, s });
    return interpolate(gettext("%(s)s s"), { s });
  }
  function tickRuntime() {
    const cell = document.getElementById("task-runtime");
    if (!cell || cell.dataset.elapsed === undefined) return;
    if (!runtimeSince.has(cell)) runtimeSince.set(cell, performance.now());
    const elapsed = parseFloat(cell.dataset.elapsed) + (performance.now() - runtimeSince.get(cell)) / 1000;
    cell.textContent = duration(elapsed);
  }
  setInterval(tickRuntime, 1000);

  function say(key) { status.textContent = status.dataset[key] || ""; }

  function append(chunk) {
    if (paused) { held.push(chunk); return; }
    text.append(document.createTextNode(chunk));
    if (follow.checked) text.scrollTop = text.scrollHeight;
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const attempt = picker.value;
    let url = scheme + "//" + location.host + root.dataset.ws;
    if (attempt) url += "?attempt=" + encodeURIComponent(attempt);
    text.textContent = "";
    say("waiting");
    socket = new WebSocket(url);
    socket.onopen = function () { retry = 500; };
    socket.onmessage = function (event) {
      const message = JSON.parse(event.data);
      if (message.type === "chunk") {
        append(message.text);
        if (!paused) say("live");
      } else if (message.type === "attempt") {
        text.textContent = "";
        download.href = download.dataset.base + "?attempt=" + message.attempt;
        if (![...picker.options].some((o) => o.value === String(message.attempt))) {
          picker.add(new Option(String(message.attempt), String(message.attempt)));
        }
      } else if (message.type === "ended") {
        say("ended");
      } else if (message.type === "unavailable") {
        status.textContent = (status.dataset.unavailable || "") + " " + message.reason;
      } else if (message.type === "state") {
        document.getElementById("task-state").innerHTML = message.html;
        document.getElementById("task-reason").textContent = message.reason;
        // Buttons the new state no longer offers go away (a reload brings back any it adds).
        document.querySelectorAll(".task-actions form").forEach(function (form) {
          const action = form.querySelector("button").value;
          form.hidden = !message.controls.includes(action);
        });
        // Compared with what the parts were rendered at, not with the last message: the
        // first message may already be newer than the page (it started while loading).
        if (message.state + "\n" + message.reason !== rendered()) refreshParts();
      }
    };
    socket.onclose = function (event) {
      if (event.code >= 4000) { say("closed"); return; }  // refused: do not hammer
      say("closed");
      setTimeout(connect, retry);
      retry = Math.min(retry * 2, 10000);
    };
  }

  pause.addEventListener("click", function () {
    paused = !paused;
    pause.setAttribute("aria-pressed", String(paused));
    pause.textContent = paused ? pause.dataset.resume : pause.dataset.pause;
    if (paused) { say("paused"); return; }
    const waiting = held.join("");
    held = [];
    if (waiting) append(waiting);
    say("live");
  });
  picker.addEventListener("change", function () {
    download.href = download.dataset.base + (picker.value ? "?attempt=" + picker.value : "");
    if (socket) { socket.onclose = null; socket.close(); }
    connect();
  });
  // On the document: the buttons are swapped in and out with the task's parts.
  document.addEventListener("click", function (event) {
    const button = event.target.closest("button[data-confirm]");
    if (button && !window.confirm(button.dataset.confirm)) event.preventDefault();
  });
  connect();
})();
