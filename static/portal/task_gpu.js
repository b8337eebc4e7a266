/* The task page's GPU charts: the history rendered into the page (the task metrics read path),
   then live samples of the task's GPUs from /ws/live/ (a tenant member's socket carries the
   samples of the tenant's tasks' GPUs; the ones of other tasks are ignored here). The frame and
   acknowledgement protocol is the dashboard's (static/live/dashboard.js). */
(function () {
  "use strict";
  const dataNode = document.getElementById("gpu-charts-data");
  if (!dataNode || typeof uPlot === "undefined") return;
  const config = JSON.parse(dataNode.textContent);
  const status = document.getElementById("gpu-charts-status");
  const palette = ["#2f6fb0", "#c2571a", "#2b8a3e", "#8e44ad", "#b58900", "#d33682", "#268bd2", "#6c757d"];
  const ids = config.gpus.map((g) => g.id);
  // From Django's JavaScript catalogue (/jsi18n/), loaded before this script.
  const gettext = (text) => (window.django && window.django.gettext ? window.django.gettext(text) : text);
  // time -> {gpuId: [util, memUsedMiB]}; one map keeps history and live points aligned.
  const points = new Map();
  const charts = {};
  let retryMs = 1000;
  let drawPending = false;

  function put(at, gpuId, util, mem) {
    let row = points.get(at);
    if (!row) points.set(at, (row = {}));
    row[gpuId] = [util, mem];
  }

  config.gpus.forEach((gpu) => gpu.points.forEach(([at, util, mem]) => put(at, gpu.id, util, mem)));

  function makeChart(id, yMax) {
    const element = document.getElementById(id);
    const width = Math.max(element.clientWidth, 320);
    const series = [{ label: gettext("Time") }].concat(config.gpus.map((g, i) => ({
      label: `GPU ${g.index}`, stroke: palette[i % palette.length], width: 1.5, spanGaps: false,
    })));
    charts[id] = new uPlot({
      title: element.dataset.title, width, height: 200, series,
      scales: yMax ? { y: { range: [0, yMax] } } : {},
      axes: [{}, { size: 60 }],
    }, [[]].concat(ids.map(() => [])), element);
  }

  function draw() {
    drawPending = false;
    const times = Array.from(points.keys()).sort((a, b) => a - b);
    const column = (gpuId, k) => times.map((t) => (points.get(t)[gpuId] ? points.get(t)[gpuId][k] : null));
    const series = { "gpu-chart-util": 0, "gpu-chart-mem": 1 };
    Object.entries(series).forEach(([id, k]) => {
      charts[id].setData([times].concat(ids.map((gpuId) => column(gpuId, k))));
      // One point alone makes uPlot spread the time axis over years: show a minute around it.
      if (times.length === 1) charts[id].setScale("x", { min: times[0] - 60, max: times[0] + 60 });
    });
  }

  function scheduleDraw() {
    if (drawPending) return;
    drawPending = true;
    requestAnimationFrame(draw);
  }

  function applySamples(rows) {
    let added = 0;
    rows.forEach(([gpuId, at, util, memUsed]) => {
      if (!ids.includes(gpuId)) return;
      put(at, gpuId, util, memUsed);
      added += 1;
    });
    if (!added) return;
    const empty = document.getElementById("gpu-charts-empty");
    if (empty) empty.remove();
    scheduleDraw();
  }

  function showStatus(open) {
    if (status) status.textContent = open ? status.dataset.live : status.dataset.closed;
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}${config.socket}`);
    const send = (message) => { if (socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message)); };
    socket.onmessage = (message) => {
      const body = JSON.parse(message.data);
      if (body.type === "hello") { retryMs = 1000; showStatus(true); window.gpTaskCharts.connected = true; }
      else if (body.type === "samples") { applySamples(body.rows); send({ type: "ack", seq: body.seq }); }
    };
    socket.onclose = () => {
      window.gpTaskCharts.connected = false;
      showStatus(false);
      setTimeout(connect, retryMs);
      retryMs = Math.min(retryMs * 2, 10000);
    };
  }

  const memMax = Math.max(...config.gpus.map((g) => g.memory_mb));
  makeChart("gpu-chart-util", 100);
  makeChart("gpu-chart-mem", memMax);
  draw();
  // For tests and curious people: how many points the charts hold.
  window.gpTaskCharts = {
    connected: false,
    points: () => points.size,
    chartPoints: (id) => charts[id].data[0].length,
  };
  if (config.running) connect();
})();
