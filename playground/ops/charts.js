// Inline SVG charts for the workbench: no library, text through textContent only.

const NS = 'http://www.w3.org/2000/svg';

function node(tag, attrs = {}, text) {
  const n = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v != null) n.setAttribute(k, String(v));
  if (text != null) n.textContent = text;
  return n;
}
function svg(w, h, label) {
  const s = node('svg', { viewBox: `0 0 ${w} ${h}`, role: 'img', 'aria-label': label });
  s.append(node('title', {}, label));
  return s;
}

/** A colour per series, stable by index. */
// In the order of the anomaly categories: compensation retries amber, dead ones red.
export const PALETTE = ['#607d8b', '#ad1457', '#7b4bc4', '#00838f', '#2f5fd0', '#9e9d24', '#5d4037', '#d9822b', '#c62828', '#2e9d5b'];

/**
 * Stacked bars per day. `days`: [{label, key, values: {series: n}}]; `series`: [{key, label, colour}].
 * `title(day, n)` gives each bar's tooltip.
 */
export function stackedBars({ days, series, label, title }) {
  const W = 640, H = 220, L = 28, B = 22, T = 8, R = 4;
  const max = Math.max(1, ...days.map((d) => series.reduce((s, x) => s + (d.values[x.key] || 0), 0)));
  const s = svg(W, H, label);
  const ih = H - T - B, iw = W - L - R;
  const bw = iw / Math.max(1, days.length);
  const step = Math.max(1, Math.ceil(max / 4));
  const top = step * Math.ceil(max / step);
  for (let v = 0; v <= top; v += step) {
    const y = T + ih - (v / top) * ih, i = v;
    s.append(node('line', { class: 'axis', x1: L, x2: W - R, y1: y, y2: y, 'stroke-dasharray': i ? '2 3' : null }),
      node('text', { x: L - 4, y: y + 4, 'text-anchor': 'end' }, String(v)));
  }
  days.forEach((d, i) => {
    const g = node('g', { 'data-day': d.key, 'data-total': series.reduce((a, x) => a + (d.values[x.key] || 0), 0) });
    let y = T + ih;
    for (const x of series) {
      const n = d.values[x.key] || 0;
      if (!n) continue;
      const h = (n / top) * ih;
      y -= h;
      g.append(node('rect', { x: L + i * bw + 1, y, width: Math.max(1, bw - 2), height: h, fill: x.colour, 'data-series': x.key, 'data-count': n }));
    }
    g.append(node('title', {}, title(d, Number(g.getAttribute('data-total')))));
    const every = days.length > 10 ? Math.ceil(days.length / 8) : 1;
    if (i % every === 0 || i === days.length - 1) {
      g.append(node('text', { x: L + i * bw + bw / 2, y: H - 6, 'text-anchor': 'middle' }, d.label));
    }
    s.append(g);
  });
  return s;
}

/** Horizontal bars: [{key, label, count, colour}]. */
export function hbars({ items, label }) {
  const ROW = 22, W = 520, LABEL = 170, BAR = 290;
  const s = svg(W, items.length * ROW + 4, label);
  const max = Math.max(1, ...items.map((x) => x.count));
  items.forEach((x, i) => {
    const y = i * ROW + 2;
    const g = node('g', { 'data-category': x.key, 'data-count': x.count });
    g.append(node('text', { x: 0, y: y + 14 }, x.label),
      node('rect', { class: 'track', x: LABEL, y: y + 4, width: BAR, height: 12, rx: 2 }),
      node('rect', { x: LABEL, y: y + 4, width: x.count ? Math.max(2, (x.count / max) * BAR) : 0, height: 12, rx: 2, fill: x.colour }),
      node('text', { x: LABEL + BAR + 6, y: y + 14 }, String(x.count)));
    s.append(g);
  });
  return s;
}

/** Healed vs ticketed per category: [{key, label, healed, ticketed, share}] (share: text). */
export function healingBars({ rows, label, healedLabel, ticketedLabel }) {
  const ROW = 30, W = 640, LABEL = 190, BAR = 300;
  const s = svg(W, rows.length * ROW + 4, label);
  const max = Math.max(1, ...rows.map((r) => r.healed + r.ticketed));
  rows.forEach((r, i) => {
    const y = i * ROW + 2;
    const hw = (r.healed / max) * BAR, tw = (r.ticketed / max) * BAR;
    const g = node('g', { 'data-category': r.key, 'data-healed': r.healed, 'data-ticketed': r.ticketed });
    g.append(node('text', { x: 0, y: y + 16 }, r.label),
      node('rect', { class: 'track', x: LABEL, y: y + 6, width: BAR, height: 14, rx: 2 }),
      node('rect', { class: 'healed', x: LABEL, y: y + 6, width: hw, height: 14 }, null),
      node('rect', { class: 'ticketed', x: LABEL + hw, y: y + 6, width: tw, height: 14 }),
      node('text', { x: LABEL + BAR + 8, y: y + 17 }, r.share));
    g.append(node('title', {}, `${healedLabel} ${r.healed} · ${ticketedLabel} ${r.ticketed}`));
    s.append(g);
  });
  return s;
}
