/**
 * `npm run bench -- --only rss`: the resident set size of one `actionledger dispatcher` process (its own Node
 * process, as a fleet's worker is) idle, and then holding `inFlight` operations in flight. The sandbox provider
 * and authorizer run in this process over mutual TLS; the provider applies every request and answers none
 * (the profile's provider timeout, 120 s, outlasts the cell), so once every request has reached it the worker
 * holds all of them at once. RSS is read from /proc/<pid>/status (VmRSS) several times in each state; the
 * figures are the medians of those readings (and the largest in flight), the idle one the baseline of the same
 * process in the same run. Stopping the provider resets the held requests, which end `unknown`.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { compileConfig } from '../config/index.js';
import { createPool } from '../db/db.js';
import { startDispatchKit } from '../sandbox/kit.js';
import { loadOperations } from './claim-scaling.js';
import { dropDatabase, gitHead, medianOf, migratedDatabase, sleep } from './cells.js';
import { machine, openBenchDatabase, printTable, saveResults, stopOnSignal } from './harness.js';

const BIN = join(import.meta.dirname, '..', 'bin', 'actionledger.js');
const TOKEN = 'bench-provider-token';
const SECRET = 'bench-effect-key-secret-0123456789abcdef0123456789';

/** VmRSS of a /proc/<pid>/status text, in bytes; null when the line is missing (a kernel thread, a zombie). */
export function parseVmRss(status: string): number | null {
  const m = /^VmRSS:\s+(\d+)\s+kB\s*$/m.exec(status);
  return m === null ? null : Number(m[1]) * 1024;
}

/** The resident set size of process `pid` in bytes (Linux); throws when the process is gone or has none. */
export function readRss(pid: number): number {
  const rss = parseVmRss(readFileSync(`/proc/${pid}/status`, 'utf8'));
  if (rss === null) throw new Error(`no VmRSS for process ${pid}`);
  return rss;
}

export interface RssOptions {
  inFlight: number;
  /** Readings in each state, 100 ms apart. */
  samples: number;
  /** How long the idle process is left alone before its readings (its start-up allocations settle). */
  settleMs: number;
  rounds: number;
  save: boolean;
}

interface RssRound {
  idle: number;
  inFlight: number;
  inFlightMax: number;
  held: number;
}

const MB = 2 ** 20;

async function readings(pid: number, samples: number): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < samples; i++) {
    if (i > 0) await sleep(100);
    out.push(readRss(pid));
  }
  return out;
}

/** One process: start it, read it idle, give it `o.inFlight` operations the provider holds, read it again. */
async function rssRound(adminUrl: string, o: RssOptions): Promise<RssRound> {
  const dir = mkdtempSync(join(tmpdir(), 'al-bench-rss-'));
  const kit = await startDispatchKit({
    dir,
    token: TOKEN,
    profile: {
      profile_id: 'bench-rss',
      maximum_authorization_age_seconds: 600,
      authorization_http_timeout_seconds: 60,
      provider_http_timeout_seconds: 120,
    },
  });
  kit.provider.inject({ kind: 'timeout', commit: true }, { times: Infinity });
  const name = 'al_bench_rss';
  const url = await migratedDatabase(adminUrl, name);
  const raw = {
    dispatcher: { poll_interval_ms: 100, heartbeat_interval_ms: 1000, ...kit.dispatcherConfig },
    tools: {
      issue_refund: {
        provider_id: 'billing-bench',
        endpoint: kit.provider.endpoint,
        allowed_tenants: ['tenant-a'],
        credential_env: 'BENCH_BILLING_TOKEN',
        idempotency: { mechanism: 'header', name: 'Idempotency-Key' },
        definitive_failure_statuses: [400, 422],
      },
    },
  };
  const configPath = join(dir, 'config.json');
  writeFileSync(configPath, JSON.stringify(raw));
  const env = {
    PATH: process.env.PATH,
    DATABASE_URL: url,
    ACTIONLEDGER_CONFIG: configPath,
    ACTIONLEDGER_EFFECT_KEY_SECRET: SECRET,
    BENCH_BILLING_TOKEN: TOKEN,
    LOG_LEVEL: 'warn',
  };
  const config = compileConfig(raw, env);
  const pool = createPool(url, { max: 2, statementTimeoutMs: 60_000, applicationName: 'bench-rss' });
  let child: ChildProcess | undefined;
  try {
    child = spawn(process.execPath, [BIN, 'dispatcher', '--concurrency', String(o.inFlight)], {
      env,
      stdio: ['ignore', 'ignore', 'inherit'],
    });
    const pid = child.pid;
    if (pid === undefined) throw new Error('rss bench: the dispatcher process did not start');
    const exited = new Promise<never>((_, reject) =>
      child?.once('exit', (code, signal) =>
        reject(new Error(`rss bench: the dispatcher exited early (${code ?? signal})`)),
      ),
    );
    exited.catch(() => undefined);
    // Ready: it holds connections to the cell's database (LISTEN, the claim loop).
    const ready = async (): Promise<void> => {
      const deadline = performance.now() + 60_000;
      for (;;) {
        const { rows } = await pool.query<{ n: number }>(
          "SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND application_name <> 'bench-rss'",
        );
        if ((rows[0]?.n ?? 0) > 0) return;
        if (performance.now() > deadline) throw new Error('rss bench: the dispatcher never connected');
        await sleep(50);
      }
    };
    await Promise.race([ready(), exited]);
    await Promise.race([sleep(o.settleMs), exited]);
    const idle = medianOf(await readings(pid, o.samples));

    await loadOperations(pool, o.inFlight, 'pending', 'tenant-a', config.tools.get('issue_refund'));
    const held = async (): Promise<void> => {
      const deadline = performance.now() + 60_000;
      while (kit.provider.requests().filter((r) => r.method === 'POST').length < o.inFlight) {
        if (performance.now() > deadline) throw new Error('rss bench: the requests never all reached the provider');
        await sleep(20);
      }
    };
    await Promise.race([held(), exited]);
    const inFlight = await readings(pid, o.samples);
    const { rows } = await pool.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM actionledger.operations WHERE status = 'executing'",
    );
    const stillHeld = rows[0]?.n ?? 0;
    if (stillHeld !== o.inFlight)
      process.stderr.write(`WARNING rss: ${stillHeld} of ${o.inFlight} operations executing after the readings\n`);
    return { idle, inFlight: medianOf(inFlight), inFlightMax: Math.max(...inFlight), held: stillHeld };
  } finally {
    // The held requests reset: they end unknown, and the process can stop.
    await kit.stop();
    if (child !== undefined && child.exitCode === null && child.signalCode === null) {
      const c = child;
      await new Promise<void>((resolve) => {
        c.once('exit', () => resolve());
        c.kill('SIGTERM');
      });
    }
    await pool.end();
    await dropDatabase(adminUrl, name);
    rmSync(dir, { recursive: true, force: true });
  }
}

/** The rss part: `o.rounds` processes one after the other; prints its table, saves `runs.rss`. */
export async function runRssBench(o: RssOptions): Promise<void> {
  const db = await openBenchDatabase();
  stopOnSignal(db);
  const rounds: RssRound[] = [];
  process.stdout.write(
    `\nWorker RSS: one \`actionledger dispatcher --concurrency ${o.inFlight}\` process idle, then with ${o.inFlight} operations held by a provider that does not answer (PostgreSQL ${db.version}; ${o.rounds} round(s)):\n`,
  );
  try {
    for (let round = 1; round <= o.rounds; round++) {
      const r = await rssRound(db.adminUrl, o);
      rounds.push(r);
      process.stdout.write(
        `  round ${round}: idle ${(r.idle / MB).toFixed(1)} MB; ${r.held} in flight ${(r.inFlight / MB).toFixed(1)} MB (largest reading ${(r.inFlightMax / MB).toFixed(1)} MB)\n`,
      );
    }
  } finally {
    await db.close();
  }
  const idle = medianOf(rounds.map((r) => r.idle));
  const inFlight = medianOf(rounds.map((r) => r.inFlight));
  const inFlightMax = Math.max(...rounds.map((r) => r.inFlightMax));
  const ratio = medianOf(rounds.map((r) => r.inFlight / r.idle));
  process.stdout.write('\nWorker RSS (VmRSS, MB; medians over readings and rounds):\n');
  const table = printTable(
    ['worker process', 'operations in flight', 'RSS MB', 'largest reading MB', '/ idle'],
    [
      ['actionledger dispatcher, idle', '0', idle / MB, NaN, 1],
      [
        'actionledger dispatcher, provider holding the requests',
        `${Math.min(...rounds.map((r) => r.held))}`,
        inFlight / MB,
        inFlightMax / MB,
        ratio,
      ],
    ],
  );
  if (!o.save) return;
  const mb = (x: number): number => Number((x / MB).toFixed(1));
  saveResults(
    'rss',
    [
      {
        name: 'worker_rss_idle',
        concurrency: o.inFlight,
        ops_per_s: NaN,
        p50_ms: null,
        p99_ms: null,
        rss_mb: mb(idle),
        rss_mb_rounds: rounds.map((r) => mb(r.idle).toFixed(1)).join(', '),
      },
      {
        name: 'worker_rss_in_flight',
        concurrency: o.inFlight,
        ops_per_s: NaN,
        p50_ms: null,
        p99_ms: null,
        in_flight: Math.min(...rounds.map((r) => r.held)),
        rss_mb: mb(inFlight),
        rss_mb_max: mb(inFlightMax),
        rss_mb_rounds: rounds.map((r) => mb(r.inFlight).toFixed(1)).join(', '),
        ratio_to_idle: Number(ratio.toFixed(2)),
      },
    ],
    { machine: machine(), postgres: db.version, rounds: String(o.rounds), tree: gitHead(), tables: table },
  );
}
