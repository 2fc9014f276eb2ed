/**
 * `npm run bench -- --only fleet`: does throughput grow with dispatcher processes against one PostgreSQL?
 * For 1, 2 and 4 `actionledger dispatcher` child processes (each its own Node process, pool and claims, as a
 * fleet's workers are), a backlog of Q operations is bulk-loaded on a fresh database and drained over mutual
 * TLS to the sandbox provider and authorizer (in this process); the rate is outcomes per second from the 10%
 * mark to the last outcome, counted in the database. Levels interleave within each round; the ratios are to one
 * process in the same round, medians over rounds. Beside each: the cores PostgreSQL's processes used and the
 * cores the whole machine used during the drain, which say where the run saturates.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { compileConfig } from '../core/config.js';
import { createPool } from '../core/db.js';
import { startDispatchKit } from '../sandbox/kit.js';
import { loadOperations } from './claim-scaling.js';
import { dropDatabase, medianOf, migratedDatabase, sleep } from './cells.js';
import { cpuSplit, findPostmaster, waitForQuiet } from './cpu.js';
import { machine, printTable, saveResults } from './harness.js';

const BIN = join(import.meta.dirname, '..', 'bin', 'actionledger.js');
const TOKEN = 'bench-provider-token';
const SECRET = 'bench-effect-key-secret-0123456789abcdef0123456789';

export interface FleetOptions {
  adminUrl: string;
  postgres: string;
  processes: number[];
  queued: number;
  concurrency: number;
  rounds: number;
  quietMaxSeconds: number;
  save: boolean;
}

interface Cell {
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
  const cells: Cell[][] = [];
  try {
    for (let round = 0; round < o.rounds; round++) {
      const row: Cell[] = [];
      for (const n of o.processes) {
        const otherCoresBefore = await waitForQuiet(postmaster, o.quietMaxSeconds * 1000);
        row.push({ ...(await drain(o, dir, kit, n, postmaster)), otherCoresBefore });
        process.stdout.write(
          `fleet round ${round + 1}: ${n} processes ${row.at(-1)?.opsPerS.toFixed(0)} operations/s\n`,
        );
      }
      cells.push(row);
    }
  } finally {
    await kit.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  const rows = o.processes.map((n, i) => {
    const at = cells.map((r) => r[i] as Cell);
    return {
      processes: n,
      opsPerS: medianOf(at.map((c) => c.opsPerS)),
      ratio: medianOf(cells.map((r) => (r[i] as Cell).opsPerS / (r[0] as Cell).opsPerS)),
      postgresCores: medianOf(at.map((c) => c.postgresCores)),
      machineCores: medianOf(at.map((c) => c.machineCores)),
      otherCoresBefore: Math.max(...at.map((c) => c.otherCoresBefore)),
    };
  });
  process.stdout.write(
    `\nfleet: ${o.queued} queued operations drained by N dispatcher processes (concurrency ${o.concurrency} each), ` +
      `PostgreSQL ${o.postgres}, ${machine()}, medians of ${o.rounds} rounds\n`,
  );
  printTable(
    [
      'dispatcher processes',
      'operations/s',
      'ratio to 1',
      'PostgreSQL cores',
      'machine cores busy',
      'other load before',
    ],
    rows.map((r) => [
      String(r.processes),
      r.opsPerS.toFixed(0),
      r.ratio.toFixed(2),
      r.postgresCores.toFixed(2),
      r.machineCores.toFixed(2),
      r.otherCoresBefore.toFixed(2),
    ]),
  );
  if (o.save)
    saveResults(
      'fleet',
      rows.map((r) => ({
        name: `processes=${r.processes}`,
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

/** One drain: a fresh database with `o.queued` pending operations, `n` dispatcher processes, until all are done. */
async function drain(
  o: FleetOptions,
  dir: string,
  kit: Awaited<ReturnType<typeof startDispatchKit>>,
  n: number,
  postmaster: number | null,
): Promise<Omit<Cell, 'otherCoresBefore'>> {
  const name = `al_bench_fleet_${n}`;
  const url = await migratedDatabase(o.adminUrl, name);
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
        readback: { url: `${kit.provider.endpoint}/by-key/{effect_key}` },
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
  const pool = createPool(url, { max: 2, statementTimeoutMs: 60_000, applicationName: 'bench-fleet' });
  const children: ChildProcess[] = [];
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
    for (let i = 0; i < n; i++)
      children.push(
        spawn(process.execPath, [BIN, 'dispatcher', '--concurrency', String(o.concurrency)], {
          env,
          stdio: ['ignore', 'ignore', 'inherit'],
        }),
      );
    const mark = Math.ceil(o.queued / 10);
    const deadline = performance.now() + 120_000 + o.queued * 20;
    let markAt: number | undefined;
    let markCount = 0;
    let split: (() => ReturnType<ReturnType<typeof cpuSplit>>) | undefined;
    let finished = 0;
    let lastAt = performance.now();
    while (finished < o.queued && performance.now() < deadline) {
      await sleep(25);
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
      processes: n,
      opsPerS: (finished - markCount) / ((lastAt - (markAt ?? lastAt)) / 1000),
      postgresCores: cpu?.postgresCores ?? NaN,
      machineCores: cpu?.machineCores ?? NaN,
    };
  } finally {
    await Promise.all(
      children.map(
        (c) =>
          new Promise<void>((resolve) => {
            if (c.exitCode !== null || c.signalCode !== null) return resolve();
            c.once('exit', () => resolve());
            c.kill('SIGTERM');
          }),
      ),
    );
    await pool.end();
    await dropDatabase(o.adminUrl, name);
  }
}
