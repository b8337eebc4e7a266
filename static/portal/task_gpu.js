/* The task page's GPU charts: the history rendered into the page (the task metrics read path),
   then live samples of the task's GPUs from /ws/live/ (a tenant member's socket carries the
   samples of the tenant's tasks' GPUs; the ones of other tasks are ignored here). The frame and
   acknowledgement protocol is the dashboard's (static/live/dashboard.js). When task.js swaps in a
   new rendering of the section (the task got GPUs, or ended), the charts start again from it. */
(function () {
  "use strict";
  if (typeof uPlot === "undefined") return;
  const palette = ["#2f6fb0", "#c2571a", "#2b8a3e", "#8e44ad", "#b58900", "#d33682", "#268bd2", "#6c757d"];
  // From Django's JavaScript catalogue (/jsi18n/), loaded before this script.
  const gettext = (text) => (window.django && window.django.gettext ? window.django.gettext(text) : text);
  let current = null;
  // For tests and curious people: how many points the charts hold.
  window.gpTaskCharts = {
    connected: false,
    points: () => (current ? current.points.size : 0),
    chartPoints: (id) => (current && current.charts[id] ? current.charts[id].data[0].length : 0),
  };

  // The charts of one rendering of the section (portal/task/_charts.html). task.js swaps a new
  // rendering in when the task changes (it got GPUs, it ended): these charts then stop and the
  // new ones start from the history the server rendered.
  function start() {
    const dataNode = document.getElementById("gpu-charts-data");
    if (!dataNode) return null;
    const config = JSON.parse(dataNode.textContent);
    const status = document.getElementById("gpu-charts-status");
    const ids = config.gpus.map((g) => g.id);
    // time -> {gpuId: [util, memUsedMiB]}; one map keeps history and live points aligned.
    const points = new Map();
    const charts = {};
    const self = { points, charts, socket: null, stopped: false, timer: null };
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
      if (self.stopped) return;
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
      self.socket = socket;
      const send = (message) => { if (socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message)); };
      socket.onmessage = (message) => {
        const body = JSON.parse(message.data);
        if (body.type === "hello") { retryMs = 1000; showStatus(true); window.gpTaskCharts.connected = true; }
        else if (body.type === "samples") { applySamples(body.rows); send({ type: "ack", seq: body.seq }); }
      };
      socket.onclose = () => {
        window.gpTaskCharts.connected = false;
        showStatus(false);
        self.timer = setTimeout(connect, retryMs);
        retryMs = Math.min(retryMs * 2, 10000);
      };
    }

    const memMax = Math.max(...config.gpus.map((g) => g.memory_mb));
    makeChart("gpu-chart-util", 100);
    makeChart("gpu-chart-mem", memMax);
    draw();
    if (config.running) connect();
    return self;
  }

  function stop(charts) {
    if (!charts) return;
    charts.stopped = true;
    clearTimeout(charts.timer);
    if (charts.socket) { charts.socket.onclose = null; charts.socket.close(); }
    Object.values(charts.charts).forEach((chart) => chart.destroy());
    window.gpTaskCharts.connected = false;
  }

  current = start();
  document.addEventListener("gp:task-parts", () => {
    stop(current);
    current = start();
  });
})();
