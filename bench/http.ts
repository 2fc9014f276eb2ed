/**
 * `npm run bench -- --only http`: the HTTP API against the library, at N = 1, 8 and 32 closed-loop callers, in
 * one run on one PostgreSQL. Per level and round, one after the other on fresh databases:
 *   - the library's reservation (`Ledger#reserve`, in this process): the baseline,
 *   - the library's gate call (`Gate#call`, an auto-approved tool),
 *   - an authenticated request that does nothing else (`GET /v1/status`),
 *   - the HTTP floor: a bare node:http server (same worker thread, same client) that parses the body with
 *     `JSON.parse` and makes the library's reservation, with no authentication, request window, schema or
 *     audit: the least any reservation over HTTP does here, so its ratio caps what HTTP reserve can reach,
 *   - the same with the API's authentication statement first (the token, its principal's roles, the request
 *     counted in the fleet-wide window): the least an authenticated reservation does,
 *   - a direct reservation over HTTP (`POST /v1/operations`),
 *   - a gate call over HTTP (`POST /v1/calls`).
 * The API runs in a worker thread (bench/http-server.ts) with its own pool, as the service runs beside its
 * callers; the client keeps N keep-alive connections (undici). Each HTTP request authenticates its bearer token
 * and is counted in the fleet-wide request window, as in production. Ratios are medians of per-round ratios.
 *
 * Beside each cell, the CPU it took per operation (bench/cpu.ts): this process (the client, and the API thread
 * within it) and PostgreSQL's processes, and the cores the machine had busy. From them, per level, a bound on
 * HTTP reserve / library reserve at the library cell's CPU use: library CPU / (library CPU + no-op CPU).
 */
import { Worker } from 'node:worker_threads';
import { Pool as HttpPool } from 'undici';
import { compileConfig } from '../config/index.js';
import { createPool, type Pool } from '../db/db.js';
import { migrate } from '../db/migrate.js';
import { Gate } from '../gate/index.js';
import { PrincipalStore } from '../principals/index.js';
import { dropDatabase } from './cells.js';
import { cpuSplit, waitForQuiet, type CpuSplit } from './cpu.js';
import { medianWork, tableLine, workJson, workMeter, workRow, WORK_HEADER, type PgWork } from './pg-work.js';
import {
  closedLoop,
  freshDatabase,
  machine,
  printTable,
  saveResults,
  type LoadResult,
  type ResultEntry,
} from './harness.js';
import { BENCH_ARGS, BENCH_RAW_CONFIG, BENCH_TENANT, benchLedgerWith } from './http-config.js';

const CELLS = [
  'library reserve',
  'library gate call',
  'HTTP authenticated no-op',
  'HTTP floor: node:http + JSON.parse + library reserve',
  'HTTP floor + authentication (token, roles, request window)',
  'HTTP reserve',
  'HTTP gate call',
] as const;
type Cell = (typeof CELLS)[number];
const CEILING = "bound at the library's CPU use: library / (library + no-op) CPU";

/** A cell's load and where the machine's CPU went while it ran (the closed loop only, not its set-up). */
interface Measured extends LoadResult {
  cpu: CpuSplit;
  /** The library cells: what PostgreSQL wrote for the closed loop, per operation (bench/pg-work.ts). */
  pgWork?: PgWork;
}

interface Options {
  adminUrl: string;
  postgres: string;
  postmaster: number | null;
  quietMaxSeconds: number;
  levels: number[];
  rounds: number;
  seconds: number;
  save: boolean;
}

/** One level of one round: every cell on its own fresh database. */
async function round(o: Options, n: number, r: number): Promise<Record<Cell, Measured>> {
  const out = {} as Record<Cell, Measured>;
  for (const cell of CELLS) {
    const name = `al_bench_http_${n}_${r}_${CELLS.indexOf(cell)}`;
    const url = await freshDatabase(o.adminUrl, name);
    const pool = createPool(url, { max: 20, statementTimeoutMs: 60_000, applicationName: 'bench' });
    const client = await pool.connect();
    await migrate(client, 'actionledger', '"actionledger"');
    client.release();
    try {
      out[cell] = cell.startsWith('HTTP')
        ? await httpCell(url, pool, cell, n, o.seconds * 1000, o.postmaster)
        : await libraryCell(url, pool, cell, n, o.seconds * 1000, o.postmaster);
    } finally {
      await pool.end();
      await dropDatabase(o.adminUrl, name);
    }
  }
  return out;
}

/**
 * One library cell (`library gate call` or `library reserve`) at `n` callers for `seconds`, on a fresh migrated
 * database dropped afterwards (the statements part, bench/statements.ts, runs it alone).
 */
export async function libraryCellAlone(
  adminUrl: string,
  cell: 'library gate call' | 'library reserve',
  n: number,
  seconds: number,
  postmaster: number | null,
): Promise<LoadResult & { cpu: CpuSplit; pgWork?: PgWork }> {
  const name = `al_bench_http_alone_${n}`;
  const url = await freshDatabase(adminUrl, name);
  const pool = createPool(url, { max: 20, statementTimeoutMs: 60_000, applicationName: 'bench' });
  try {
    const client = await pool.connect();
    await migrate(client, 'actionledger', '"actionledger"');
    client.release();
    return await libraryCell(url, pool, cell, n, seconds * 1000, postmaster);
  } finally {
    await pool.end();
    await dropDatabase(adminUrl, name);
  }
}

const context = (w: number, i: number) => ({
  tenant_id: BENCH_TENANT,
  principal_id: `p-${w}`,
  role: 'agent',
  account_id: `acct-${w}`,
  conversation_id: `conv-${w}`,
  turn_id: `turn-${i}`,
  trace_id: `trace-${i}`,
  task_id: `task-${i}`,
  workflow_step_id: 's1',
});

/** Runs the closed loop and measures the CPU it took. */
async function measured(
  postmaster: number | null,
  n: number,
  ms: number,
  fn: (worker: number, i: number) => Promise<void>,
  apiThread: number | null = null,
): Promise<Measured> {
  const split = cpuSplit(postmaster, apiThread);
  const load = await closedLoop(n, ms, fn);
  return { ...load, cpu: split() };
}

async function libraryCell(
  url: string,
  pool: Pool,
  cell: Cell,
  n: number,
  ms: number,
  postmaster: number | null,
): Promise<Measured> {
  const config = compileConfig(BENCH_RAW_CONFIG, { DATABASE_URL: url });
  const ledger = benchLedgerWith(config, pool);
  const gate = new Gate({ config, pool, ledger });
  const meter = workMeter(url);
  try {
    await meter.start();
    const run = await measured(postmaster, n, ms, async (w, i) => {
      if (cell === 'library reserve') {
        await ledger.reserve({ ...context(w, i), approval_id: 'a1', policy_version: 'v1' }, 'issue_refund', BENCH_ARGS);
        return;
      }
      const result = await gate.call(context(w, i), 'issue_refund', BENCH_ARGS);
      if (!result.ok) throw new Error(`gate refused: ${result.error} ${result.message}`);
    });
    return { ...run, pgWork: await meter.stop(run.ops) };
  } finally {
    ledger.stop();
  }
}

async function httpCell(
  url: string,
  pool: Pool,
  cell: Cell,
  n: number,
  ms: number,
  postmaster: number | null,
): Promise<Measured> {
  const config = compileConfig(BENCH_RAW_CONFIG, { DATABASE_URL: url });
  const store = new PrincipalStore(config, pool);
  await store.add('bench-service', 'service', 'bench', 'bench');
  for (const role of ['service', 'agent']) await store.grant('bench-service', BENCH_TENANT, role, 'bench');
  const { token } = await store.createToken('bench-service', BENCH_TENANT, 'bench', 1, 'bench');
  const bare = cell.startsWith('HTTP floor');
  const worker = new Worker(new URL('./http-server.js', import.meta.url), {
    workerData: {
      url,
      raw: BENCH_RAW_CONFIG,
      bare: bare ? (cell.includes('authentication') ? 'authenticated' : 'plain') : undefined,
    },
  });
  const { port, tid } = await new Promise<{ port: number; tid: number }>((resolve, reject) => {
    worker.once('message', resolve);
    worker.once('error', reject);
  });
  const http = new HttpPool(`http://127.0.0.1:${port}`, { connections: n, pipelining: 1 });
  const headers = { authorization: `Bearer ${token}`, 'content-type': 'application/json' };
  try {
    return await measured(
      postmaster,
      n,
      ms,
      async (w, i) => {
        if (cell === 'HTTP authenticated no-op') {
          // The floor: a request authenticated and counted like the others, then nothing (`GET /v1/status`).
          const res = await http.request({ method: 'GET', path: '/v1/status', headers });
          await res.body.text();
          if (res.statusCode !== 200) throw new Error(`/v1/status answered ${res.statusCode}`);
          return;
        }
        if (bare) {
          const ctx = { ...context(w, i), approval_id: 'a1', policy_version: 'v1' };
          const floorBody = JSON.stringify({ context: ctx, tool: 'issue_refund', arguments: BENCH_ARGS });
          const res = await http.request({ method: 'POST', path: '/reserve', headers, body: floorBody });
          const answer = (await res.body.json()) as { ok?: boolean; error?: string };
          if (res.statusCode !== 200 || answer.ok !== true)
            throw new Error(`the floor answered ${res.statusCode}: ${JSON.stringify(answer)}`);
          return;
        }
        const body =
          cell === 'HTTP reserve'
            ? {
                tool: 'issue_refund',
                arguments: BENCH_ARGS,
                task_id: `task-${i}`,
                workflow_step_id: 's1',
                approval_id: 'a1',
                policy_version: 'v1',
              }
            : {
                tool: 'issue_refund',
                arguments: BENCH_ARGS,
                task_id: `task-${i}`,
                workflow_step_id: 's1',
                role: 'agent',
              };
        const path = cell === 'HTTP reserve' ? '/v1/operations' : '/v1/calls';
        const res = await http.request({ method: 'POST', path, headers, body: JSON.stringify(body) });
        const answer = (await res.body.json()) as { ok?: boolean; error?: string };
        if (res.statusCode !== 200 || answer.ok !== true)
          throw new Error(`${path} answered ${res.statusCode}: ${JSON.stringify(answer)}`);
      },
      tid,
    );
  } finally {
    await http.close();
    const stopped = new Promise((resolve) => worker.once('message', resolve));
    worker.postMessage('stop');
    await stopped;
    await worker.terminate();
  }
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? (s[m] ?? 0) : ((s[m - 1] ?? 0) + (s[m] ?? 0)) / 2;
};

/** Runs every level `rounds` times and prints the table; replaces `runs.http` in results.json when `save`. */
export async function runHttpBench(o: Options): Promise<void> {
  process.stdout.write(
    `# HTTP API against the library; PostgreSQL ${o.postgres}; ${machine()}; ${o.seconds} s per cell\n`,
  );
  const rows: (string | number)[][] = [];
  const entries: ResultEntry[] = [];
  const workRows: (string | number)[][] = [];
  const workTables: string[] = [];
  for (const n of o.levels) {
    const rounds: Record<Cell, Measured>[] = [];
    for (let r = 0; r < o.rounds; r++) {
      await waitForQuiet(o.postmaster, o.quietMaxSeconds * 1000);
      const got = await round(o, n, r);
      rounds.push(got);
      process.stdout.write(
        `  round ${r + 1} N=${n}: ${CELLS.map((c) => `${c} ${got[c].opsPerS.toFixed(0)}/s`).join(', ')}\n`,
      );
    }
    for (const cell of CELLS) {
      const ops = median(rounds.map((x) => x[cell].opsPerS));
      const ratio = median(rounds.map((x) => x[cell].opsPerS / x['library reserve'].opsPerS));
      const p50 = median(rounds.map((x) => x[cell].p50Ms));
      const p99 = median(rounds.map((x) => x[cell].p99Ms));
      // CPU per operation, in microseconds: what each side spends on one answer, whatever the concurrency.
      const perOp = (pick: (c: CpuSplit) => number): number =>
        median(rounds.map((x) => (pick(x[cell].cpu) * x[cell].seconds * 1e6) / Math.max(1, x[cell].ops)));
      const nodeUs = perOp((c) => c.nodeCores);
      const apiUs = perOp((c) => c.threadCores);
      const postgresUs = perOp((c) => c.postgresCores);
      const busy = median(rounds.map((x) => x[cell].cpu.machineCores));
      rows.push([String(n), cell, ops, p50, p99, ratio, nodeUs, apiUs, postgresUs, busy]);
      const works = rounds.flatMap((x) => (x[cell].pgWork === undefined ? [] : [x[cell].pgWork]));
      const work = works.length === 0 ? undefined : medianWork(works);
      if (work !== undefined) {
        workRows.push(workRow(n, cell, postgresUs / 1000, work));
        workTables.push(`N = ${n}, ${cell}: ${tableLine(work)}`);
      }
      entries.push({
        name: cell.replaceAll(' ', '_'),
        concurrency: n,
        ops_per_s: ops,
        p50_ms: p50,
        p99_ms: p99,
        ratio_to_library_reserve: ratio,
        node_cpu_us_per_op: nodeUs,
        api_thread_cpu_us_per_op: apiUs,
        postgres_cpu_us_per_op: postgresUs,
        machine_busy_cores: busy,
        ...(work === undefined ? {} : workJson(work)),
      });
    }
    // A bound on HTTP reserve / library reserve: an HTTP reservation costs at least a library reservation (its
    // work moves to the API thread) plus an authenticated request that does nothing, so at the library cell's CPU
    // use its rate cannot exceed this share of the library's. A route keeping more cores busy could exceed it.
    const cpuOf = (x: Record<Cell, Measured>, cell: Cell): number =>
      ((x[cell].cpu.nodeCores + x[cell].cpu.postgresCores) * x[cell].seconds) / Math.max(1, x[cell].ops);
    const ceiling = median(
      rounds.map((x) => {
        const library = cpuOf(x, 'library reserve');
        return library / (library + cpuOf(x, 'HTTP authenticated no-op'));
      }),
    );
    rows.push([String(n), CEILING, '-', '-', '-', ceiling, '-', '-', '-', '-']);
    entries.push({
      name: 'HTTP_reserve_cpu_ceiling',
      concurrency: n,
      ops_per_s: NaN,
      p50_ms: null,
      p99_ms: null,
      ratio_to_library_reserve: ceiling,
    });
  }
  printTable(
    [
      'N',
      'measurement',
      'ops/s',
      'p50 ms',
      'p99 ms',
      '/ library reserve',
      'node µs/op',
      'of it API thread',
      'postgres µs/op',
      'busy cores',
    ],
    rows,
  );
  process.stdout.write(
    '\nPostgreSQL work per operation of the library cells (medians over rounds; WAL from pg_stat_wal, rows from pg_stat_user_tables, index entries derived: bench/pg-work.ts; the peer is measured by the table part, not here):\n',
  );
  printTable(WORK_HEADER, workRows);
  process.stdout.write(`Heap rows per operation, by table:\n${workTables.map((l) => `- ${l}`).join('\n')}\n`);
  if (o.save) saveResults('http', entries, { machine: machine(), postgres: o.postgres });
}
