/**
 * `npm run bench -- --only fleet`: does throughput grow with dispatcher processes against one PostgreSQL?
 * For N = 1, 2 and 4 workers, started two ways:
 *   - `start`: the way a user starts the fleet, one `actionledger start --workers N` (DATABASE_URL, a
 *     configuration file routing to the sandbox provider and authorizer this process runs): its parent serves
 *     the HTTP API and schedules reconciliation as it always does, and forks the N workers with node:cluster;
 *   - `dispatcher`: N `actionledger dispatcher` child processes, as under another supervisor;
 * a backlog of Q operations is bulk-loaded on a fresh database and drained over mutual TLS (each worker its own
 * Node process, pool and claims); the rate is outcomes per second from the 10% mark to the last outcome,
 * counted in the database. Levels and launchers interleave within each round; the ratios are to N = 1 of the
 * same launcher in the same round, medians over rounds. Beside each: the cores PostgreSQL's processes used and
 * the cores the whole machine used during the drain, which say where the run saturates.
 *
 * Then the API on every worker: one `actionledger start --workers 2` takes HTTP gate calls (`POST /v1/calls`, an
 * auto-approved tool, from 32 keep-alive connections for a few seconds, its operations dispatched meanwhile), and
 * the table says how the requests spread over the two worker processes, read from each worker's
 * `actionledger_http_requests_served_total` in the fleet's `/metrics` (node:cluster deals each new connection to
 * the next worker), beside the calls per second the fleet answered.
 *
 * Every process started here is stopped when its drain ends, failed or not: each `start` (or `dispatcher`) runs
 * in its own process group, gets SIGTERM (a `start` then stops its workers as it does on a user's Ctrl-C), and
 * whatever of the group is still alive 30 s later (or once the parent has exited: a worker it left) gets
 * SIGKILL; a SIGINT or SIGTERM to the benchmark kills the groups before it exits.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { compileConfig } from '../config/index.js';
import { createPool } from '../db/db.js';
import { startDispatchKit } from '../sandbox/kit.js';
import { loadOperations } from './claim-scaling.js';
import { dropDatabase, medianOf, migratedDatabase, sleep } from './cells.js';
import { cpuSplit, findPostmaster, waitForQuiet } from './cpu.js';
import { freePort, machine, printTable, saveResults } from './harness.js';
import { BENCH_ARGS, BENCH_RAW_CONFIG, BENCH_TENANT } from './http-config.js';
import { Pool as HttpPool } from 'undici';

const BIN = join(import.meta.dirname, '..', 'bin', 'actionledger.js');
const TOKEN = 'bench-provider-token';
const SECRET = 'bench-effect-key-secret-0123456789abcdef0123456789';

/** How the workers are started: `actionledger start --workers N`, or N `actionledger dispatcher` processes. */
export type Launcher = 'start' | 'dispatcher';

export interface FleetOptions {
  adminUrl: string;
  postgres: string;
  processes: number[];
  launchers: Launcher[];
  queued: number;
  concurrency: number;
  rounds: number;
  quietMaxSeconds: number;
  save: boolean;
}

interface Cell {
  launcher: Launcher;
  processes: number;
  opsPerS: number;
  postgresCores: number;
  machineCores: number;
  otherCoresBefore: number;
}

export async function runFleetBench(o: FleetOptions): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'al-bench-fleet-'));
  const kit = await startDispatchKit({
    dir,
    token: TOKEN,
    profile: {
      profile_id: 'bench-fleet',
      // Generous windows: on a loaded machine a drain measures throughput, not authorizations gone stale.
      maximum_authorization_age_seconds: 600,
      authorization_http_timeout_seconds: 60,
      provider_http_timeout_seconds: 60,
    },
  });
  const postmaster = await findPostmaster(o.adminUrl).catch(() => null);
  // Each round: one cell per launcher and level, in that order.
  const cells: Cell[][] = [];
  const groups = new Set<number>();
  // A signal kills the groups at once; a handler installed before this one (the benchmark database's,
  // stopOnSignal) exits after its own stop, and without one this exits.
  const othersHandle = process.listenerCount('SIGINT') > 0;
  const onSignal = (signal: NodeJS.Signals): void => {
    for (const pid of groups) killGroup(pid, 'SIGKILL');
    process.stderr.write(`${signal}: the fleet's processes were killed\n`);
    if (!othersHandle) process.exit(130);
  };
  for (const signal of ['SIGINT', 'SIGTERM'] as const) process.once(signal, onSignal);
  let spread: Spread | null = null;
  try {
    for (let round = 0; round < o.rounds; round++) {
      const row: Cell[] = [];
      for (const launcher of o.launchers)
        for (const n of o.processes) {
          const otherCoresBefore = await waitForQuiet(postmaster, o.quietMaxSeconds * 1000);
          row.push({ ...(await drain(o, dir, kit, launcher, n, postmaster, groups)), otherCoresBefore });
          process.stdout.write(
            `fleet round ${round + 1}: ${launcherName(launcher, n)}: ${row.at(-1)?.opsPerS.toFixed(0)} operations/s\n`,
          );
        }
      cells.push(row);
    }
    spread = await httpSpread(o, dir, kit, groups);
  } finally {
    for (const signal of ['SIGINT', 'SIGTERM'] as const) process.off(signal, onSignal);
    await kit.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  const rows = o.launchers.flatMap((launcher) =>
    o.processes.map((n) => {
      const at = cells.map((r) => pick(r, launcher, n));
      return {
        launcher,
        processes: n,
        opsPerS: medianOf(at.map((c) => c.opsPerS)),
        ratio: medianOf(cells.map((r) => pick(r, launcher, n).opsPerS / pick(r, launcher, o.processes[0]!).opsPerS)),
        postgresCores: medianOf(at.map((c) => c.postgresCores)),
        machineCores: medianOf(at.map((c) => c.machineCores)),
        otherCoresBefore: Math.max(...at.map((c) => c.otherCoresBefore)),
      };
    }),
  );
  process.stdout.write(
    `\nfleet: ${o.queued} queued operations drained by N dispatcher workers (concurrency ${o.concurrency} each), ` +
      `PostgreSQL ${o.postgres}, ${machine()}, medians of ${o.rounds} rounds; ratio to N = ${o.processes[0]} of the same launcher in the same round\n`,
  );
  printTable(
    [
      'started by',
      'workers',
      'operations/s',
      'ratio to 1',
      'PostgreSQL cores',
      'machine cores busy',
      'other load before',
    ],
    rows.map((r) => [
      r.launcher === 'start'
        ? `actionledger start --workers ${r.processes}`
        : `${r.processes} x actionledger dispatcher`,
      String(r.processes),
      r.opsPerS.toFixed(0),
      r.ratio.toFixed(2),
      r.postgresCores.toFixed(2),
      r.machineCores.toFixed(2),
      r.otherCoresBefore.toFixed(2),
    ]),
  );
  printSpread(spread);
  if (o.save)
    saveResults(
      'fleet',
      rows.map((r) => ({
        name: `${r.launcher} processes=${r.processes}`,
        launcher: r.launcher,
        concurrency: o.concurrency,
        ops_per_s: Math.round(r.opsPerS),
        p50_ms: null,
        p99_ms: null,
        processes: r.processes,
        ratio_to_one: Number(r.ratio.toFixed(2)),
        postgres_cores: Number(r.postgresCores.toFixed(2)),
        machine_cores: Number(r.machineCores.toFixed(2)),
        other_cores_before: Number(r.otherCoresBefore.toFixed(2)),
      })),
      { machine: machine(), postgres: o.postgres, queued: String(o.queued) },
    );
}

function launcherName(launcher: Launcher, n: number): string {
  return launcher === 'start' ? `actionledger start --workers ${n}` : `${n} actionledger dispatcher processes`;
}

function pick(row: Cell[], launcher: Launcher, n: number): Cell {
  const c = row.find((x) => x.launcher === launcher && x.processes === n);
  if (c === undefined) throw new Error(`fleet bench: no cell for ${launcherName(launcher, n)}`);
  return c;
}

/** Signals the process group `pid` leads; false when none of it is left. */
function killGroup(pid: number, signal: NodeJS.Signals | 0): boolean {
  try {
    process.kill(-pid, signal);
    return true;
  } catch {
    return false;
  }
}

/**
 * Stops the group a child leads: SIGTERM to the child, then SIGKILL to the whole group once the child has
 * exited (what remains are processes it left behind) or after `graceMs`. Resolves when none of the group is left.
 */
async function stopGroup(child: ChildProcess, graceMs: number): Promise<void> {
  const pid = child.pid;
  if (pid === undefined) return;
  const exited =
    child.exitCode !== null || child.signalCode !== null
      ? Promise.resolve()
      : new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.kill('SIGTERM');
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([exited, new Promise<void>((resolve) => (timer = setTimeout(resolve, graceMs)))]);
  clearTimeout(timer);
  killGroup(pid, 'SIGKILL');
  for (let i = 0; i < 200 && killGroup(pid, 0); i++) await sleep(25);
}

/**
 * One drain: a fresh database with `o.queued` pending operations, `n` workers started by `launcher`, until all
 * are done. The process groups started are in `groups` while they run.
 */
async function drain(
  o: FleetOptions,
  dir: string,
  kit: Awaited<ReturnType<typeof startDispatchKit>>,
  launcher: Launcher,
  n: number,
  postmaster: number | null,
  groups: Set<number>,
): Promise<Omit<Cell, 'otherCoresBefore'>> {
  const name = `al_bench_fleet_${launcher}_${n}`;
  const url = await migratedDatabase(o.adminUrl, name);
  const raw = {
    // `start` serves the HTTP API on a port of its own; the dispatcher reads none of it.
    http: { host: '127.0.0.1', port: 0 },
    dispatcher: { poll_interval_ms: 100, heartbeat_interval_ms: 1000, ...kit.dispatcherConfig },
    tools: {
      issue_refund: {
        provider_id: 'billing-bench',
        endpoint: kit.provider.endpoint,
        allowed_tenants: ['tenant-a'],
        credential_env: 'BENCH_BILLING_TOKEN',
        idempotency: { mechanism: 'header', name: 'Idempotency-Key' },
        definitive_failure_statuses: [400, 422],
        readback: { url: `${kit.provider.endpoint}/by-key/{effect_key}` },
      },
    },
  };
  const configPath = join(dir, 'config.json');
  writeFileSync(configPath, JSON.stringify(raw));
  // A data folder per drain: `start` takes its lock file there.
  const dataDir = mkdtempSync(join(dir, 'data-'));
  const env = {
    PATH: process.env.PATH,
    DATABASE_URL: url,
    ACTIONLEDGER_CONFIG: configPath,
    ACTIONLEDGER_DATA_DIR: dataDir,
    ACTIONLEDGER_EFFECT_KEY_SECRET: SECRET,
    BENCH_BILLING_TOKEN: TOKEN,
    LOG_LEVEL: 'warn',
  };
  const config = compileConfig(raw, env);
  const pool = createPool(url, { max: 2, statementTimeoutMs: 60_000, applicationName: 'bench-fleet' });
  const children: ChildProcess[] = [];
  let output = '';
  const spawnGroup = (args: string[]): void => {
    const child = spawn(process.execPath, [BIN, ...args], {
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: true,
    });
    if (child.pid !== undefined) groups.add(child.pid);
    const keep = (c: Buffer): void => void (output = (output + c.toString()).slice(-4000));
    child.stdout?.on('data', keep);
    child.stderr?.on('data', keep);
    children.push(child);
  };
  try {
    await loadOperations(pool, o.queued, 'pending', 'tenant-a', config.tools.get('issue_refund'));
    await pool.query('ANALYZE actionledger.operations');
    await pool.query('ANALYZE actionledger.outbox');
    const done = async (): Promise<number> =>
      (
        await pool.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM actionledger.operations WHERE status NOT IN ('pending', 'executing')`,
        )
      ).rows[0]?.n ?? 0;
    const concurrency = ['--concurrency', String(o.concurrency)];
    if (launcher === 'start') spawnGroup(['start', '--workers', String(n), ...concurrency]);
    else for (let i = 0; i < n; i++) spawnGroup(['dispatcher', ...concurrency]);
    const mark = Math.ceil(o.queued / 10);
    const deadline = performance.now() + 120_000 + o.queued * 20;
    let markAt: number | undefined;
    let markCount = 0;
    let split: (() => ReturnType<ReturnType<typeof cpuSplit>>) | undefined;
    let finished = 0;
    let lastAt = performance.now();
    while (finished < o.queued && performance.now() < deadline) {
      await sleep(25);
      const gone = children.find((c) => c.exitCode !== null || c.signalCode !== null);
      if (gone !== undefined)
        throw new Error(
          `fleet bench: ${launcherName(launcher, n)}: a process exited (${gone.exitCode ?? gone.signalCode}) during the drain:\n${output}`,
        );
      const now = await done();
      if (now !== finished) lastAt = performance.now();
      finished = now;
      if (markAt === undefined && finished >= mark) {
        markAt = lastAt;
        markCount = finished;
        split = cpuSplit(postmaster);
      }
    }
    const cpu = split?.();
    if (finished < o.queued) throw new Error(`fleet bench: ${finished} of ${o.queued} finished before the deadline`);
    const { rows } = await pool.query<{ status: string; reason: string | null; n: number }>(
      `SELECT status, review_reason AS reason, count(*)::int AS n FROM actionledger.operations GROUP BY 1, 2`,
    );
    if (rows.some((r) => r.status !== 'succeeded'))
      throw new Error(`fleet bench: not every operation succeeded: ${JSON.stringify(rows)}`);
    return {
      launcher,
      processes: n,
      opsPerS: (finished - markCount) / ((lastAt - (markAt ?? lastAt)) / 1000),
      postgresCores: cpu?.postgresCores ?? NaN,
      machineCores: cpu?.machineCores ?? NaN,
    };
  } finally {
    await Promise.all(children.map((c) => stopGroup(c, 30_000)));
    for (const c of children) if (c.pid !== undefined) groups.delete(c.pid);
    await pool.end();
    await dropDatabase(o.adminUrl, name);
  }
}

/** What the HTTP part measured: calls answered per second, and each worker slot's share of the requests. */
interface Spread {
  callers: number;
  seconds: number;
  calls: number;
  failed: number;
  served: Map<string, number>;
}

const SPREAD_WORKERS = 2;
const SPREAD_CALLERS = 32;

function printSpread(s: Spread | null): void {
  if (s === null) return;
  const total = [...s.served.values()].reduce((a, b) => a + b, 0);
  process.stdout.write(
    `\nfleet over HTTP: actionledger start --workers ${SPREAD_WORKERS}, POST /v1/calls from ${s.callers} keep-alive connections for ${s.seconds} s: ` +
      `${(s.calls / s.seconds).toFixed(0)} gate calls/s answered (${s.failed} not 200); requests each worker served ` +
      `(actionledger_http_requests_served_total, the calls and the scrapes)\n`,
  );
  printTable(
    ['worker', 'requests served', 'share'],
    [...s.served.entries()]
      .sort(([a], [b]) => Number(a) - Number(b))
      .map(([w, n]) => [w, String(n), total === 0 ? '-' : `${((100 * n) / total).toFixed(1)} %`]),
  );
}

/** The served counter of each worker slot in a scrape. */
function servedBySlot(metrics: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const m of metrics.matchAll(/^actionledger_http_requests_served_total\{[^}]*worker="(\d+)"[^}]*\} (\d+)$/gm))
    out.set(m[1] ?? '', Number(m[2]));
  return out;
}

/** Runs the CLI to its end; rejects with its output when it fails. Resolves with its stdout. */
function cli(args: string[], env: NodeJS.ProcessEnv): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [BIN, ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (c: Buffer) => (out += c.toString()));
    child.stderr.on('data', (c: Buffer) => (out += c.toString()));
    child.once('exit', (code) =>
      code === 0 ? resolve(out) : reject(new Error(`actionledger ${args.join(' ')}: exit ${code}\n${out}`)),
    );
  });
}

/**
 * `actionledger start --workers 2` on a fresh database, gate calls over HTTP for a few seconds, and the served
 * counter of each worker before and after. The fleet is stopped whatever happens.
 */
async function httpSpread(
  o: FleetOptions,
  dir: string,
  kit: Awaited<ReturnType<typeof startDispatchKit>>,
  groups: Set<number>,
): Promise<Spread> {
  const name = 'al_bench_fleet_http';
  const url = await migratedDatabase(o.adminUrl, name);
  const port = await freePort();
  const raw = {
    ...BENCH_RAW_CONFIG,
    http: { host: '127.0.0.1', port },
    dispatcher: { poll_interval_ms: 100, heartbeat_interval_ms: 1000, ...kit.dispatcherConfig },
    tools: {
      issue_refund: {
        provider_id: 'billing-bench',
        endpoint: kit.provider.endpoint,
        allowed_tenants: [BENCH_TENANT],
        credential_env: 'BENCH_BILLING_TOKEN',
        idempotency: { mechanism: 'header', name: 'Idempotency-Key' },
        readback: { url: `${kit.provider.endpoint}/by-key/{effect_key}` },
      },
    },
  };
  const configPath = join(dir, 'config-http.json');
  writeFileSync(configPath, JSON.stringify(raw));
  const env = {
    PATH: process.env.PATH,
    DATABASE_URL: url,
    ACTIONLEDGER_CONFIG: configPath,
    ACTIONLEDGER_DATA_DIR: mkdtempSync(join(dir, 'data-')),
    ACTIONLEDGER_EFFECT_KEY_SECRET: SECRET,
    BENCH_BILLING_TOKEN: TOKEN,
    LOG_LEVEL: 'warn',
  };
  const child = spawn(process.execPath, [BIN, 'start', '--workers', String(SPREAD_WORKERS)], {
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  });
  if (child.pid !== undefined) groups.add(child.pid);
  let output = '';
  const keep = (c: Buffer): void => void (output = (output + c.toString()).slice(-4000));
  child.stdout.on('data', keep);
  child.stderr.on('data', keep);
  const base = `http://127.0.0.1:${port}`;
  const http = new HttpPool(base, { connections: SPREAD_CALLERS });
  try {
    for (let i = 0; ; i++) {
      if (child.exitCode !== null) throw new Error(`fleet bench: start exited (${child.exitCode}):\n${output}`);
      const ready = await fetch(`${base}/readyz`)
        .then((r) => r.status === 200)
        .catch(() => false);
      if (ready) break;
      if (i > 1200) throw new Error(`fleet bench: the HTTP fleet was not ready within 60 s:\n${output}`);
      await sleep(50);
    }
    const as = ['--break-glass', 'bench'];
    await cli(['principal', 'add', 'bench-agent', '--kind', 'service', ...as], env);
    await cli(['principal', 'grant', 'bench-agent', '--tenant', BENCH_TENANT, '--role', 'agent', ...as], env);
    const created = await cli(['token', 'create', 'bench-agent', '--tenant', BENCH_TENANT, '--json', ...as], env);
    const token = String(
      (
        JSON.parse(
          created
            .trim()
            .split('\n')
            .filter((l) => l.startsWith('{'))
            .at(-1) ?? '{}',
        ) as { token?: unknown }
      ).token,
    );
    const scrape = async () => servedBySlot(await (await fetch(`${base}/metrics`)).text());
    const before = await scrape();
    const seconds = o.rounds > 1 ? 10 : 5;
    const until = performance.now() + seconds * 1000;
    let calls = 0;
    let failed = 0;
    const started = performance.now();
    await Promise.all(
      Array.from({ length: SPREAD_CALLERS }, async (_, w) => {
        for (let i = 0; performance.now() < until; i++) {
          const res = await http.request({
            method: 'POST',
            path: '/v1/calls',
            headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
            body: JSON.stringify({
              tool: 'issue_refund',
              arguments: BENCH_ARGS,
              task_id: `spread-${w}-${i}`,
              workflow_step_id: 's1',
            }),
          });
          await res.body.dump();
          if (res.statusCode === 200) calls++;
          else failed++;
        }
      }),
    );
    const elapsed = (performance.now() - started) / 1000;
    const after = await scrape();
    const served = new Map([...after].map(([slot, n]) => [slot, n - (before.get(slot) ?? 0)]));
    return { callers: SPREAD_CALLERS, seconds: Number(elapsed.toFixed(1)), calls, failed, served };
  } finally {
    await http.close();
    await stopGroup(child, 30_000);
    if (child.pid !== undefined) groups.delete(child.pid);
    await dropDatabase(o.adminUrl, name);
  }
}
