/**
 * `npm run bench:dispatch`: operations per second from reservation to `succeeded` through a real Dispatcher
 * (fresh mTLS authorization, evidence, final check under the row lock, one provider call over mTLS, fenced
 * outcome), beside, on the same PostgreSQL in the same run:
 *   - the server's 3-commit SQL-only lifecycle (insert ledger+outbox, claim with SKIP LOCKED, mark succeeded),
 *   - pg-boss 10 processing no-op jobs, polling (its fastest interval, 0.5 s) and woken in-process,
 *   - the SQL lifecycle with a simulated provider request of the measured duration, outside the transaction
 *     and inside one holding the row lock, which is what the dispatcher does: the cost of that lock.
 *
 * Load, the same for every system: N producers in a closed loop, each enqueuing one operation and waiting
 * until its completion commit is acknowledged before enqueuing the next, so N operations are in flight; the
 * consumer runs with concurrency N. After a warm-up, each cell runs at least `--ops` operations and at least
 * `--min-seconds`, and starts none after `--seconds`, on a fresh database dropped afterwards.
 *
 * Every cell but polling pg-boss runs `--rounds` times, interleaved, and the tables show medians. These
 * machines are shared: a round during which other processes used 0.3 cores or more (bench/cpu.ts) is run
 * again, up to `--rounds` extra rounds per level, and the load that remained is reported.
 *
 * Options (flag or environment): --ops / BENCH_OPS (default 600), --min-seconds / BENCH_MIN_SECONDS (default 0;
 * 2 keeps the fast SQL and pg-boss cells running long enough to be steadier), --seconds / BENCH_CELL_SECONDS
 * (default 6), --rounds / BENCH_ROUNDS (default 3), --levels / BENCH_LEVELS (default 1,8,32),
 * BENCH_QUIET_MAX_SECONDS (default 15).
 */
import { execFileSync } from 'node:child_process';
import { parseArgs } from 'node:util';
import pg from 'pg';
import PgBoss from 'pg-boss';
import { createPool } from '../core/db.js';
import { migrate } from '../core/migrate.js';
import { cpuSplit, findPostmaster, waitForQuiet, type CpuSplit } from './cpu.js';
import { Completions, PoolSampler, createBenchPki, openDispatchBench, type BenchPki } from './dispatch-env.js';
import { freshDatabase, machine, openBenchDatabase, percentiles, printTable, saveResults, type ResultEntry } from './harness.js';

const { values: flags } = parseArgs({
  options: {
    ops: { type: 'string' },
    seconds: { type: 'string' },
    'min-seconds': { type: 'string' },
    levels: { type: 'string' },
    rounds: { type: 'string' },
  },
});
const OPS = Number(flags.ops ?? process.env.BENCH_OPS ?? 600);
const CELL_MS = Number(flags.seconds ?? process.env.BENCH_CELL_SECONDS ?? 6) * 1000;
const MIN_MS = Number(flags['min-seconds'] ?? process.env.BENCH_MIN_SECONDS ?? 0) * 1000;
const ROUNDS = Number(flags.rounds ?? process.env.BENCH_ROUNDS ?? 3);
const LEVELS = (flags.levels ?? process.env.BENCH_LEVELS ?? '1,8,32').split(',').map(Number);
const COMPLETION_TIMEOUT_MS = 60_000;
/** Longest wait, before each round, for other processes on the machine to go quiet. */
const QUIET_MAX_MS = Number(process.env.BENCH_QUIET_MAX_SECONDS ?? 15) * 1000;
/**
 * A round in which other processes used this many cores during any of its cells is run again (at most
 * ROUNDS times per level; after that rounds are kept whatever the load, and the results say how loaded).
 */
const NOISY_CORES = 0.3;
let postmaster: number | null = null;
/** The sandbox servers' thread while an actionledger cell runs: their CPU is the provider's, not ours. */
let sandboxThread: number | null = null;
const ARGS = {
  order_id: 'ord-1',
  amount: 1250,
  currency: 'EUR',
  reason: 'damaged in transit',
};

interface Run {
  ops: number;
  seconds: number;
  opsPerS: number;
  p50Ms: number;
  p99Ms: number;
  /** Main-thread event-loop utilisation, and CPU of the whole Node process (all threads) in cores. */
  elu: number;
  cpu: CpuSplit;
}

/**
 * `concurrency` closed loops running `cycle` (which returns its own latency): at least `total` ops and
 * `minMs`, whichever takes longer, but no op is started after `capMs`.
 */
async function closedLoopOps(concurrency: number, total: number, capMs: number, cycle: (worker: number, i: number) => Promise<number>, minMs = 0): Promise<Run> {
  const latencies: number[] = [];
  const load = nodeLoad();
  const start = performance.now();
  const deadline = start + capMs;
  const minimum = start + minMs;
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async (_, w) => {
      for (;;) {
        const now = performance.now();
        if (now >= deadline || (next >= total && now >= minimum)) break;
        const i = next++;
        latencies.push(await cycle(w, i));
      }
    }),
  );
  const seconds = (performance.now() - start) / 1000;
  return {
    ops: latencies.length,
    seconds,
    opsPerS: latencies.length / seconds,
    ...percentiles(latencies),
    ...load(),
  };
}

/** Load during the cell: main-thread event-loop utilisation and where the machine's CPU went (bench/cpu.ts). */
function nodeLoad(): () => { elu: number; cpu: CpuSplit } {
  const elu0 = performance.eventLoopUtilization();
  const split = cpuSplit(postmaster, sandboxThread);
  return () => ({
    elu: performance.eventLoopUtilization(elu0).utilization,
    cpu: split(),
  });
}

/** Drops a cell's database, then checkpoints so the next cell does not pay for this one's dirty pages. */
async function dropDatabase(adminUrl: string, name: string): Promise<void> {
  const c = new pg.Client({ connectionString: adminUrl });
  await c.connect();
  await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
  await c.query('CHECKPOINT').catch(() => undefined); // needs superuser or pg_checkpoint; best effort
  await c.end();
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

// ---------------------------------------------------------------------------------------------------------
// actionledger end to end

interface AlResult extends Run {
  wakeP50Ms: number;
  providerP50Ms: number;
  lockHeldP50Ms: number;
  lockHeldP99Ms: number;
  connAvg: number;
  connMax: number;
  poolWaitingAvg: number;
  notSucceeded: number;
  /** Statements the dispatcher sent per operation (the producer's reservation and NOTIFY not included). */
  statementsPerOp: number;
  check: string;
}

async function actionledgerCell(adminUrl: string, pki: BenchPki, n: number): Promise<AlResult> {
  const name = `al_bench_dispatch_al_${n}`;
  const url = await freshDatabase(adminUrl, name);
  const setup = new pg.Client({ connectionString: url });
  await setup.connect();
  await migrate(setup, 'actionledger', '"actionledger"');
  await setup.end();
  // LISTEN + one connection per operation in flight (evidence or the locked dispatch) + claim + heartbeat.
  const env = await openDispatchBench(pki, url, n, n + 4);
  sandboxThread = env.sandbox.tid;
  try {
    let notSucceeded = 0;
    const wake: number[] = [];
    const cycle =
      (tag: string) =>
      async (w: number, i: number): Promise<number> => {
        const r = await env.ledger.reserve(
          {
            tenant_id: 'tenant-a',
            principal_id: `producer-${w}`,
            task_id: `${tag}-${i}`,
            workflow_step_id: 's1',
            approval_id: 'a1',
            policy_version: 'v1',
          },
          'issue_refund',
          ARGS,
        );
        const committed = performance.now();
        const done = await env.probe.completions.wait(r.operation_id, COMPLETION_TIMEOUT_MS);
        if (done.status !== 'succeeded') notSucceeded++;
        const claimed = env.probe.claimedAt.get(r.operation_id);
        if (claimed !== undefined) wake.push(claimed - committed);
        env.probe.claimedAt.delete(r.operation_id);
        return done.at - committed;
      };
    await closedLoopOps(n, Math.max(20, 2 * n), CELL_MS, cycle('warm'));
    env.probe.resetStats();
    wake.length = 0;
    notSucceeded = 0;
    const sampler = new PoolSampler(env.dispatcherPool);
    sampler.start();
    const run = await closedLoopOps(n, OPS, CELL_MS, cycle('run'), MIN_MS);
    const conns = sampler.stop();
    const lock = percentiles(env.probe.lockHeldMs);

    // Every reservation (warm-up included) must have ended succeeded, with one provider request each.
    const { rows } = await env.producerPool.query<{
      status: string;
      n: number;
    }>('SELECT status, count(*)::int AS n FROM actionledger.operations GROUP BY status ORDER BY status');
    const { rows: outbox } = await env.producerPool.query<{ n: number }>('SELECT count(*)::int AS n FROM actionledger.outbox');
    const stats = await env.sandbox.stats();
    const total = rows.reduce((s, r) => s + r.n, 0);
    const byStatus = rows.map((r) => `${r.status}=${r.n}`).join(' ');
    const check = `operations ${byStatus}; outbox ${outbox[0]?.n}; provider POSTs ${stats.posts} (${stats.distinctKeys} keys, ${stats.effects} effects); authorizations ${stats.authorizations}`;
    const ok =
      rows.length === 1 && rows[0]?.status === 'succeeded' && outbox[0]?.n === 0 && stats.posts === total && stats.distinctKeys === total && stats.authorizations === total;
    if (!ok) process.stderr.write(`WARNING actionledger N=${n}: ${check}\n`);
    return {
      ...run,
      wakeP50Ms: percentiles(wake).p50Ms,
      providerP50Ms: percentiles(env.probe.providerMs).p50Ms,
      lockHeldP50Ms: lock.p50Ms,
      lockHeldP99Ms: lock.p99Ms,
      connAvg: conns.avgInUse,
      connMax: conns.maxInUse,
      poolWaitingAvg: conns.avgWaiting,
      notSucceeded,
      statementsPerOp: env.probe.statements / run.ops,
      check,
    };
  } finally {
    sandboxThread = null;
    await env.close();
    await dropDatabase(adminUrl, name);
  }
}

// ---------------------------------------------------------------------------------------------------------
// SQL-only lifecycle: commit 1 ledger+outbox insert, commit 2 claim, commit 3 succeeded

const SQL = {
  schema: [
    `CREATE TABLE ledger (id bigserial PRIMARY KEY, status text NOT NULL, payload jsonb NOT NULL,
       created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now())`,
    `CREATE TABLE outbox (id bigint PRIMARY KEY REFERENCES ledger (id), available_at timestamptz NOT NULL DEFAULT now())`,
  ],
  insert: `WITH l AS (INSERT INTO ledger (status, payload) VALUES ('pending', $1::jsonb) RETURNING id)
           INSERT INTO outbox (id) SELECT id FROM l RETURNING id`,
  claim: `WITH picked AS (SELECT id FROM outbox ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED),
               taken AS (DELETE FROM outbox o USING picked p WHERE o.id = p.id RETURNING o.id)
          UPDATE ledger l SET status = 'executing', updated_at = now() FROM taken t
          WHERE l.id = t.id AND l.status = 'pending' RETURNING l.id`,
  lock: `SELECT id FROM ledger WHERE id = $1 AND status = 'executing' FOR UPDATE`,
  done: `UPDATE ledger SET status = 'succeeded', updated_at = now() WHERE id = $1 AND status = 'executing'`,
};

type SqlVariant = 'plain' | 'request_outside_lock' | 'request_under_lock';

interface SqlResult extends Run {
  connAvg: number;
  emptyClaims: number;
  check: string;
}

async function sqlCell(adminUrl: string, n: number, variant: SqlVariant, requestMs: number): Promise<SqlResult> {
  const name = `al_bench_dispatch_sql_${n}`;
  const url = await freshDatabase(adminUrl, name);
  const pool = createPool(url, {
    max: n + 2,
    statementTimeoutMs: 60_000,
    applicationName: 'bench-sql',
  });
  try {
    for (const ddl of SQL.schema) await pool.query(ddl);
    const payload = JSON.stringify(ARGS);
    let emptyClaims = 0;
    const cycle = async (): Promise<number> => {
      const t0 = performance.now();
      await pool.query(SQL.insert, [payload]);
      let id: string | undefined;
      while (id === undefined) {
        const { rows } = await pool.query<{ id: string }>(SQL.claim);
        id = rows[0]?.id;
        if (id === undefined) emptyClaims++;
      }
      if (variant === 'plain') {
        await pool.query(SQL.done, [id]);
      } else if (variant === 'request_outside_lock') {
        await sleep(requestMs);
        await pool.query(SQL.done, [id]);
      } else {
        const c = await pool.connect();
        try {
          await c.query('BEGIN');
          await c.query(SQL.lock, [id]);
          await sleep(requestMs);
          await c.query(SQL.done, [id]);
          await c.query('COMMIT');
        } catch (err) {
          await c.query('ROLLBACK').catch(() => undefined);
          throw err;
        } finally {
          c.release();
        }
      }
      return performance.now() - t0;
    };
    await closedLoopOps(n, Math.max(20, 2 * n), CELL_MS, cycle);
    emptyClaims = 0;
    const sampler = new PoolSampler(pool);
    sampler.start();
    const run = await closedLoopOps(n, OPS, CELL_MS, cycle, MIN_MS);
    const conns = sampler.stop();
    const { rows } = await pool.query<{ status: string; n: number }>('SELECT status, count(*)::int AS n FROM ledger GROUP BY status ORDER BY status');
    const check = rows.map((r) => `${r.status}=${r.n}`).join(' ');
    if (rows.length !== 1 || rows[0]?.status !== 'succeeded') process.stderr.write(`WARNING sql ${variant} N=${n}: ${check}\n`);
    return { ...run, connAvg: conns.avgInUse, emptyClaims, check };
  } finally {
    await pool.end();
    await dropDatabase(adminUrl, name);
  }
}

// ---------------------------------------------------------------------------------------------------------
// pg-boss 10: no-op jobs, a single worker fetching up to N jobs, polling every 0.5 s or woken in-process

type BossMode = 'poll' | 'notify';

interface BossResult extends Run {
  check: string;
}

async function pgBossCell(adminUrl: string, n: number, mode: BossMode): Promise<BossResult> {
  const name = `al_bench_dispatch_boss_${n}`;
  const url = await freshDatabase(adminUrl, name);
  const pool = createPool(url, {
    max: n + 4,
    statementTimeoutMs: 60_000,
    applicationName: 'bench-pgboss',
  });
  const completions = new Completions();
  let inFlight = 0;
  // pg-boss runs its SQL through this (its documented `db` option), so completions are seen when acknowledged.
  const db: PgBoss.Db = {
    async executeSql(text: string, values: unknown[]) {
      inFlight++;
      try {
        const result = await pool.query(text, values);
        if (text.includes('SET completed_on = now()') && Array.isArray(values[1])) {
          const t = performance.now();
          for (const id of values[1] as string[]) completions.done(id, 'completed', t);
        }
        return result;
      } finally {
        inFlight--;
      }
    },
  };
  const boss = new PgBoss({
    db,
    supervise: false,
    schedule: false,
    migrate: true,
  });
  boss.on('error', (err: Error) => process.stderr.write(`pg-boss error: ${err.message}\n`));
  try {
    await boss.start();
    await boss.createQueue('bench');
    const workerId = await boss.work('bench', { batchSize: n, pollingIntervalSeconds: 0.5 }, async () => undefined);
    const cycle = async (_w: number, i: number): Promise<number> => {
      const id = await boss.send('bench', { i });
      const committed = performance.now();
      if (id === null) throw new Error('pg-boss send returned null');
      if (mode === 'notify') boss.notifyWorker(workerId);
      const done = await completions.wait(id, COMPLETION_TIMEOUT_MS);
      return done.at - committed;
    };
    await closedLoopOps(n, mode === 'poll' ? n : Math.max(20, 2 * n), CELL_MS, cycle);
    const run = await closedLoopOps(n, OPS, CELL_MS, cycle, MIN_MS);
    const { rows } = await pool.query<{ state: string; n: number }>("SELECT state, count(*)::int AS n FROM pgboss.job WHERE name = 'bench' GROUP BY state ORDER BY state");
    const check = rows.map((r) => `${r.state}=${r.n}`).join(' ');
    if (rows.length !== 1 || rows[0]?.state !== 'completed') process.stderr.write(`WARNING pg-boss ${mode} N=${n}: ${check}\n`);
    return { ...run, check };
  } finally {
    await boss.stop({ graceful: true, wait: true, timeout: 5000 });
    // The worker loop may still have a fetch in flight; let it land before the pool closes.
    for (let quiet = 0; quiet < 20;) {
      await sleep(10);
      quiet = inFlight === 0 ? quiet + 1 : 0;
    }
    await pool.end();
    await dropDatabase(adminUrl, name);
  }
}

// ---------------------------------------------------------------------------------------------------------

function gitHead(): string {
  try {
    const head = execFileSync('git', ['rev-parse', '--short', 'HEAD'], {
      encoding: 'utf8',
    }).trim();
    const status = execFileSync('git', ['status', '--porcelain', '--untracked-files=no', '--', 'core', 'ledger', 'dispatcher', 'sandbox', 'sql'], { encoding: 'utf8' });
    const dirty = status
      .split('\n')
      .filter((l) => l.length > 3)
      .map((l) => l.slice(3));
    return dirty.length === 0 ? head : `${head} + uncommitted changes in ${dirty.join(', ')}`;
  } catch {
    return 'unknown';
  }
}

/** The median of each numeric field over the rounds (nested objects too); string fields joined. */
function median<T extends object>(runs: T[]): T {
  const first = runs[0];
  if (first === undefined) throw new Error('no runs');
  const out: Record<string, unknown> = {};
  for (const key of Object.keys(first)) {
    const values = runs.map((r) => (r as Record<string, unknown>)[key]);
    if (typeof values[0] === 'object' && values[0] !== null) {
      out[key] = median(values as object[]);
    } else if (typeof values[0] === 'number') {
      const sorted = (values as number[]).slice().sort((a, b) => a - b);
      const mid = Math.floor(sorted.length / 2);
      out[key] = sorted.length % 2 === 1 ? sorted[mid] : ((sorted[mid - 1] ?? 0) + (sorted[mid] ?? 0)) / 2;
    } else {
      out[key] = [...new Set(values.map(String))].join(' | ');
    }
  }
  return out as T;
}

function medianOf(values: number[]): number {
  return (median(values.map((v) => ({ v }))) as { v: number }).v;
}

/** The median over rounds of a per-round ratio: cells of one round ran minutes apart at most. */
function ratioOf(a: Run[], b: Run[]): number {
  return medianOf(a.map((r, i) => r.opsPerS / (b[i]?.opsPerS ?? NaN)));
}

/** Node + PostgreSQL CPU per operation, in ms; the sandbox provider's and authorizer's thread and other processes excluded. */
const cpuMsPerOp = (r: Run): number => ((r.cpu.nodeCores - (Number.isNaN(r.cpu.threadCores) ? 0 : r.cpu.threadCores) + r.cpu.postgresCores) * 1000) / r.opsPerS;

const list = (runs: Run[]): string => runs.map((r) => r.opsPerS.toFixed(0)).join(', ');
const round2 = (x: number): number | null => (Number.isFinite(x) ? Number(x.toFixed(2)) : null);
const common = (r: Run): Record<string, number | null> => ({
  ops: r.ops,
  seconds: round2(r.seconds),
  main_thread_elu: round2(r.elu),
  machine_cpu_cores: round2(r.cpu.machineCores),
  node_cpu_cores: round2(r.cpu.nodeCores),
  sandbox_thread_cpu_cores: round2(r.cpu.threadCores),
  postgres_cpu_cores: round2(r.cpu.postgresCores),
  other_processes_cpu_cores: round2(r.cpu.otherCores),
});

async function main(): Promise<void> {
  const db = await openBenchDatabase();
  // Interrupted: stop the embedded cluster too (it runs in its own process group and would outlive us).
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.once(signal, () => {
      process.stderr.write(`${signal}: stopping the benchmark database\n`);
      process.on('uncaughtException', () => undefined); // open connections die while the cluster stops
      void db.close().finally(() => process.exit(130));
    });
  }
  postmaster = await findPostmaster(db.adminUrl).catch(() => null);
  const pki = await createBenchPki();
  process.stdout.write(`# PostgreSQL ${db.version}; ${machine()}; ${ROUNDS} rounds; per cell at least ${OPS} ops and ${MIN_MS / 1000} s, none started after ${CELL_MS / 1000} s\n`);
  const entries: ResultEntry[] = [];
  const throughput: (string | number)[][] = [];
  const latency: (string | number)[][] = [];
  const locks: (string | number)[][] = [];
  const cpu: (string | number)[][] = [];
  try {
    for (const n of LEVELS) {
      const als: AlResult[] = [];
      const sqls: SqlResult[] = [];
      const outsides: SqlResult[] = [];
      const unders: SqlResult[] = [];
      const notifies: BossResult[] = [];
      let requestMs: number | undefined;
      // Rounds interleave the systems, so a noisy stretch of the shared machine hits all of them.
      let discarded = 0;
      for (let round = 1; als.length < ROUNDS; round++) {
        const quiet = await waitForQuiet(postmaster, QUIET_MAX_MS, NOISY_CORES);
        if (quiet >= NOISY_CORES) process.stdout.write(`  (other processes still used ${quiet.toFixed(2)} cores after ${QUIET_MAX_MS / 1000} s; measuring anyway)\n`);
        const al = await actionledgerCell(db.adminUrl, pki, n);
        // The simulated request lasts as long as the first round's measured provider call (whole ms).
        const reqMs = requestMs ?? Math.max(1, Math.round(al.providerP50Ms));
        const sql = await sqlCell(db.adminUrl, n, 'plain', 0);
        const outside = await sqlCell(db.adminUrl, n, 'request_outside_lock', reqMs);
        const under = await sqlCell(db.adminUrl, n, 'request_under_lock', reqMs);
        const notify = await pgBossCell(db.adminUrl, n, 'notify');
        const other = Math.max(...[al, sql, outside, under, notify].map((r) => (Number.isNaN(r.cpu.otherCores) ? 0 : r.cpu.otherCores)));
        const keep = other < NOISY_CORES || discarded >= ROUNDS;
        process.stdout.write(
          `  N=${n} round ${round}${keep ? '' : ' DISCARDED'}: actionledger ${al.opsPerS.toFixed(0)} ops/s (main-thread ELU ${al.elu.toFixed(2)}; cores: Node ${al.cpu.nodeCores.toFixed(2)}, PostgreSQL ${al.cpu.postgresCores.toFixed(2)}); ` +
            `sql ${sql.opsPerS.toFixed(0)}, +request outside/under lock ${outside.opsPerS.toFixed(0)}/${under.opsPerS.toFixed(0)}; pg-boss notify ${notify.opsPerS.toFixed(0)}; ` +
            `other processes up to ${other.toFixed(2)} cores\n    ${al.check}\n`,
        );
        if (!keep) {
          discarded++;
          continue;
        }
        requestMs = reqMs;
        als.push(al);
        sqls.push(sql);
        outsides.push(outside);
        unders.push(under);
        notifies.push(notify);
      }
      // Polling pg-boss runs once: its rate is its batch size times its polling rate.
      const poll = await pgBossCell(db.adminUrl, n, 'poll');
      process.stdout.write(`  N=${n} pg-boss poll ${poll.opsPerS.toFixed(1)} jobs/s (${poll.ops} jobs)\n`);
      const al = median(als);
      const sql = median(sqls);
      const outside = median(outsides);
      const under = median(unders);
      const notify = median(notifies);
      const reqMs = requestMs ?? 1;
      const alSql = ratioOf(als, sqls);
      const alNotify = ratioOf(als, notifies);
      const underOutside = ratioOf(unders, outsides);

      throughput.push([String(n), al.opsPerS, sql.opsPerS, alSql, poll.opsPerS, al.opsPerS / poll.opsPerS, notify.opsPerS, alNotify, al.cpu.otherCores]);
      latency.push([String(n), al.p50Ms, al.p99Ms, al.wakeP50Ms, poll.p50Ms, poll.p99Ms, notify.p50Ms, notify.p99Ms, sql.p50Ms, sql.p99Ms]);
      locks.push([String(n), al.providerP50Ms, al.lockHeldP50Ms, al.connAvg, String(reqMs), outside.opsPerS, under.opsPerS, underOutside, outside.connAvg, under.connAvg]);

      cpu.push([
        String(n),
        al.elu,
        al.cpu.nodeCores - al.cpu.threadCores,
        al.cpu.threadCores,
        al.cpu.postgresCores,
        cpuMsPerOp(al),
        cpuMsPerOp(sql),
        cpuMsPerOp(notify),
        al.statementsPerOp,
      ]);

      entries.push(
        {
          name: 'actionledger_end_to_end',
          concurrency: n,
          ops_per_s: al.opsPerS,
          p50_ms: al.p50Ms,
          p99_ms: al.p99Ms,
          ops_per_s_rounds: list(als),
          ...common(al),
          ratio_to_sql_lifecycle: alSql,
          ratio_to_pgboss_poll: al.opsPerS / poll.opsPerS,
          ratio_to_pgboss_notify: alNotify,
          commit_to_claim_p50_ms: al.wakeP50Ms,
          provider_call_p50_ms: al.providerP50Ms,
          row_lock_held_p50_ms: al.lockHeldP50Ms,
          row_lock_held_p99_ms: al.lockHeldP99Ms,
          dispatcher_connections_avg: al.connAvg,
          dispatcher_connections_max: al.connMax,
          dispatcher_pool_waiting_avg: al.poolWaitingAvg,
          not_succeeded: al.notSucceeded,
          dispatcher_statements_per_op: al.statementsPerOp,
          rounds_discarded_for_other_load: discarded,
          cpu_ms_per_op: cpuMsPerOp(al),
          check: al.check,
        },
        {
          name: 'sql_lifecycle_3_commits',
          concurrency: n,
          ops_per_s: sql.opsPerS,
          p50_ms: sql.p50Ms,
          p99_ms: sql.p99Ms,
          ops_per_s_rounds: list(sqls),
          ...common(sql),
          cpu_ms_per_op: cpuMsPerOp(sql),
          connections_avg: sql.connAvg,
          empty_claims: sql.emptyClaims,
        },
        {
          name: 'sql_lifecycle_request_outside_lock',
          concurrency: n,
          ops_per_s: outside.opsPerS,
          p50_ms: outside.p50Ms,
          p99_ms: outside.p99Ms,
          ops_per_s_rounds: list(outsides),
          ...common(outside),
          request_ms: reqMs,
          connections_avg: outside.connAvg,
        },
        {
          name: 'sql_lifecycle_request_under_lock',
          concurrency: n,
          ops_per_s: under.opsPerS,
          p50_ms: under.p50Ms,
          p99_ms: under.p99Ms,
          ops_per_s_rounds: list(unders),
          ...common(under),
          request_ms: reqMs,
          connections_avg: under.connAvg,
          ratio_to_outside_lock: underOutside,
        },
        {
          name: 'pgboss_poll_0.5s',
          concurrency: n,
          ops_per_s: poll.opsPerS,
          p50_ms: poll.p50Ms,
          p99_ms: poll.p99Ms,
          ...common(poll),
          check: poll.check,
        },
        {
          name: 'pgboss_notify_worker',
          concurrency: n,
          ops_per_s: notify.opsPerS,
          p50_ms: notify.p50Ms,
          p99_ms: notify.p99Ms,
          ops_per_s_rounds: list(notifies),
          ...common(notify),
          cpu_ms_per_op: cpuMsPerOp(notify),
          check: notify.check,
        },
      );
    }
  } finally {
    await db.close();
  }
  process.stdout.write(`\nThroughput (operations/s with N in flight; medians of ${ROUNDS} rounds, ratios: median of per-round ratios; pg-boss poll 1 round):\n`);
  const t1 = printTable(
    [
      'N',
      'actionledger ops/s',
      'SQL 3-commit ops/s',
      'AL / SQL',
      'pg-boss poll 0.5 s jobs/s',
      'AL / pg-boss poll',
      'pg-boss notifyWorker jobs/s',
      'AL / pg-boss notify',
      'other load during AL (cores)',
    ],
    throughput,
  );
  process.stdout.write('\nLatency (ms): enqueue commit acknowledged -> completion commit acknowledged:\n');
  const t2 = printTable(
    ['N', 'AL p50', 'AL p99', 'AL commit->claim p50', 'pg-boss poll p50', 'pg-boss poll p99', 'pg-boss notify p50', 'pg-boss notify p99', 'SQL cycle p50', 'SQL cycle p99'],
    latency,
  );
  process.stdout.write('\nRow lock across the provider call:\n');
  const t3 = printTable(
    [
      'N',
      'AL provider call p50 ms',
      'AL lock held p50 ms',
      'AL dispatcher conns in use (avg)',
      'simulated request ms',
      'SQL + request outside lock ops/s',
      'SQL + request under lock ops/s',
      'under / outside',
      'conns outside (avg)',
      'conns under (avg)',
    ],
    locks,
  );
  process.stdout.write('\nWhere the CPU goes (cores; ms of Node + PostgreSQL CPU per operation, sandbox servers excluded):\n');
  const t4 = printTable(
    [
      'N',
      'AL main-thread ELU',
      'AL Node cores (producers + dispatcher)',
      'sandbox servers cores',
      'AL PostgreSQL cores',
      'AL CPU ms/op',
      'SQL CPU ms/op',
      'pg-boss notify CPU ms/op',
      'AL dispatcher statements/op',
    ],
    cpu,
  );
  saveResults('dispatch', entries, {
    machine: machine(),
    postgres: db.version,
    rounds: String(ROUNDS),
    ops_per_cell: String(OPS),
    cell_seconds_min: String(MIN_MS / 1000),
    cell_seconds_cap: String(CELL_MS / 1000),
    tree: gitHead(),
    tables: [t1, t2, t3, t4].join('\n\n'),
  });
}

main().catch((err: unknown) => {
  process.stderr.write(`${(err as Error)?.stack ?? String(err)}\n`);
  process.exit(1);
});
