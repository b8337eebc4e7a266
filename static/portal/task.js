// The task page's live parts: the log tail and the state, pushed over a websocket
// (portal/consumers.py). Without JavaScript the page still shows everything but the live log.
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
  const stateBox = document.getElementById("task-state");
  const reasonBox = document.getElementById("task-reason");
  let socket = null;
  let paused = false;
  let held = [];
  let retry = 500;
  let shownState = null;

  // A new state brings new facts (node, runtime, exit code), timeline entries and attempts:
  // fetch the page again and swap those sections in, leaving the log as it is.
  async function refreshSections() {
    const response = await fetch(location.href, { credentials: "same-origin" });
    if (!response.ok) return;
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
    document.querySelectorAll("section.refresh").forEach(function (section) {
      const replacement = fresh.getElementById(section.id);
      if (replacement) section.innerHTML = replacement.innerHTML;
    });
  }

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
      } else if (message.type === "state") {
        stateBox.innerHTML = message.html;
        reasonBox.textContent = message.reason;
        // Buttons the new state no longer offers go away (a reload brings back any it adds).
        document.querySelectorAll(".task-actions form").forEach(function (form) {
          const action = form.querySelector("button").value;
          form.hidden = !message.controls.includes(action);
        });
        if (shownState !== null && shownState !== message.state) refreshSections();
        shownState = message.state;
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
  document.querySelectorAll("button[data-confirm]").forEach(function (button) {
    button.addEventListener("click", function (event) {
      if (!window.confirm(button.dataset.confirm)) event.preventDefault();
    });
  });
  connect();
})();
