// Loss curves on a canvas, for the Train page's two tabs: axes with round-numbered ticks,
// a y-range fitted to the values drawn (a loss that falls from 2.31 to 2.05 fills the plot
// instead of a sliver at its top), lines and dots.

/** About `count` round values (1, 2 or 5 times a power of ten apart) covering [lo, hi]. */
export function ticks(lo, hi, count = 5) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw) ?? 10 * power;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}

/**
 * Draws `series` (each `{ points: [[x, y], ...], color, dots }`) on `canvas`, x from 0 to
 * `xMax`, with `xLabel` under the axis. The y-range is the values' own, padded by a tenth,
 * snapped outward to ticks.
 */
export function plot(canvas, series, xMax, xLabel) {
  const c = canvas.getContext('2d');
  const { width, height } = canvas;
  const left = 46;
  const top = 10;
  const w = width - left - 12;
  const h = height - top - 36;
  c.clearRect(0, 0, width, height);
  c.strokeStyle = '#d8d2c8';
  c.lineWidth = 1;
  c.strokeRect(left, top, w, h);
  const ys = series.flatMap((s) => s.points.map((p) => p[1])).filter(Number.isFinite);
  if (ys.length === 0) return;
  let lo = Math.min(...ys);
  let hi = Math.max(...ys);
  const pad = (hi - lo) / 10 || Math.abs(hi) / 10 || 1;
  lo = Math.max(0, lo - pad);
  hi += pad;
  const yTicks = ticks(lo, hi, 5);
  lo = Math.min(lo, yTicks[0]);
  const xTicks = ticks(0, xMax, 5);
  const x = (v) => left + (v / Math.max(xMax, 1e-9)) * w;
  const y = (v) => top + (1 - (v - lo) / (hi - lo)) * h;
  c.font = '11px system-ui';
  c.fillStyle = '#5b6570';
  c.textAlign = 'right';
  c.textBaseline = 'middle';
  for (const t of yTicks) {
    if (y(t) < top - 1 || y(t) > top + h + 1) continue;
    c.strokeStyle = '#ece7df';
    c.beginPath();
    c.moveTo(left, y(t));
    c.lineTo(left + w, y(t));
    c.stroke();
    c.fillText(String(t), left - 5, y(t));
  }
  c.textAlign = 'center';
  c.textBaseline = 'top';
  for (const t of xTicks) {
    c.strokeStyle = '#b9b2a6';
    c.beginPath();
    c.moveTo(x(t), top + h);
    c.lineTo(x(t), top + h + 4);
    c.stroke();
    c.fillText(String(t), x(t), top + h + 6);
  }
  c.fillText(xLabel, left + w / 2, top + h + 20);
  for (const s of series) {
    c.strokeStyle = s.color;
    c.fillStyle = s.color;
    if (s.dots) {
      for (const [px, py] of s.points) {
        c.beginPath();
        c.arc(x(px), y(py), 3.5, 0, 2 * Math.PI);
        c.fill();
      }
      continue;
    }
    c.lineWidth = s.width ?? 1.5;
    c.beginPath();
    s.points.forEach(([px, py], i) => (i === 0 ? c.moveTo(x(px), y(py)) : c.lineTo(x(px), y(py))));
    c.stroke();
  }
}
