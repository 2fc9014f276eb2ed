/**
 * The console's files beyond its stylesheet and live-region module (assets.ts): the overview's module, uPlot
 * (the chart library, served from this package's node_modules, never a CDN: the CSP allows this origin only)
 * and the favicon. uPlot's files are read once, at registration, and served under a path that names its version,
 * so browsers may keep them for a year: an upgrade changes the path.
 */
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import type { FastifyInstance, FastifyReply } from 'fastify';
import { OUTCOMES } from './overview-data.js';

interface UPlotFiles {
  version: string;
  js: string;
  css: string;
}

let uplotFiles: UPlotFiles | undefined;

/** uPlot's ES module and stylesheet, read from node_modules once. */
export function uplot(): UPlotFiles {
  if (uplotFiles !== undefined) return uplotFiles;
  const require = createRequire(import.meta.url);
  const pkg = require.resolve('uplot/package.json');
  const dist = join(dirname(pkg), 'dist');
  uplotFiles = {
    version: (JSON.parse(readFileSync(pkg, 'utf8')) as { version: string }).version,
    js: readFileSync(join(dist, 'uPlot.esm.js'), 'utf8'),
    css: readFileSync(join(dist, 'uPlot.min.css'), 'utf8'),
  };
  return uplotFiles;
}

/** Where uPlot's files are served (its version in the path: they may be cached for good). */
export function uplotBase(): string {
  return `/console/static/uplot-${uplot().version}`;
}

/** One colour per state, in OUTCOMES' order: the chart's series. */
const COLOURS: Record<(typeof OUTCOMES)[number], string> = {
  pending: '#8c959f',
  executing: '#0969da',
  succeeded: '#1a7f37',
  unknown: '#bf8700',
  needs_review: '#cf222e',
  compensating: '#8250df',
  compensated: '#6e7781',
  failed: '#82071e',
};

/**
 * The overview's module: polls the JSON endpoint the chart names (`data-src`), one request at a time, 3 s after
 * the last answer and not while the page is hidden, and draws the
 * operations per minute by state with uPlot. Numbers only come from the JSON; no markup is built from it (uPlot
 * writes its legend as text). The counters and tables around the chart are the server's, refreshed by the
 * live-region module (assets.ts). After each draw the chart's element says how many operations it drew
 * (`data-drawn`) and when the data was read (`data-at`), for the reader of the page source and for the tests.
 */
export function overviewJs(): string {
  return `// actionledger console: the overview's chart (no inline script: the page's CSP is default-src 'self').
import uPlot from '${uplotBase()}/uPlot.esm.js';
const OUTCOMES = ${JSON.stringify(OUTCOMES)};
const COLOURS = ${JSON.stringify(COLOURS)};
const box = document.getElementById('chart');
let chart = null;
function size() {
  return { width: Math.max(260, box.clientWidth), height: window.innerWidth < 640 ? 200 : 260 };
}
function options() {
  return {
    ...size(),
    cursor: { drag: { x: false, y: false } },
    scales: { x: { time: true } },
    axes: [{}, { label: 'operations / min', size: 50 }],
    series: [{}, ...OUTCOMES.map((k) => ({ label: k, stroke: COLOURS[k], width: 2, points: { show: false } }))],
  };
}
async function tick() {
  const abort = new AbortController();
  const limit = setTimeout(() => abort.abort(), 20000);
  try {
    const res = await fetch(box.dataset.src, {
      credentials: 'same-origin',
      headers: { accept: 'application/json' },
      signal: abort.signal,
    });
    if (res.status === 401) { location.reload(); return; }
    if (!res.ok) return;
    const o = await res.json();
    const xs = o.per_minute.map((p) => Date.parse(p.minute) / 1000);
    const data = [xs, ...OUTCOMES.map((k) => o.per_minute.map((p) => p.by_outcome[k]))];
    if (chart === null) {
      box.replaceChildren();
      chart = new uPlot(options(), data, box);
    } else chart.setData(data);
    box.dataset.drawn = String(data.slice(1).flat().reduce((a, b) => a + b, 0));
    box.dataset.at = o.at;
  } catch {
    // offline for a moment, or no answer within 20 s: the next poll tries again
  } finally {
    clearTimeout(limit);
  }
}
// One request at a time: the next poll is set 3 s after the last one finished, and none while the page is hidden
// (a background tab); shown again, the chart is read at once.
let timer = null;
let busy = false;
function later() {
  clearTimeout(timer);
  timer = null;
  if (!busy && !document.hidden) timer = setTimeout(poll, 3000);
}
async function poll() {
  clearTimeout(timer);
  timer = null;
  if (busy || document.hidden) return;
  busy = true;
  try {
    await tick();
  } finally {
    busy = false;
    later();
  }
}
window.addEventListener('resize', () => { if (chart !== null) chart.setSize(size()); });
if (box !== null) {
  document.addEventListener('visibilitychange', () => (document.hidden ? later() : void poll()));
  void poll();
}
`;
}

/**
 * A 16x16 icon (an ICO holding one 32-bit bitmap: a dark square with a light check mark), made here so the
 * package ships no binary: `/favicon.ico` answers without a session instead of 401 on every page.
 */
export function favicon(): Buffer {
  const size = 16;
  const header = Buffer.alloc(6);
  header.writeUInt16LE(0, 0);
  header.writeUInt16LE(1, 2); // an icon
  header.writeUInt16LE(1, 4); // one image
  const pixels = Buffer.alloc(size * size * 4);
  const mask = Buffer.alloc(size * 4); // the AND mask, rows padded to 32 bits: all opaque
  // The check mark: two strokes, in the bitmap's bottom-up rows.
  const mark = new Set<string>();
  for (let i = 0; i < 4; i++) for (const d of [0, 1]) mark.add(`${3 + i},${8 - i + d}`);
  for (let i = 0; i < 7; i++) for (const d of [0, 1]) mark.add(`${6 + i},${5 + i + d}`);
  for (let y = 0; y < size; y++)
    for (let x = 0; x < size; x++) {
      const o = (y * size + x) * 4;
      const on = mark.has(`${x},${y}`);
      pixels[o] = on ? 0xff : 0x6a; // blue
      pixels[o + 1] = on ? 0xff : 0x30; // green
      pixels[o + 2] = on ? 0xff : 0x1b; // red
      pixels[o + 3] = 0xff;
    }
  const info = Buffer.alloc(40);
  info.writeUInt32LE(40, 0);
  info.writeInt32LE(size, 4);
  info.writeInt32LE(size * 2, 8); // the height of the image and its mask together
  info.writeUInt16LE(1, 12);
  info.writeUInt16LE(32, 14);
  info.writeUInt32LE(pixels.length + mask.length, 20);
  const image = Buffer.concat([info, pixels, mask]);
  const entry = Buffer.alloc(16);
  entry.writeUInt8(size, 0);
  entry.writeUInt8(size, 1);
  entry.writeUInt16LE(1, 4); // colour planes
  entry.writeUInt16LE(32, 6); // bits per pixel
  entry.writeUInt32LE(image.length, 8);
  entry.writeUInt32LE(header.length + entry.length, 12);
  return Buffer.concat([header, entry, image]);
}

const FAVICON = favicon();

/** `/favicon.ico` on the API's app, outside /console: no session, nothing set, a day's cache. */
export function registerFavicon(app: FastifyInstance): void {
  app.get('/favicon.ico', { config: { console: 'public' } }, (_request, reply) =>
    reply.header('content-type', 'image/x-icon').header('cache-control', 'public, max-age=86400').send(FAVICON),
  );
}

/** The overview's module and uPlot's files, under /console/static/ (a route of the console's own plugin). */
export function registerStatic(app: FastifyInstance): void {
  const files = uplot();
  const forever = 'public, max-age=31536000, immutable';
  const serve = (type: string, cache: string, body: string) => (_request: unknown, reply: FastifyReply) =>
    reply
      .header('content-type', type)
      .header('cache-control', cache)
      .header('x-content-type-options', 'nosniff')
      .send(body);
  const js = 'text/javascript; charset=utf-8';
  app.get('/static/overview.js', { config: { console: 'public' } }, serve(js, 'no-cache', overviewJs()));
  const base = `/static/uplot-${files.version}`;
  app.get(`${base}/uPlot.esm.js`, { config: { console: 'public' } }, serve(js, forever, files.js));
  app.get(
    `${base}/uPlot.min.css`,
    { config: { console: 'public' } },
    serve('text/css; charset=utf-8', forever, files.css),
  );
}
