// The head view's script: wrapped by mod.rs in `(function (ROOT_ID, DATA) { ... })`, so it
// only sees its own root. DATA.kinds[k] = {name, layers, heads, q, k, attn, scores?}, attn flat
// [layer][head][query][key] with null for a removed head; scores (a grid the view is coloured
// by, `colour_by`) flat [layer][head] with null where the grid has none, DATA.label its name.
'use strict';
const root = document.getElementById(ROOT_ID);
const svg = root.querySelector('.hs-svg'), NS = svg.namespaceURI;
const controls = root.querySelector('.hs-controls'), note = root.querySelector('.hs-note');
const ROW = 22, GAP = 260, PAD = 6, MIN_WEIGHT = 0.01;
const st = { kind: 0, layer: 0, head: 'all', hover: null };
let lineGroup = null, toks = { left: [], right: [] };

const kind = () => DATA.kinds[st.kind];
const range = (n) => Array.from({ length: n }, (_, i) => i);
const colour = (h) => 'hsl(' + Math.round((h * 360) / kind().heads) + ',70%,45%)';
const weight = (K, l, h, i, j) => K.attn[((l * K.heads + h) * K.q.length + i) * K.k.length + j];
const removed = (K, l, h) => weight(K, l, h, 0, 0) === null;
const rowY = (i) => i * ROW + ROW / 2 + 2;

function el(ns, tag, attrs, parent, text) {
  const e = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  for (const a in attrs) e.setAttribute(a, attrs[a]);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}

function textWidth(tokens) {
  const ctx = document.createElement('canvas').getContext('2d');
  if (ctx) ctx.font = '13px sans-serif';
  return Math.max(...tokens.map((t) => (ctx ? ctx.measureText(t).width : t.length * 7.5)));
}

function picker(cls, label, options, onchange) {
  const wrap = el(null, 'label', {}, controls, label + ' ');
  const s = el(null, 'select', { class: cls }, wrap);
  for (const [value, text] of options) el(null, 'option', { value: value }, s, text);
  s.addEventListener('change', () => onchange(s.value));
  return s;
}

function pickHead(h) {
  st.head = h;
  refresh();
}

function buildControls() {
  const K = kind();
  controls.textContent = '';
  if (DATA.kinds.length > 1) {
    picker('hs-kind', 'Attention', DATA.kinds.map((k, i) => [i, k.name]), (v) => {
      st.kind = +v;
      st.layer = Math.min(st.layer, kind().layers - 1);
      st.head = 'all';
      st.hover = null;
      build();
    });
  }
  picker('hs-layer', 'Layer', range(K.layers).map((l) => [l, l]), (v) => {
    st.layer = +v;
    refresh();
  });
  picker('hs-head', 'Head', [['all', 'all']].concat(range(K.heads).map((h) => [h, h])), (v) => pickHead(v === 'all' ? 'all' : +v));
  const boxes = el(null, 'span', { class: 'hs-heads' }, controls);
  for (const h of range(K.heads)) {
    const box = el(null, 'span', { class: 'hs-headbox', 'data-head': h, title: 'head ' + h }, boxes);
    box.style.background = colour(h);
    box.addEventListener('click', () => pickHead(st.head === h ? 'all' : h));
  }
  if (K.scores) {
    // The grid's value of each head of the layer shown, on a diverging scale (red above 0,
    // blue below, white at 0) shared by every layer of the kind.
    const row = el(null, 'span', { class: 'hs-scores', title: DATA.label || 'scores' }, controls);
    el(null, 'span', { class: 'hs-scores-label' }, row, (DATA.label || 'scores') + ':');
    for (const h of range(K.heads)) {
      const box = el(null, 'span', { class: 'hs-scorebox', 'data-head': h }, row);
      box.addEventListener('click', () => pickHead(st.head === h ? 'all' : h));
    }
  }
}

const score = (K, l, h) => (K.scores ? K.scores[l * K.heads + h] : null);
function scoreColour(K, v) {
  const top = Math.max(1e-12, ...K.scores.filter((x) => x !== null).map(Math.abs));
  const a = Math.min(1, Math.abs(v) / top);
  return 'hsl(' + (v >= 0 ? 0 : 220) + ',75%,' + Math.round(100 - 45 * a) + '%)';
}

// One token: a shaded background (the hovered token's weights) under its text.
function token(side, text, i, x, width) {
  const g = el(NS, 'g', { class: 'hs-tok hs-tok-' + side, 'data-i': i }, svg);
  const bg = el(NS, 'rect', { x: x - 3, y: rowY(i) - ROW / 2 + 1, width: width + 6, height: ROW - 2, rx: 3, fill: '#4a7fd4', 'fill-opacity': 0 }, g);
  const anchor = side === 'left' ? { x: x + width, 'text-anchor': 'end' } : { x: x, 'text-anchor': 'start' };
  el(NS, 'text', Object.assign(anchor, { y: rowY(i), 'dominant-baseline': 'central' }), g, text);
  g.addEventListener('mouseover', () => {
    if (st.hover && st.hover.side === side && st.hover.i === i) return;
    st.hover = { side: side, i: i };
    refresh();
  });
  g.addEventListener('mouseout', (e) => {
    if (e.relatedTarget && g.contains(e.relatedTarget)) return;
    st.hover = null;
    refresh();
  });
  return { g: g, bg: bg };
}

let x1 = 0, x2 = 0;
function buildTokens() {
  const K = kind(), wl = textWidth(K.q), wr = textWidth(K.k);
  svg.textContent = '';
  x1 = PAD + wl + 8;
  x2 = x1 + GAP;
  svg.setAttribute('width', Math.ceil(x2 + 8 + wr + PAD));
  svg.setAttribute('height', Math.max(K.q.length, K.k.length) * ROW + 4);
  lineGroup = el(NS, 'g', { class: 'hs-lines' }, svg);
  toks = { left: K.q.map((t, i) => token('left', t, i, PAD, wl)), right: K.k.map((t, i) => token('right', t, i, x2 + 8, wr)) };
}

function drawLines(K, heads, shade) {
  const hv = st.hover;
  const qs = hv && hv.side === 'left' ? [hv.i] : range(K.q.length);
  const ks = hv && hv.side === 'right' ? [hv.i] : range(K.k.length);
  let n = 0;
  lineGroup.textContent = '';
  for (const h of heads) {
    for (const i of qs) {
      for (const j of ks) {
        const w = weight(K, st.layer, h, i, j);
        if (w === null || w < MIN_WEIGHT) continue;
        el(NS, 'line', { class: 'hs-line', x1: x1, y1: rowY(i), x2: x2, y2: rowY(j), stroke: colour(h), 'stroke-width': 2, 'stroke-opacity': w, 'data-q': i, 'data-k': j, 'data-h': h }, lineGroup);
        n++;
        if (hv) {
          const [side, t] = hv.side === 'left' ? ['right', j] : ['left', i];
          shade[side][t] = Math.max(shade[side][t], w);
        }
      }
    }
  }
  return n;
}

function refresh() {
  const K = kind();
  const gone = range(K.heads).filter((h) => removed(K, st.layer, h));
  const heads = range(K.heads).filter((h) => (st.head === 'all' || st.head === h) && !gone.includes(h));
  Object.assign(root.dataset, { kind: K.name, layer: st.layer, head: st.head });
  for (const [cls, v] of [['hs-kind', st.kind], ['hs-layer', st.layer], ['hs-head', st.head]]) {
    const s = controls.querySelector('.' + cls);
    if (s) s.value = String(v);
  }
  controls.querySelectorAll('.hs-headbox').forEach((b, h) => {
    b.classList.toggle('hs-on', st.head === 'all' || st.head === h);
    b.classList.toggle('hs-removed', gone.includes(h));
    b.title = 'head ' + h + (gone.includes(h) ? ' (removed)' : '');
  });
  controls.querySelectorAll('.hs-scorebox').forEach((b, h) => {
    const v = score(K, st.layer, h);
    b.dataset.score = v === null ? '' : String(v);
    b.textContent = v === null ? '\u00b7' : v.toFixed(2);
    b.style.background = v === null ? '#eee' : scoreColour(K, v);
    b.title = 'head ' + h + ': ' + (v === null ? 'no value' : v) + ' (' + (DATA.label || 'scores') + ')';
    b.classList.toggle('hs-on', st.head === h);
  });
  const shade = { left: K.q.map(() => 0), right: K.k.map(() => 0) };
  const n = drawLines(K, heads, shade);
  for (const side of ['left', 'right']) {
    toks[side].forEach((t, i) => {
      t.bg.setAttribute('fill-opacity', (0.6 * shade[side][i]).toFixed(3));
      t.g.classList.toggle('hs-active', !!st.hover && st.hover.side === side && st.hover.i === i);
    });
  }
  const which = st.head === 'all' ? 'all heads' : 'head ' + st.head + (gone.includes(st.head) ? ' (removed)' : '');
  const goneText = st.head === 'all' && gone.length ? ' (removed: ' + gone.join(', ') + ')' : '';
  note.textContent = K.name + ', layer ' + st.layer + ', ' + which + goneText + ': ' + n + ' lines of weight \u2265 ' + MIN_WEIGHT;
}

function build() {
  buildControls();
  buildTokens();
  refresh();
}

build();
