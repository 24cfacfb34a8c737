// Small time-series line charts on <canvas>: no library, no network.
"use strict";

const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777",
                 "#4b5563", "#65a30d", "#9333ea"];

function niceStep(range, ticks) {
  const raw = range / ticks;
  const power = Math.pow(10, Math.floor(Math.log10(raw)));
  const unit = raw / power;
  return power * (unit <= 1 ? 1 : unit <= 2 ? 2 : unit <= 5 ? 5 : 10);
}

function formatNumber(v) {
  const a = Math.abs(v);
  if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (a >= 1e4) return (v / 1e3).toFixed(0) + "k";
  if (a >= 100 || Number.isInteger(v)) return v.toFixed(0);
  return v.toFixed(a >= 10 ? 1 : 2);
}

function formatTime(ms) {
  const d = new Date(ms);
  return [d.getHours(), d.getMinutes(), d.getSeconds()]
    .map((n) => String(n).padStart(2, "0")).join(":");
}

class LineChart {
  // integer: counts, so no tick below 1 (an all-zero chart reads 0..1).
  constructor(canvas, { integer = false } = {}) {
    this.canvas = canvas;
    this.integer = integer;
    this.times = [];
    this.series = [];  // [{name, values, color}]
  }

  // times: ms since the epoch; series: [{name, values}] aligned with times (null = gap).
  setData(times, series) {
    this.times = times;
    this.series = series.map((s, i) => ({ color: PALETTE[i % PALETTE.length], ...s }));
    this.draw();
  }

  draw() {
    const canvas = this.canvas;
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth, height = canvas.clientHeight;
    if (canvas.width !== width * ratio || canvas.height !== height * ratio) {
      canvas.width = width * ratio;
      canvas.height = height * ratio;
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    ctx.font = "11px system-ui, sans-serif";
    const pad = { left: 48, right: 10, top: 22, bottom: 20 };
    const w = width - pad.left - pad.right, h = height - pad.top - pad.bottom;
    if (this.times.length === 0 || w <= 0 || h <= 0) {
      ctx.fillStyle = "#6b7280";
      ctx.fillText("waiting for data…", pad.left, pad.top + h / 2);
      return;
    }
    const t0 = this.times[0], t1 = Math.max(this.times[this.times.length - 1], t0 + 1000);
    let top = 0;
    for (const s of this.series) for (const v of s.values) if (v !== null && v > top) top = v;
    let step = niceStep(top > 0 ? top : 1, 4);
    if (this.integer) step = Math.max(1, step);
    top = Math.max(step, Math.ceil(top / step) * step);
    const x = (t) => pad.left + ((t - t0) / (t1 - t0)) * w;
    const y = (v) => pad.top + h - (v / top) * h;

    ctx.strokeStyle = "#e5e7eb";
    ctx.fillStyle = "#6b7280";
    ctx.lineWidth = 1;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (let v = 0; v <= top + step / 2; v += step) {
      ctx.beginPath();
      ctx.moveTo(pad.left, Math.round(y(v)) + 0.5);
      ctx.lineTo(pad.left + w, Math.round(y(v)) + 0.5);
      ctx.stroke();
      ctx.fillText(formatNumber(v), pad.left - 6, y(v));
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    let previous = "";
    for (let i = 0; i <= 4; i++) {
      const t = t0 + ((t1 - t0) * i) / 4;
      const label = formatTime(t);
      if (label === previous) continue;
      previous = label;
      ctx.fillText(label, Math.min(Math.max(x(t), pad.left + 24), pad.left + w - 24),
                   pad.top + h + 5);
    }

    ctx.lineWidth = 1.8;
    ctx.lineJoin = "round";
    for (const s of this.series) {
      ctx.strokeStyle = s.color;
      ctx.beginPath();
      let pen = false;
      s.values.forEach((v, i) => {
        if (v === null || v === undefined) { pen = false; return; }
        if (pen) ctx.lineTo(x(this.times[i]), y(v)); else ctx.moveTo(x(this.times[i]), y(v));
        pen = true;
      });
      ctx.stroke();
    }

    ctx.textAlign = "left";
    ctx.textBaseline = "middle";
    let lx = pad.left;
    for (const s of this.series) {
      const last = [...s.values].reverse().find((v) => v !== null && v !== undefined);
      const label = s.name + (last === undefined ? "" : " " + formatNumber(last));
      ctx.fillStyle = s.color;
      ctx.fillRect(lx, 7, 10, 3);
      ctx.fillStyle = "#374151";
      ctx.fillText(label, lx + 14, 9);
      lx += ctx.measureText(label).width + 28;
    }
  }
}

window.LineChart = LineChart;
window.formatNumber = formatNumber;
