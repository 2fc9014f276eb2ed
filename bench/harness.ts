/**
 * Benchmark plumbing: one PostgreSQL for the run (DATABASE_URL, or a fresh embedded cluster), a closed-loop
 * load generator, and the table printer. Figures are ratios against a baseline measured in the same run:
 * the machines are shared and noisy, absolute numbers are not comparable between runs.
 */
import { chmodSync, mkdtempSync, rmSync, writeFileSync, readFileSync, existsSync } from 'node:fs';
import { cpus, totalmem, tmpdir } from 'node:os';
import { join } from 'node:path';
import { createServer } from 'node:net';
import pg from 'pg';

export interface BenchDatabase {
  adminUrl: string;
  version: string;
  /** The server's `shared_preload_libraries`. */
  preloaded: string[];
  close(): Promise<void>;
}

export async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

/** Interrupted: stop the embedded cluster too (it runs in its own process group and would outlive the run). */
export function stopOnSignal(db: BenchDatabase): void {
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.once(signal, () => {
      process.stderr.write(`${signal}: stopping the benchmark database\n`);
      process.on('uncaughtException', () => undefined); // open connections die while the cluster stops
      void db.close().finally(() => process.exit(130));
    });
  }
}

/**
 * The run's PostgreSQL: DATABASE_URL as it is, or a fresh embedded cluster. `preload`: libraries the embedded
 * cluster loads at start (`shared_preload_libraries`, set with ALTER SYSTEM and a restart); a DATABASE_URL server
 * is left as configured, and `preloaded` says what it loads.
 */
export async function openBenchDatabase(options: { preload?: string[] } = {}): Promise<BenchDatabase> {
  let url = process.env.DATABASE_URL;
  let stop = (): Promise<void> => Promise.resolve();
  if (url === undefined || url === '') {
    const { openEmbeddedDatabase } = await import('../embedded/embedded.js');
    const dir = mkdtempSync(join(tmpdir(), 'actionledger-bench-'));
    chmodSync(dir, 0o711);
    let db = await openEmbeddedDatabase({ dataDir: dir, port: await freePort() });
    const preload = options.preload ?? [];
    if (preload.length > 0) {
      if (!preload.every((l) => /^[a-z_]+$/.test(l))) throw new Error(`bad library name in ${preload.join(',')}`);
      const c = new pg.Client({ connectionString: db.url });
      await c.connect();
      await c.query(`ALTER SYSTEM SET shared_preload_libraries = '${preload.join(',')}'`);
      await c.end();
      await db.stop();
      db = await openEmbeddedDatabase({ dataDir: dir, port: await freePort() });
    }
    const started = db;
    url = db.url;
    stop = async () => {
      await started.stop();
      rmSync(dir, { recursive: true, force: true });
    };
  }
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  const { rows } = await c.query<{ server_version: string }>('SHOW server_version');
  const { rows: libs } = await c.query<{ shared_preload_libraries: string }>('SHOW shared_preload_libraries');
  await c.end();
  const preloaded = (libs[0]?.shared_preload_libraries ?? '')
    .split(',')
    .map((l) => l.trim().replace(/^"|"$/g, ''))
    .filter((l) => l !== '');
  return { adminUrl: url, version: rows[0]?.server_version ?? '?', preloaded, close: stop };
}

/** Creates a fresh database on the bench server and returns its URL. */
export async function freshDatabase(adminUrl: string, name: string): Promise<string> {
  const c = new pg.Client({ connectionString: adminUrl });
  await c.connect();
  await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
  await c.query(`CREATE DATABASE ${name}`);
  await c.end();
  const u = new URL(adminUrl);
  u.pathname = `/${name}`;
  return u.toString();
}

export interface LoadResult {
  ops: number;
  seconds: number;
  opsPerS: number;
  p50Ms: number;
  p99Ms: number;
}

/** Runs `fn(worker, i)` from `concurrency` closed loops for `durationMs`; latency per call. */
export async function closedLoop(
  concurrency: number,
  durationMs: number,
  fn: (worker: number, i: number) => Promise<void>,
): Promise<LoadResult> {
  const latencies: number[] = [];
  const start = performance.now();
  const deadline = start + durationMs;
  let counter = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async (_, w) => {
      while (performance.now() < deadline) {
        const i = counter++;
        const t0 = performance.now();
        await fn(w, i);
        latencies.push(performance.now() - t0);
      }
    }),
  );
  const seconds = (performance.now() - start) / 1000;
  return { ops: latencies.length, seconds, opsPerS: latencies.length / seconds, ...percentiles(latencies) };
}

/** p50 and p99 of `values` (NaN for an empty list: nothing was measured). */
export function percentiles(values: number[]): { p50Ms: number; p99Ms: number } {
  const s = [...values].sort((a, b) => a - b);
  const at = (q: number): number => s[Math.min(s.length - 1, Math.floor(q * s.length))] ?? NaN;
  return { p50Ms: at(0.5), p99Ms: at(0.99) };
}

export function machine(): string {
  const cpu = cpus()[0]?.model ?? 'unknown CPU';
  return `${cpus().length} cores (${cpu.trim()}), ${Math.round(totalmem() / 2 ** 30)} GiB, Node ${process.version}`;
}

export function printTable(header: string[], rows: (string | number)[][]): string {
  const cells = [header, ...rows.map((r) => r.map((c) => (typeof c === 'number' ? formatNumber(c) : c)))];
  const widths = header.map((_, i) => Math.max(...cells.map((r) => String(r[i] ?? '').length)));
  const line = (r: (string | number)[]): string =>
    `| ${r.map((c, i) => String(c).padEnd(widths[i] ?? 0)).join(' | ')} |`;
  const out = [
    line(cells[0] ?? []),
    `|${widths.map((w) => '-'.repeat(w + 2)).join('|')}|`,
    ...cells.slice(1).map(line),
  ].join('\n');
  process.stdout.write(out + '\n');
  return out;
}

function formatNumber(n: number): string {
  if (!Number.isFinite(n)) return '-';
  if (Math.abs(n) >= 100) return Math.round(n).toString();
  if (Math.abs(n) >= 10) return n.toFixed(1);
  return n.toFixed(2);
}

/** A value an entry of bench/results.json holds: a figure, a text, or figures by name (per table). */
export type ResultValue = string | number | null | { [key: string]: ResultValue };

export interface ResultEntry {
  name: string;
  concurrency: number;
  ops_per_s: number;
  p50_ms: number | null;
  p99_ms: number | null;
  [ratio: string]: ResultValue;
}

/**
 * Replaces this benchmark's entries in bench/results.json (or in the file BENCH_RESULTS names, for a trial run
 * that must not replace the stored one), keeping the others'.
 */
export function saveResults(bench: string, entries: ResultEntry[], meta: Record<string, string>): void {
  const path = process.env.BENCH_RESULTS ?? join('bench', 'results.json');
  const all = existsSync(path)
    ? (JSON.parse(readFileSync(path, 'utf8')) as { runs: Record<string, unknown> })
    : { runs: {} };
  all.runs[bench] = { ...meta, at: new Date().toISOString(), entries };
  writeFileSync(path, JSON.stringify(all, null, 2) + '\n');
}

/** Where `npm run bench` writes its last run in bench/results.md; everything outside the markers is kept. */
export const LAST_RUN_START = '<!-- bench: last run (written by npm run bench, between these markers) -->';
export const LAST_RUN_END = '<!-- bench: end of last run -->';

/** Replaces the last run between the markers in `path`; a file without them gets them at its top. */
export function writeLastRun(path: string, lastRun: string): void {
  const old = existsSync(path) ? readFileSync(path, 'utf8') : '';
  const start = old.indexOf(LAST_RUN_START);
  const end = old.indexOf(LAST_RUN_END);
  const [before, after] =
    start >= 0 && end > start ? [old.slice(0, start), old.slice(end + LAST_RUN_END.length)] : ['', '\n\n' + old];
  writeFileSync(path, `${before}${LAST_RUN_START}\n\n${lastRun.trim()}\n\n${LAST_RUN_END}${after}`);
}
