// The dashboard page: polls the read-only JSON API every 2 s and redraws. Plain JavaScript, no build.
"use strict";

const COLORS = ["#2f6fde", "#d64545", "#1f9d55", "#d98b00", "#8e44ad", "#16a2b8", "#c0398f", "#5d6d7e"];
const state = { contract: null, history: [], height: -1, run: null, charts: {} };

const $ = (sel) => document.querySelector(sel);

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function badge(text) { return el("span", text, "badge " + text); }

function fmtTime(t) { return t ? new Date(t * 1000).toLocaleTimeString() : "-"; }

function fmtNum(v) { return typeof v === "number" ? v.toFixed(4) : (v === null || v === undefined ? "-" : v); }

function short(d) { return d ? String(d).slice(0, 12) : "-"; }

function fill(table, rows) {
  const body = $(table + " tbody");
  body.replaceChildren(...rows.map((cells) => {
    const tr = el("tr");
    for (const cell of cells) {
      const td = el("td");
      if (cell instanceof Node) td.append(cell); else td.textContent = cell === null || cell === undefined ? "-" : String(cell);
      tr.append(td);
    }
    return tr;
  }));
}

async function getJSON(url) {
  const response = await fetch(url, { credentials: "same-origin" });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function card(label, value) {
  const div = el("div", null, "card");
  div.append(el("div", value, "value"), el("div", label, "label"));
  return div;
}

function drawOverview(o) {
  $("#sn").textContent = `SN ${o.sn.uid} · ledger height ${o.sn.height} · ${o.sn.signed ? "signed" : "unsigned"} chain · updated ${new Date().toLocaleTimeString()}`;
  const online = o.nodes.filter((n) => n.online).length;
  const running = o.taskrunners.filter((t) => t.state === "RUNNING").length;
  const active = o.contracts.filter((c) => c.status === "ACTIVE").length;
  $("#summary").replaceChildren(
    card("nodes online", `${online} / ${o.nodes.length}`),
    card("contracts training", `${active} / ${o.contracts.length}`),
    card("taskrunners running", `${running} / ${o.taskrunners.length}`),
    card("tasks", o.tasks.length),
  );
  fill("#nodes", o.nodes.map((n) => [n.uid, n.type, badge(n.online ? "online" : "offline"), n.parent, n.host, fmtTime(n.last_seen)]));
  fill("#taskrunners", o.taskrunners.map((t) => [t.name, badge(t.state), t.task, t.active, t.completed, t.failed]));
  fill("#contracts", o.contracts.map((c) => [c.name, badge(c.status), c.members, c.round]));
  fill("#tasks", o.tasks.map((t) => [t.name, t.type, t.finalized ? "yes" : "no"]));
  const select = $("#contract");
  const names = o.contracts.map((c) => c.name);
  if (select.options.length !== names.length || [...select.options].some((opt, i) => opt.value !== names[i])) {
    select.replaceChildren(...names.map((n) => el("option", n)));
  }
  if (!state.contract || !names.includes(state.contract)) {
    const training = o.contracts.find((c) => c.status === "ACTIVE") || o.contracts.find((c) => c.members > 0) || o.contracts[0];
    state.contract = training ? training.name : null;
  }
  if (state.contract) select.value = state.contract;
}

function leaderOf(rounds) {
  const closed = rounds.closed || [];
  if (closed.length) return closed[closed.length - 1].leader;
  const done = rounds.finished || [];
  return done.length ? done[done.length - 1].leader : null;
}

function drawContract(c) {
  $("#contract-status").replaceWith(Object.assign(badge(c.status.status), { id: "contract-status" }));
  const open = c.rounds.open;
  const leader = leaderOf(c.rounds);
  $("#contract-round").textContent = `round ${open ? open.round : "-"} · leader ${leader || "-"} · latest model ${short(c.status.latest_model && c.status.latest_model.digest)}`;
  fill("#perf", c.perfdata.map((p) => {
    const done = p.completed_epochs || 0, total = p.total_epochs || 0;
    const bar = el("span");
    const track = el("span", null, "bar");
    const fillBar = el("i");
    fillBar.style.width = `${total ? Math.min(100, (100 * done) / total) : 0}%`;
    track.append(fillBar);
    bar.append(track, document.createTextNode(`${done}/${total || "?"}`));
    const name = el("span", p.uid);
    if (p.uid === leader) name.append(el("span", "★", "lead"));
    return [name, badge(p.status), bar, fmtNum(p.loss), fmtNum(p.metric), fmtTime(p.updated_at)];
  }));
  const rounds = [...(c.rounds.finished || []), ...(c.rounds.closed || [])];
  if (open) rounds.push(open);
  rounds.sort((a, b) => b.round - a.round);
  fill("#rounds", rounds.map((r) => [r.round, badge(r.status), r.leader, (r.participants || []).join(", ") || `${(r.checkins || []).length} checked in`, short(r.digest)]));
}

function series(records, key) {
  const nodes = [...new Set(records.filter((r) => r.kind === "progress").map((r) => r.node))].sort();
  const t0 = records.length ? records[0].time : 0;
  const times = [...new Set(records.filter((r) => r.kind === "progress").map((r) => r.time - t0))].sort((a, b) => a - b);
  const index = new Map(times.map((t, i) => [t, i]));
  const columns = nodes.map(() => times.map(() => null));
  for (const r of records) {
    if (r.kind !== "progress" || typeof r[key] !== "number") continue;
    columns[nodes.indexOf(r.node)][index.get(r.time - t0)] = r[key];
  }
  return { nodes, data: [times, ...columns] };
}

function drawChart(key) {
  const target = $("#chart-" + key);
  const { nodes, data } = series(state.history, key);
  const signature = nodes.join(",");
  let chart = state.charts[key];
  if (chart && chart.signature !== signature) { chart.plot.destroy(); chart = null; }
  if (!chart) {
    target.replaceChildren();
    const opts = {
      width: Math.max(300, target.clientWidth), height: 220,
      scales: { x: { time: false } },
      axes: [{ label: "seconds" }, {}],
      series: [{ label: "time (s)" }, ...nodes.map((n, i) => ({ label: n, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true, points: { show: false } }))],
    };
    chart = state.charts[key] = { signature, plot: new uPlot(opts, data, target) };
  } else {
    chart.plot.setData(data);
  }
}

async function drawHistory() {
  const h = await getJSON(`/api/contracts/${encodeURIComponent(state.contract)}/history?since=${state.run === null ? -1 : state.height}`);
  if (h.run !== state.run) { state.history = []; state.run = h.run; if (state.height >= 0) return drawHistoryFromStart(); }
  state.history.push(...h.records);
  state.height = h.height;
  drawChart("loss");
  drawChart("metric");
}

async function drawHistoryFromStart() { state.height = -1; state.run = null; return drawHistory(); }

async function refresh() {
  try {
    const overview = await getJSON("/api/overview");
    const before = state.contract;
    drawOverview(overview);
    if (state.contract !== before) { state.history = []; state.height = -1; state.run = null; }
    if (state.contract) {
      drawContract(await getJSON(`/api/contracts/${encodeURIComponent(state.contract)}`));
      await drawHistory();
    }
    $("#error").hidden = true;
    document.body.dataset.ready = "1";
  } catch (err) {
    $("#error").hidden = false;
    $("#error").textContent = `cannot read the swarm: ${err.message}`;
  }
}

$("#contract").addEventListener("change", (event) => {
  state.contract = event.target.value; state.history = []; state.height = -1; state.run = null;
  refresh();
});
refresh();
setInterval(refresh, 2000);
