/* The live dashboard: one websocket (/ws/live/) keeps tiles, tables and charts current.
   Samples arrive as numbered frames that are acknowledged (the server holds back and coalesces
   while frames are unacknowledged); a reconnecting page asks for what it missed (catch_up). */
(function () {
  "use strict";
  const config = JSON.parse(document.getElementById("gp-config").textContent);
  const LIVE_WINDOW_S = 15 * 60;
  const STALE_AFTER_S = 15;
  const status = document.getElementById("gp-status");
  const connText = document.getElementById("gp-conn");
  const gpuNode = {};
  config.nodes.forEach((node) => node.gpus.forEach((gpu) => { gpuNode[gpu.id] = node.id; }));

  // Live series: per node, ticks aligned on the node's sample time.
  const ticks = {};
  config.nodes.forEach((node) => {
    ticks[node.id] = { t: [], util: {}, mem: {} };
    node.gpus.forEach((gpu) => { ticks[node.id].util[gpu.id] = []; ticks[node.id].mem[gpu.id] = []; });
  });
  const power = { t: [], byNode: {} };
  config.nodes.forEach((node) => { power.byNode[node.id] = []; });
  const latestPower = {};
  const lastSampleAt = {};
  let socket = null;
  let lastHeard = null;
  let disconnectedAt = null;
  let retryMs = 1000;
  let mode = "live";
  let history = null;
  let historyPoints = 0;

  function fmt(value, unit) { return value === null || value === undefined ? "–" : `${Math.round(value)}${unit}`; }
  function clock(epoch) { return new Date(epoch * 1000).toLocaleTimeString(); }

  // --- Socket ------------------------------------------------------------------------------------
  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    socket = new WebSocket(`${scheme}://${location.host}${config.socket}`);
    socket.onmessage = (message) => {
      lastHeard = Date.now() / 1000;
      handle(JSON.parse(message.data));
    };
    socket.onclose = () => {
      if (disconnectedAt === null) disconnectedAt = Date.now() / 1000;
      showStatus();
      setTimeout(connect, retryMs);
      retryMs = Math.min(retryMs * 2, 10000);
    };
  }

  function send(message) {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message));
  }

  function handle(message) {
    switch (message.type) {
      case "hello":
        retryMs = 1000;
        // First connection: what changed between the page's render and now; later ones: the gap.
        send({ type: "catch_up", since: disconnectedAt === null ? config.renderedAt : disconnectedAt - 5 });
        disconnectedAt = null;
        showStatus();
        break;
      case "samples":
        applySamples(message.rows, true);
        send({ type: "ack", seq: message.seq });
        break;
      case "events":
        message.events.forEach(applyEvent);
        break;
      case "catch_up":
        if (message.reload) { location.reload(); return; }
        message.events.forEach(applyEvent);
        applySamples(message.samples || [], false);
        break;
      case "resync":
        send({ type: "catch_up", since: (lastHeard || Date.now() / 1000) - 60 });
        break;
      default:
        break;
    }
  }

  function showStatus() {
    const open = socket && socket.readyState === WebSocket.OPEN;
    status.dataset.state = open ? "live" : "stale";
    connText.textContent = open
      ? gettext("live")
      : interpolate(gettext("disconnected since %s: the figures below are stale, reconnecting…"), [clock(disconnectedAt)]);
    const now = Date.now() / 1000;
    Object.keys(lastSampleAt).forEach((id) => {
      const tile = document.getElementById(`gpu-${id}`);
      if (!tile) return;
      if (now - lastSampleAt[id] > STALE_AFTER_S) tile.dataset.stale = "1";
      else delete tile.dataset.stale;
    });
  }

  // --- Samples -----------------------------------------------------------------------------------
  function applySamples(rows, live) {
    rows = rows.slice().sort((a, b) => a[1] - b[1]);
    const perNode = {};
    rows.forEach((row) => {
      const [gpuId, at, util, memUsed, memTotal, temp, watts] = row;
      const nodeId = gpuNode[gpuId];
      if (nodeId === undefined) return;
      const tile = document.getElementById(`gpu-${gpuId}`);
      const total = memTotal || (tile && Number(tile.dataset.memoryMb)) || null;
      const memPct = memUsed !== null && total ? (100 * memUsed) / total : null;
      if (tile && (live || !lastSampleAt[gpuId] || at >= lastSampleAt[gpuId])) {
        tile.querySelector('[data-metric="util"]').textContent = fmt(util, "%");
        tile.querySelector('[data-metric="mem"]').textContent = memUsed === null ? "–" : `${Math.round(memUsed)} MiB`;
        tile.querySelector('[data-metric="temp"]').textContent = fmt(temp, " °C");
        tile.querySelector('[data-metric="power"]').textContent = fmt(watts, " W");
        if (util !== null) tile.style.setProperty("--gp-heat", `hsl(${210 - 2.1 * Math.min(util, 100)} 65% 45%)`);
        lastSampleAt[gpuId] = Math.max(lastSampleAt[gpuId] || 0, at);
      }
      if (watts !== null) latestPower[gpuId] = watts;
      // Rows of one node's tick share its time: one chart point per node per tick.
      const key = `${nodeId}:${at}`;
      (perNode[key] = perNode[key] || { nodeId, at, rows: [] }).rows.push([gpuId, util, memPct]);
    });
    Object.values(perNode).sort((a, b) => a.at - b.at).forEach(({ nodeId, at, rows: points }) => {
      const series = ticks[nodeId];
      if (series.t.length && at <= series.t[series.t.length - 1]) return; // already have it
      series.t.push(at);
      const seen = {};
      points.forEach(([gpuId, util, memPct]) => { seen[gpuId] = [util, memPct]; });
      Object.keys(series.util).forEach((gpuId) => {
        series.util[gpuId].push(seen[gpuId] ? seen[gpuId][0] : null);
        series.mem[gpuId].push(seen[gpuId] ? seen[gpuId][1] : null);
      });
      while (series.t[0] < at - LIVE_WINDOW_S) {
        series.t.shift();
        Object.keys(series.util).forEach((g) => { series.util[g].shift(); series.mem[g].shift(); });
      }
    });
    if (rows.length) {
      const at = rows[rows.length - 1][1];
      if (!power.t.length || at > power.t[power.t.length - 1]) {
        power.t.push(at);
        config.nodes.forEach((node) => {
          const watts = node.gpus.map((g) => latestPower[g.id]).filter((w) => w !== undefined);
          const sum = watts.length ? watts.reduce((a, b) => a + b, 0) : null;
          power.byNode[node.id].push(sum);
          const label = document.querySelector(`[data-node-power="${node.id}"]`);
          if (label && sum !== null) label.textContent = `${Math.round(sum)} W`;
        });
        while (power.t[0] < at - LIVE_WINDOW_S) {
          power.t.shift();
          Object.values(power.byNode).forEach((s) => s.shift());
        }
      }
    }
    scheduleDraw();
  }

  // --- Events ------------------------------------------------------------------------------------
  function applyEvent(event) {
    if (event.kind === "gpu") {
      const tile = document.getElementById(`gpu-${event.id}`);
      if (!tile) return;
      tile.dataset.state = event.state;
      tile.querySelector(".gp-state").textContent = stateLabel(event.state, tile.querySelector(".gp-holder a") !== null);
      tile.title = event.reason || tile.title;
    } else if (event.kind === "node") {
      const node = document.getElementById(`node-${event.id}`);
      if (!node) return;
      node.dataset.state = event.state;
      node.querySelector(".gp-node-state").textContent = stateLabel(event.state, false);
      if (event.last_heartbeat) node.querySelector(".gp-heartbeat").textContent = clock(event.last_heartbeat);
    } else if (event.kind === "task") {
      document.querySelectorAll(`tr[data-task-id="${event.id}"]`).forEach((row) => {
        const state = row.querySelector(".gp-task-state");
        if (state) state.textContent = event.state;
        const reason = row.querySelector(".gp-reason");
        if (reason && event.reason !== undefined) reason.textContent = event.reason;
        if (["succeeded", "failed", "cancelled", "timed_out"].includes(event.state)) row.classList.add("gp-resolved");
      });
    } else if (event.kind === "reasons") {
      event.reasons.forEach(([taskId, reason]) => {
        document.querySelectorAll(`tr[data-task-id="${taskId}"] .gp-reason`).forEach((cell) => { cell.textContent = reason; });
      });
    } else if (event.kind === "alert") {
      applyAlert(event);
    } else if (event.kind === "scheduler") {
      document.getElementById("gp-last-pass").textContent =
        `${clock(event.last_pass_at)} (${event.last_pass_ms} ms, ${event.waiting} ${gettext("waiting")})`;
      document.getElementById("gp-pending").textContent = event.waiting;
    }
  }

  function applyAlert(event) {
    const body = document.querySelector("#gp-alerts-table tbody");
    let row = body.querySelector(`tr[data-alert-id="${event.id}"]`);
    if (!row) {
      if (!event.open) return;
      const none = body.querySelector(".gp-none");
      if (none) none.remove();
      row = document.createElement("tr");
      row.dataset.alertId = event.id;
      row.innerHTML = "<td></td><td></td><td></td>";
      body.prepend(row);
    }
    row.className = `gp-sev-${event.severity}${event.open ? "" : " gp-resolved"}`;
    row.cells[0].textContent = event.severity;
    row.cells[1].textContent = event.message;
    row.cells[2].textContent = clock(event.opened_at);  // since when, as the page renders it
    document.getElementById("gp-alert-count").textContent = body.querySelectorAll("tr[data-alert-id]:not(.gp-resolved)").length;
  }

  // --- Charts ------------------------------------------------------------------------------------
  const charts = {};
  const palette = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7"];
  let drawPending = false;

  function selectedNode() {
    const pick = document.getElementById("gp-chart-node");
    return pick && pick.value ? Number(pick.value) : null;
  }

  function makeChart(id, labels, yMax) {
    const element = document.getElementById(id);
    if (charts[id]) charts[id].destroy();
    const width = Math.max(element.clientWidth, 320);
    const series = [{ label: gettext("Time") }].concat(labels.map((label, i) => ({ label, stroke: palette[i % palette.length], width: 1.5, spanGaps: false })));
    const scales = yMax ? { y: { range: [0, yMax] } } : {};
    charts[id] = new uPlot({ width, height: 200, series, scales, axes: [{}, { size: 50 }] },
      [[]].concat(labels.map(() => [])), element);
  }

  function rebuildCharts() {
    if (typeof uPlot === "undefined") return;
    const nodeId = selectedNode();
    const node = config.nodes.find((n) => n.id === nodeId);
    const gpuLabels = node ? node.gpus.map((g) => `GPU ${g.index}`) : [];
    makeChart("gp-chart-util", gpuLabels, 100);
    makeChart("gp-chart-mem", gpuLabels, 100);
    const powerLabels = mode === "live" ? config.nodes.map((n) => n.name) : [node ? node.name : ""];
    makeChart("gp-chart-power", powerLabels, null);
    draw();
  }

  function scheduleDraw() {
    if (drawPending || mode !== "live") return;
    drawPending = true;
    requestAnimationFrame(() => { drawPending = false; draw(); });
  }

  function draw() {
    if (!charts["gp-chart-util"]) return;
    const nodeId = selectedNode();
    const node = config.nodes.find((n) => n.id === nodeId);
    if (!node) return;
    const ids = node.gpus.map((g) => g.id);
    if (mode === "live") {
      const series = ticks[nodeId];
      charts["gp-chart-util"].setData([series.t].concat(ids.map((id) => series.util[id])));
      charts["gp-chart-mem"].setData([series.t].concat(ids.map((id) => series.mem[id])));
      charts["gp-chart-power"].setData([power.t].concat(config.nodes.map((n) => power.byNode[n.id])));
    } else if (history) {
      const pick = (table) => ids.map((id) => table[id] || history.t.map(() => null));
      charts["gp-chart-util"].setData([history.t].concat(pick(history.util)));
      charts["gp-chart-mem"].setData([history.t].concat(pick(history.mem)));
      charts["gp-chart-power"].setData([history.t, history.power]);
    }
  }

  // The live charts start with the last 15 minutes the history keeps, older than any live point.
  async function seedLive(nodeId) {
    const response = await fetch(`${config.history}?node=${nodeId}&range=15m`, { credentials: "same-origin" });
    if (!response.ok) return;
    const body = await response.json();
    const series = ticks[nodeId];
    const first = series.t.length ? series.t[0] : Infinity;
    const keep = body.t.map((t, i) => [t, i]).filter(([t]) => t < first);
    series.t = keep.map(([t]) => t).concat(series.t);
    Object.keys(series.util).forEach((gpuId) => {
      const util = body.util[gpuId] || [];
      const mem = body.mem[gpuId] || [];
      series.util[gpuId] = keep.map(([, i]) => (util[i] === undefined ? null : util[i])).concat(series.util[gpuId]);
      series.mem[gpuId] = keep.map(([, i]) => (mem[i] === undefined ? null : mem[i])).concat(series.mem[gpuId]);
    });
    scheduleDraw();
  }

  async function loadHistory(query) {
    const note = document.getElementById("gp-range-note");
    note.textContent = gettext("loading…");
    const response = await fetch(`${config.history}?node=${selectedNode()}&${query}`, { credentials: "same-origin" });
    const body = await response.json();
    if (!response.ok) {
      note.textContent = Object.entries(body.errors).map(([field, errs]) => `${field}: ${errs.join(", ")}`).join("; ");
      return;
    }
    history = body;
    historyPoints = body.t.length;
    note.textContent = interpolate(gettext("%s points from %s to %s (live updates paused)"),
      [body.t.length, new Date(body.start * 1000).toLocaleString(), new Date(body.end * 1000).toLocaleString()]);
    rebuildCharts();
  }

  function onRange() {
    const value = document.getElementById("gp-range").value;
    document.getElementById("gp-custom").hidden = value !== "custom";
    if (value === "custom") return;
    mode = value === "live" ? "live" : "history";
    if (mode === "live") {
      history = null;
      document.getElementById("gp-range-note").textContent = "";
      rebuildCharts();
      seedLive(selectedNode());
    } else {
      loadHistory(`range=${encodeURIComponent(value)}`);
    }
  }

  function onCustom() {
    const start = Date.parse(document.getElementById("gp-start").value) / 1000;
    const end = Date.parse(document.getElementById("gp-end").value) / 1000;
    mode = "history";
    loadHistory(`start=${start}&end=${end}`);
  }

  // gettext comes from Django's JavaScript catalogue where the page loads it; plain text otherwise.
  function gettext(text) { return window.django && window.django.gettext ? window.django.gettext(text) : text; }
  function pgettext(context, text) { return window.django && window.django.pgettext ? window.django.pgettext(context, text) : text; }
  // A GPU or node state as the tiles show it (live/tiles.py): an available GPU a task holds is "in use".
  function stateLabel(state, held) {
    const labels = { available: pgettext("state", "available"), draining: pgettext("state", "draining"),
      offline: pgettext("state", "offline"), failed: pgettext("state", "failed") };
    if (state === "available" && held) return pgettext("state", "in use");
    return labels[state] || state;
  }
  function interpolate(text, args) { let i = 0; return text.replace(/%s/g, () => String(args[i++])); }

  // Runtimes keep counting between renders (rendered in seconds as of the page's render).
  function duration(seconds) {
    const h = Math.floor(seconds / 3600);
    const m = Math.floor((seconds % 3600) / 60);
    return h ? `${h} h ${m} min` : m ? `${m} min ${Math.floor(seconds % 60)} s` : `${Math.floor(seconds)} s`;
  }
  function tickRuntimes() {
    const elapsed = Date.now() / 1000 - config.renderedAt;
    document.querySelectorAll(".gp-runtime[data-seconds]").forEach((cell) => {
      if (cell.dataset.seconds === "" || cell.closest("tr").classList.contains("gp-resolved")) return;
      cell.textContent = duration(Number(cell.dataset.seconds) + elapsed);
    });
  }

  document.getElementById("gp-range").addEventListener("change", onRange);
  document.getElementById("gp-custom-go").addEventListener("click", onCustom);
  document.getElementById("gp-chart-node").addEventListener("change", onRange);
  window.addEventListener("resize", () => rebuildCharts());
  setInterval(showStatus, 2000);
  setInterval(tickRuntimes, 1000);
  tickRuntimes();
  rebuildCharts();
  if (selectedNode() !== null) seedLive(selectedNode());
  connect();

  // For people poking at the page and for the browser tests.
  window.gpDashboard = {
    liveTicks: (nodeId) => (ticks[nodeId] ? ticks[nodeId].t.length : 0),
    historyPoints: () => historyPoints,
    connected: () => Boolean(socket && socket.readyState === WebSocket.OPEN),
    chartPoints: (id) => (charts[id] ? charts[id].data[0].length : 0),
  };
})();
