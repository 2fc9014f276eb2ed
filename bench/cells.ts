/**
 * The benchmark cells shared by bench/dispatch.ts and bench/run.ts (`npm run bench`), each on a fresh database
 * of the one bench server, dropped afterwards:
 *   - actionledger end to end: reservation to `succeeded` through a real Dispatcher over mTLS (dispatch-env.ts),
 *   - the server's 3-commit SQL-only lifecycle (insert ledger+outbox, claim with SKIP LOCKED, mark succeeded),
 *     optionally with a simulated provider request outside or under the row lock,
 *   - pg-boss 10 processing no-op jobs, polling (its fastest interval, 0.5 s) or woken in-process,
 *   - the peer a user would build instead: pg-boss 10 whose handler makes the dispatcher's two mutual-TLS calls,
 *   - the floor: reserve, then those two calls made by the caller itself, alone or with the least dispatch
 *     writes (a claim row committed before the calls, its outcome after).
 *
 * Load, the same for every system: N producers in a closed loop, each enqueuing one operation and waiting
 * until its completion commit is acknowledged before enqueuing the next, so N operations are in flight; the
 * consumer runs with concurrency N. After a warm-up, each cell runs at least `limits.ops` operations and at
 * least `limits.minMs`, and starts none after `limits.capMs`.
 */
import { execFileSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import PgBoss from 'pg-boss';
import { compileConfig } from '../config/index.js';
import { createPool, type Pool } from '../db/db.js';
import { canonicalJson, sha256Hex, type JsonValue } from '../core/json.js';
import { migrate } from '../db/migrate.js';
import { Secret } from '../core/secret.js';
import { fetchAuthorization } from '../dispatcher/authorize.js';
import { authorizationRequest } from '../protocol/authorization.js';
import { CLAIM_SESSION_OPTIONS } from '../dispatcher/claim-session.js';
import { callProvider, classify } from '../dispatcher/executor.js';
import { loadDispatchIdentity } from '../runtime/identity.js';
import type { ClaimedOperation } from '../dispatcher/types.js';
import { EffectKeyer, Ledger } from '../ledger/index.js';
import { cpuSplit, type CpuSplit } from './cpu.js';
import { workMeter, type PgWork } from './pg-work.js';
import { Completions, PoolSampler, openDispatchBench, type BenchPki } from './dispatch-env.js';
import { freshDatabase, percentiles } from './harness.js';

/**
 * Where the cells read CPU from: the PostgreSQL postmaster (bench/cpu.ts), set once by the runner, and the
 * sandbox servers' thread while an actionledger cell runs (their CPU is the provider's, not ours).
 */
export const cellContext: { postmaster: number | null; sandboxThread: number | null } = {
  postmaster: null,
  sandboxThread: null,
};

/** How long a cell runs: at least `ops` operations and `minMs`, none started after `capMs`. */
export interface CellLimits {
  ops: number;
  capMs: number;
  minMs: number;
}

export const COMPLETION_TIMEOUT_MS = 60_000;

export const ARGS = {
  order_id: 'ord-1',
  amount: 1250,
  currency: 'EUR',
  reason: 'damaged in transit',
};

/** The trusted context of the `i`th operation of closed-loop caller `w` in a cell's `tag` phase. */
export const producerContext = (tag: string, w: number, i: number) => ({
  tenant_id: 'tenant-a',
  principal_id: `producer-${w}`,
  task_id: `${tag}-${i}`,
  workflow_step_id: 's1',
  approval_id: 'a1',
  policy_version: 'v1',
});

/**
 * The cells that make the dispatcher's two mutual-TLS calls themselves (the floor, the pg-boss handler): the
 * dispatcher's environment with no dispatcher started, its identity, an agent per server, the route and its
 * credential. `call` asks for the authorization of `op` (checked as the dispatcher checks it), then POSTs it to
 * the provider, and returns the classified outcome.
 */
async function openCaller(pki: BenchPki, url: string, n: number) {
  const env = await openDispatchBench(pki, url, n, 2, false);
  cellContext.sandboxThread = env.sandbox.tid;
  const identity = await loadDispatchIdentity(env.runtime, env.env);
  const authorizer = identity.agent();
  const provider = identity.agent();
  const route = env.config.tools.get('issue_refund')!;
  const credential = identity.credentials.get('issue_refund') ?? null;
  return {
    env,
    route,
    async call(op: ClaimedOperation) {
      await fetchAuthorization(authorizer, identity.profile, authorizationRequest(op));
      return classify(await callProvider(provider, identity.profile, op, credential), route);
    },
    /** The operation as a claim would carry it. */
    claimed(
      context: ReturnType<typeof producerContext>,
      ids: { operation_id: string; effect_key: string; claim_token: string },
      args: Record<string, unknown>,
      argsSha256: string,
    ): ClaimedOperation {
      return {
        ...ids,
        principal_id: context.principal_id,
        task_id: context.task_id,
        workflow_step_id: context.workflow_step_id,
        tool_name: route.tool,
        tenant_id: context.tenant_id,
        provider_id: route.providerId,
        provider_endpoint: route.endpoint,
        idempotency_header: route.idempotencyHeader,
        canonical_args_sha256: argsSha256,
        arguments_json: args,
        current_approval_id: context.approval_id,
        current_policy_version: context.policy_version,
        attempt: 1,
        dispatch_releases: 0,
        queued_s: 0,
      };
    },
    async close() {
      cellContext.sandboxThread = null;
      await Promise.all([authorizer.close(), provider.close()]);
      await env.close();
    },
  };
}

export interface Run {
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
export async function closedLoopOps(
  concurrency: number,
  total: number,
  capMs: number,
  cycle: (worker: number, i: number) => Promise<number>,
  minMs = 0,
): Promise<Run> {
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
export function nodeLoad(): () => { elu: number; cpu: CpuSplit } {
  const elu0 = performance.eventLoopUtilization();
  const split = cpuSplit(cellContext.postmaster, cellContext.sandboxThread);
  return () => ({
    elu: performance.eventLoopUtilization(elu0).utilization,
    cpu: split(),
  });
}

/** A fresh database (dropped first if a run left it) with the actionledger schema migrated; returns its URL. */
export async function migratedDatabase(adminUrl: string, name: string): Promise<string> {
  const url = await freshDatabase(adminUrl, name);
  const setup = new pg.Client({ connectionString: url });
  await setup.connect();
  try {
    await migrate(setup, 'actionledger', '"actionledger"');
  } finally {
    await setup.end();
  }
  return url;
}

/** A Ledger on `pool` with the benchmark's one tool and a fixed effect-key secret. */
export function benchLedger(url: string, pool: Pool): Ledger {
  const config = compileConfig(
    {
      tools: {
        issue_refund: {
          provider_id: 'billing',
          endpoint: 'https://localhost:9443/v1/refunds',
          allowed_tenants: ['tenant-a'],
          idempotency: { mechanism: 'header', name: 'Idempotency-Key' },
        },
      },
    },
    { DATABASE_URL: url },
  );
  return new Ledger(
    config,
    pool,
    new EffectKeyer({ active: 'k1', secrets: new Map([['k1', new Secret(Buffer.alloc(32, 7))]]) }),
  );
}

/** Drops a cell's database, then checkpoints so the next cell does not pay for this one's dirty pages. */
export async function dropDatabase(adminUrl: string, name: string): Promise<void> {
  const c = new pg.Client({ connectionString: adminUrl });
  await c.connect();
  await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
  await c.query('CHECKPOINT').catch(() => undefined); // needs superuser or pg_checkpoint; best effort
  await c.end();
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

// ---------------------------------------------------------------------------------------------------------
// actionledger end to end

export interface AlResult extends Run {
  wakeP50Ms: number;
  wakeP99Ms: number;
  providerP50Ms: number;
  lockHeldP50Ms: number;
  lockHeldP99Ms: number;
  connAvg: number;
  connMax: number;
  poolWaitingAvg: number;
  notSucceeded: number;
  /** Statements the dispatcher sent per operation (the producer's reservation and NOTIFY not included). */
  statementsPerOp: number;
  /** What PostgreSQL wrote for the measured run, per operation (bench/pg-work.ts). */
  pgWork: PgWork;
  check: string;
}

export async function actionledgerCell(
  adminUrl: string,
  pki: BenchPki,
  n: number,
  limits: CellLimits,
  /** SQL run on the migrated database before the dispatcher starts (bench/bookkeeping.ts strips bookkeeping). */
  schemaChange?: string,
): Promise<AlResult> {
  const name = `al_bench_dispatch_al_${n}`;
  const url = await migratedDatabase(adminUrl, name);
  if (schemaChange !== undefined) {
    const c = new pg.Client({ connectionString: url });
    await c.connect();
    try {
      await c.query(schemaChange);
    } finally {
      await c.end();
    }
  }
  // LISTEN + one connection per operation in flight (evidence or the locked dispatch) + heartbeat; the claim
  // connection is outside the pool (dispatcher/claim-session.ts).
  const env = await openDispatchBench(pki, url, n, n + 4);
  cellContext.sandboxThread = env.sandbox.tid;
  try {
    let notSucceeded = 0;
    const wake: number[] = [];
    const cycle =
      (tag: string) =>
      async (w: number, i: number): Promise<number> => {
        const r = await env.ledger.reserve(producerContext(tag, w, i), 'issue_refund', ARGS);
        const committed = performance.now();
        const done = await env.probe.completions.wait(r.operation_id, COMPLETION_TIMEOUT_MS);
        if (done.status !== 'succeeded') notSucceeded++;
        const claimed = env.probe.claimedAt.get(r.operation_id);
        if (claimed !== undefined) wake.push(claimed - committed);
        env.probe.claimedAt.delete(r.operation_id);
        return done.at - committed;
      };
    await closedLoopOps(n, Math.max(20, 2 * n), limits.capMs, cycle('warm'));
    const meter = workMeter(url);
    await meter.start();
    env.probe.resetStats();
    wake.length = 0;
    notSucceeded = 0;
    const sampler = new PoolSampler(env.dispatcherPool);
    sampler.start();
    const run = await closedLoopOps(n, limits.ops, limits.capMs, cycle('run'), limits.minMs);
    const conns = sampler.stop();
    const statements = env.probe.statements;
    const pgWork = await meter.stop(run.ops);
    const lock = percentiles(env.probe.lockHeldMs);

    // Every reservation (warm-up included) must have ended succeeded, with one provider request each.
    const { rows } = await env.producerPool.query<{
      status: string;
      n: number;
    }>('SELECT status, count(*)::int AS n FROM actionledger.operations GROUP BY status ORDER BY status');
    const { rows: outbox } = await env.producerPool.query<{ n: number }>(
      'SELECT count(*)::int AS n FROM actionledger.outbox',
    );
    const stats = await env.sandbox.stats();
    const total = rows.reduce((s, r) => s + r.n, 0);
    const byStatus = rows.map((r) => `${r.status}=${r.n}`).join(' ');
    const check = `operations ${byStatus}; outbox ${outbox[0]?.n}; provider POSTs ${stats.posts} (${stats.distinctKeys} keys, ${stats.effects} effects); authorizations ${stats.authorizations}`;
    const ok =
      rows.length === 1 &&
      rows[0]?.status === 'succeeded' &&
      outbox[0]?.n === 0 &&
      stats.posts === total &&
      stats.distinctKeys === total &&
      stats.authorizations === total;
    if (!ok) process.stderr.write(`WARNING actionledger N=${n}: ${check}\n`);
    return {
      ...run,
      wakeP50Ms: percentiles(wake).p50Ms,
      wakeP99Ms: percentiles(wake).p99Ms,
      providerP50Ms: percentiles(env.probe.providerMs).p50Ms,
      lockHeldP50Ms: lock.p50Ms,
      lockHeldP99Ms: lock.p99Ms,
      connAvg: conns.avgInUse,
      connMax: conns.maxInUse,
      poolWaitingAvg: conns.avgWaiting,
      notSucceeded,
      statementsPerOp: statements / run.ops,
      pgWork,
      check,
    };
  } finally {
    cellContext.sandboxThread = null;
    await env.close();
    await dropDatabase(adminUrl, name);
  }
}

// ---------------------------------------------------------------------------------------------------------
// The floor: what end to end cannot go below on this machine, whatever the dispatcher does

/**
 * The two writes the floor leaves out and a dispatcher that promises at most one provider effect without
 * trusting the provider to deduplicate its Idempotency-Key cannot: the claim, committed before the provider
 * request (the row that fences it), and the outcome after it (where end to end ends). Each is small: a row of a
 * two-column table keyed by the operation, by prepared statements autocommitted on pools of their own, whose
 * sessions leave the planner only index plans (the claim connection's settings, `CLAIM_SESSION_OPTIONS`).
 * The outcome commits asynchronously (`synchronous_commit` off in its sessions): a crash may lose it, which
 * leaves the claim for a readback to resolve, so no promise needs it flushed. `single` writes one row per
 * statement; `batched` one statement per batch: what arrives while the previous statement of its kind is in
 * flight (and in the same tick) joins the next one.
 */
const LEAST = {
  table: 'CREATE TABLE bench_least_dispatch (operation_id uuid PRIMARY KEY, status text NOT NULL)',
  single: {
    claim: {
      name: 'bench-least-claim',
      text: `INSERT INTO bench_least_dispatch (operation_id, status) VALUES ($1, 'executing')
             ON CONFLICT DO NOTHING RETURNING operation_id`,
    },
    outcome: {
      name: 'bench-least-outcome',
      text: `UPDATE bench_least_dispatch SET status = $2 WHERE operation_id = $1 AND status = 'executing'
             RETURNING operation_id`,
    },
  },
  batched: {
    claim: {
      name: 'bench-least-claim-batch',
      text: `INSERT INTO bench_least_dispatch (operation_id, status) SELECT unnest($1::uuid[]), 'executing'
             ON CONFLICT DO NOTHING RETURNING operation_id`,
    },
    outcome: {
      name: 'bench-least-outcome-batch',
      text: `UPDATE bench_least_dispatch d SET status = u.status FROM unnest($1::uuid[], $2::text[]) AS u (id, status)
             WHERE d.operation_id = u.id AND d.status = 'executing' RETURNING d.operation_id`,
    },
  },
};

export type LeastWrites = 'single' | 'batched';

/** A floor cell's run, with its provider calls that did not succeed and what its final check found. */
export type LeastResult = Run & { notSucceeded: number; check: string; pgWork: PgWork };

/**
 * Runs `write` for each item at once (`single`), or (`batched`) for all items that arrived in the same tick or
 * while the previous write was in flight; each caller learns whether its id came back.
 */
export function leastWriter<T extends { id: string }>(
  mode: LeastWrites,
  write: (items: T[]) => Promise<string[]>,
): (item: T) => Promise<boolean> {
  if (mode === 'single') return async (item) => (await write([item])).includes(item.id);
  let queue: { item: T; done: (took: boolean) => void; failed: (err: unknown) => void }[] = [];
  let busy = false;
  const flush = (): void => {
    if (busy || queue.length === 0) return;
    const batch = queue;
    queue = [];
    busy = true;
    write(batch.map((q) => q.item))
      .then(
        (ids) => {
          const took = new Set(ids);
          for (const q of batch) q.done(took.has(q.item.id));
        },
        (err: unknown) => {
          for (const q of batch) q.failed(err);
        },
      )
      .finally(() => {
        busy = false;
        flush();
      });
  };
  return (item) =>
    new Promise<boolean>((done, failed) => {
      queue.push({ item, done, failed });
      if (queue.length === 1) queueMicrotask(flush);
    });
}

/**
 * The floor: N producers in a closed loop, each reserving an operation and then making, itself, the two
 * mutual-TLS calls a dispatch makes (the fresh authorization, checked as the dispatcher checks it, and the
 * provider call, classified), with the dispatcher's own client code and agents, against the same sandbox
 * servers: no claim, no evidence, no row lock, no outcome write. The reservation and the two requests are work
 * every dispatch needs; this cell's rate is the most any dispatcher could reach here. With `least`, each also
 * commits the two writes of {@link LEAST}: the claim after the reservation and before the calls, the outcome
 * after them.
 */
export async function floorCell(
  adminUrl: string,
  pki: BenchPki,
  n: number,
  limits: CellLimits,
  least?: LeastWrites,
): Promise<LeastResult> {
  const name = least === undefined ? `al_bench_floor_${n}` : `al_bench_least_${least}_${n}`;
  const url = await migratedDatabase(adminUrl, name);
  const caller = await openCaller(pki, url, n);
  // Batched writes keep one statement of each kind in flight: two connections per pool are enough.
  const leastPool = (synchronous: boolean): Pool =>
    new pg.Pool({
      connectionString: url,
      max: least === 'batched' ? 2 : n + 2,
      statement_timeout: 60_000,
      application_name: 'bench-least',
      options: `${CLAIM_SESSION_OPTIONS}${synchronous ? '' : ' -c synchronous_commit=off'}`,
    }).on('error', () => undefined);
  const pool = least === undefined ? null : leastPool(true);
  const outcomePool = least === undefined ? null : leastPool(false);
  const ids = (r: { rows: { operation_id: string }[] }): string[] => r.rows.map((x) => x.operation_id);
  const statements = LEAST[least ?? 'single'];
  const claim = leastWriter<{ id: string }>(least ?? 'single', async (items) =>
    ids(
      await pool!.query({
        ...statements.claim,
        values: least === 'batched' ? [items.map((x) => x.id)] : [items[0]!.id],
      }),
    ),
  );
  const record = leastWriter<{ id: string; status: string }>(least ?? 'single', async (items) =>
    ids(
      await outcomePool!.query({
        ...statements.outcome,
        values:
          least === 'batched' ? [items.map((x) => x.id), items.map((x) => x.status)] : [items[0]!.id, items[0]!.status],
      }),
    ),
  );
  const argsSha256 = sha256Hex(canonicalJson(ARGS));
  try {
    if (pool !== null) await pool.query(LEAST.table);
    let notSucceeded = 0;
    const cycle =
      (tag: string) =>
      async (w: number, i: number): Promise<number> => {
        const t0 = performance.now();
        const context = producerContext(tag, w, i);
        const r = await caller.env.ledger.reserve(context, 'issue_refund', ARGS);
        if (pool !== null && !(await claim({ id: r.operation_id })))
          throw new Error(`least claim of ${r.operation_id} took no row`);
        const ids = { operation_id: r.operation_id, effect_key: r.effect_key, claim_token: randomUUID() };
        const outcome = await caller.call(caller.claimed(context, ids, ARGS, argsSha256));
        if (outcome.status !== 'succeeded') notSucceeded++;
        if (pool !== null && !(await record({ id: r.operation_id, status: outcome.status })))
          throw new Error(`least outcome of ${r.operation_id} took no row`);
        return performance.now() - t0;
      };
    await closedLoopOps(n, Math.max(20, 2 * n), limits.capMs, cycle('warm'));
    notSucceeded = 0;
    const meter = workMeter(url);
    await meter.start();
    const run = await closedLoopOps(n, limits.ops, limits.capMs, cycle('run'), limits.minMs);
    const pgWork = await meter.stop(run.ops);
    // Every reservation (warm-up included) reached the provider once, under its own key; with `least`, each
    // has its claim row, moved to succeeded.
    const stats = await caller.env.sandbox.stats();
    const { rows } = await caller.env.producerPool.query<{ n: number }>(
      'SELECT count(*)::int AS n FROM actionledger.operations',
    );
    const total = rows[0]?.n ?? 0;
    let check = `provider POSTs ${stats.posts} (${stats.distinctKeys} keys) for ${total} reservations`;
    let ok = notSucceeded === 0 && stats.posts === total && stats.distinctKeys === total;
    if (pool !== null) {
      const states = await pool.query<{ status: string; n: number }>(
        'SELECT status, count(*)::int AS n FROM bench_least_dispatch GROUP BY status ORDER BY status',
      );
      check += `; claim rows ${states.rows.map((s) => `${s.status}=${s.n}`).join(' ')}`;
      ok &&= states.rows.length === 1 && states.rows[0]?.status === 'succeeded' && states.rows[0].n === total;
    }
    if (!ok)
      process.stderr.write(
        `WARNING ${least === undefined ? 'floor' : `least ${least}`} N=${n}: ${check}; ${notSucceeded} not succeeded\n`,
      );
    return { ...run, notSucceeded, check, pgWork };
  } finally {
    await pool?.end();
    await outcomePool?.end();
    await caller.close();
    await dropDatabase(adminUrl, name);
  }
}

// ---------------------------------------------------------------------------------------------------------
// SQL-only lifecycle: commit 1 ledger+outbox insert, commit 2 claim, commit 3 succeeded

export const SQL = {
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

export type SqlVariant = 'plain' | 'request_outside_lock' | 'request_under_lock';

export interface SqlResult extends Run {
  connAvg: number;
  emptyClaims: number;
  check: string;
}

export async function sqlCell(
  adminUrl: string,
  n: number,
  variant: SqlVariant,
  requestMs: number,
  limits: CellLimits,
): Promise<SqlResult> {
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
    await closedLoopOps(n, Math.max(20, 2 * n), limits.capMs, cycle);
    emptyClaims = 0;
    const sampler = new PoolSampler(pool);
    sampler.start();
    const run = await closedLoopOps(n, limits.ops, limits.capMs, cycle, limits.minMs);
    const conns = sampler.stop();
    const { rows } = await pool.query<{ status: string; n: number }>(
      'SELECT status, count(*)::int AS n FROM ledger GROUP BY status ORDER BY status',
    );
    const check = rows.map((r) => `${r.status}=${r.n}`).join(' ');
    if (rows.length !== 1 || rows[0]?.status !== 'succeeded')
      process.stderr.write(`WARNING sql ${variant} N=${n}: ${check}\n`);
    return { ...run, connAvg: conns.avgInUse, emptyClaims, check };
  } finally {
    await pool.end();
    await dropDatabase(adminUrl, name);
  }
}

// ---------------------------------------------------------------------------------------------------------
// pg-boss 10: no-op jobs, a single worker fetching up to N jobs, polling every 0.5 s or woken in-process

export type BossMode = 'poll' | 'notify';

export interface BossResult extends Run {
  check: string;
}

interface BenchBoss {
  boss: PgBoss;
  pool: ReturnType<typeof createPool>;
  completions: Completions;
  /** Jobs whose `complete` statement was acknowledged, all queues. */
  completed(): number;
  close(): Promise<void>;
}

/**
 * pg-boss on a fresh database (or on `existingUrl`, which the caller drops), its SQL run through a pool we watch
 * (its documented `db` option).
 */
async function openBoss(adminUrl: string, name: string, n: number, existingUrl?: string): Promise<BenchBoss> {
  const url = existingUrl ?? (await freshDatabase(adminUrl, name));
  const pool = createPool(url, {
    max: n + 4,
    statementTimeoutMs: 60_000,
    applicationName: 'bench-pgboss',
  });
  const completions = new Completions();
  let inFlight = 0;
  let completed = 0;
  // Completions are seen when their statement is acknowledged.
  const db: PgBoss.Db = {
    async executeSql(text: string, values: unknown[]) {
      inFlight++;
      try {
        const result = await pool.query(text, values);
        if (text.includes('SET completed_on = now()') && Array.isArray(values[1])) {
          const t = performance.now();
          completed += (values[1] as string[]).length;
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
  return {
    boss,
    pool,
    completions,
    completed: () => completed,
    async close() {
      await boss.stop({ graceful: true, wait: true, timeout: 5000 });
      // The worker loop may still have a fetch in flight; let it land before the pool closes.
      for (let quiet = 0; quiet < 20;) {
        await sleep(10);
        quiet = inFlight === 0 ? quiet + 1 : 0;
      }
      await pool.end();
      if (existingUrl === undefined) await dropDatabase(adminUrl, name);
    },
  };
}

async function jobStates(
  pool: ReturnType<typeof createPool>,
  queue: string,
): Promise<{ check: string; allCompleted: boolean }> {
  const { rows } = await pool.query<{ state: string; n: number }>(
    'SELECT state, count(*)::int AS n FROM pgboss.job WHERE name = $1 GROUP BY state ORDER BY state',
    [queue],
  );
  return {
    check: rows.map((r) => `${r.state}=${r.n}`).join(' '),
    allCompleted: rows.length === 1 && rows[0]?.state === 'completed',
  };
}

export async function pgBossCell(adminUrl: string, n: number, mode: BossMode, limits: CellLimits): Promise<BossResult> {
  const b = await openBoss(adminUrl, `al_bench_dispatch_boss_${n}`, n);
  const { boss, completions } = b;
  try {
    await boss.start();
    await boss.createQueue('bench');
    const workerId = await boss.work('bench', { batchSize: n, pollingIntervalSeconds: 0.5 }, () => Promise.resolve());
    const cycle = async (_w: number, i: number): Promise<number> => {
      const id = await boss.send('bench', { i });
      const committed = performance.now();
      if (id === null) throw new Error('pg-boss send returned null');
      if (mode === 'notify') boss.notifyWorker(workerId);
      const done = await completions.wait(id, COMPLETION_TIMEOUT_MS);
      return done.at - committed;
    };
    await closedLoopOps(n, mode === 'poll' ? n : Math.max(20, 2 * n), limits.capMs, cycle);
    const run = await closedLoopOps(n, limits.ops, limits.capMs, cycle, limits.minMs);
    const { check, allCompleted } = await jobStates(b.pool, 'bench');
    if (!allCompleted) process.stderr.write(`WARNING pg-boss ${mode} N=${n}: ${check}\n`);
    return { ...run, check };
  } finally {
    await b.close();
  }
}

// ---------------------------------------------------------------------------------------------------------
// The peer a user would build instead: pg-boss 10 whose handler makes the dispatcher's two mutual-TLS calls

/** The job a producer sends: who asks, for which step, with which arguments (what a reservation records). */
type RefundJob = ReturnType<typeof producerContext> & { args: Record<string, unknown> };

export interface BossMtlsResult extends Run {
  /** Jobs whose authorization was refused or whose provider call did not classify as succeeded. */
  notSucceeded: number;
  /** What PostgreSQL wrote for the measured run, per job (pg-boss's schema and the unused actionledger one). */
  pgWork: PgWork;
  check: string;
}

/**
 * N producers in a closed loop, each sending one pg-boss job and waiting until its `complete` statement is
 * acknowledged; one worker, `batchSize` N, woken in-process after each send (`notifyWorker`), as in
 * {@link pgBossCell}. The handler runs the batch's jobs concurrently, each making the two mutual-TLS calls a
 * dispatch makes, with the dispatcher's own client code and agents against the same sandbox servers (as
 * {@link floorCell} does): the authorization request, its decision checked as the dispatcher checks it, then
 * the provider POST with the job id as the Idempotency-Key, classified. Nothing else: no ledger row, claim
 * fence, evidence, row lock, final check or fenced outcome write, and none of their guarantees (nothing
 * re-checks kill switches, revocations or freshness right before the send, nothing records what the provider
 * answered, and a job that outlives its expiry is fetched again while its first call may still be out).
 */
export async function pgBossMtlsCell(
  adminUrl: string,
  pki: BenchPki,
  n: number,
  limits: CellLimits,
): Promise<BossMtlsResult> {
  const peer = await openBossMtls(adminUrl, pki, n);
  try {
    const cycle =
      (tag: string) =>
      async (w: number, i: number): Promise<number> => {
        const { id, committed } = await peer.send(producerContext(tag, w, i));
        const done = await peer.completions.wait(id, COMPLETION_TIMEOUT_MS);
        return done.at - committed;
      };
    await closedLoopOps(n, Math.max(20, 2 * n), limits.capMs, cycle('warm'));
    peer.notSucceeded = 0;
    const meter = workMeter(peer.url);
    await meter.start();
    const run = await closedLoopOps(n, limits.ops, limits.capMs, cycle('run'), limits.minMs);
    const pgWork = await meter.stop(run.ops);
    const { ok, check } = await peer.verify();
    if (!ok)
      process.stderr.write(`WARNING pg-boss mTLS handler N=${n}: ${check}; ${peer.notSucceeded} not succeeded\n`);
    return { ...run, notSucceeded: peer.notSucceeded, check, pgWork };
  } finally {
    await peer.close();
  }
}

/**
 * The peer of {@link pgBossMtlsCell}, started: `send` enqueues a job for a producer's request and wakes the
 * worker, returning when the send's commit is acknowledged; `completions` hears each `complete` acknowledged;
 * `verify` checks that every job sent completed with one authorization and one provider POST under its own key.
 * The provider request's Idempotency-Key is the job id.
 */
export async function openBossMtls(adminUrl: string, pki: BenchPki, n: number) {
  const name = `al_bench_boss_mtls_${n}`;
  // The floor's environment (its sandbox servers, profile and client identity; no dispatcher started), and
  // pg-boss's own schema in the same database.
  const url = await migratedDatabase(adminUrl, name);
  const caller = await openCaller(pki, url, n);
  const b = await openBoss(adminUrl, name, n, url);
  const { boss, completions } = b;
  let workerId = '';
  const handle = async (job: PgBoss.Job<RefundJob>): Promise<void> => {
    const { args, ...context } = job.data;
    const ids = { operation_id: job.id, effect_key: job.id, claim_token: job.id };
    const argsSha256 = sha256Hex(canonicalJson(args as JsonValue));
    const outcome = await caller.call(caller.claimed(context, ids, args, argsSha256));
    if (outcome.status !== 'succeeded') throw new Error(`provider call ${outcome.status}: ${outcome.reason}`);
  };
  const peer = {
    url,
    route: caller.route,
    authorizeUrl: caller.env.sandbox.authorizeUrl,
    completions,
    /** Jobs whose authorization was refused or whose provider call did not classify as succeeded. */
    notSucceeded: 0,
    async send(context: ReturnType<typeof producerContext>): Promise<{ id: string; committed: number }> {
      const id = await boss.send('refunds', { ...context, args: ARGS } satisfies RefundJob);
      const committed = performance.now();
      if (id === null) throw new Error('pg-boss send returned null');
      boss.notifyWorker(workerId);
      return { id, committed };
    },
    async verify(): Promise<{ ok: boolean; check: string }> {
      // Every job (warm-up included) completed, with one authorization and one provider POST (its own key) each.
      const { check: states, allCompleted } = await jobStates(b.pool, 'refunds');
      const { rows } = await b.pool.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM pgboss.job WHERE name = 'refunds'",
      );
      const total = rows[0]?.n ?? 0;
      const stats = await caller.env.sandbox.stats();
      return {
        check: `jobs ${states}; provider POSTs ${stats.posts} (${stats.distinctKeys} keys, ${stats.effects} effects); authorizations ${stats.authorizations}`,
        ok:
          allCompleted &&
          peer.notSucceeded === 0 &&
          stats.posts === total &&
          stats.distinctKeys === total &&
          stats.authorizations === total,
      };
    },
    async close(): Promise<void> {
      try {
        await b.close();
      } finally {
        try {
          await caller.close();
        } finally {
          await dropDatabase(adminUrl, name);
        }
      }
    },
  };
  try {
    await boss.start();
    await boss.createQueue('refunds');
    workerId = await boss.work<RefundJob>('refunds', { batchSize: n, pollingIntervalSeconds: 0.5 }, async (jobs) => {
      // Each job's failure is counted here rather than thrown: pg-boss would fail the whole batch.
      const settled = await Promise.allSettled(jobs.map(handle));
      peer.notSucceeded += settled.filter((s) => s.status === 'rejected').length;
    });
  } catch (err) {
    await peer.close();
    throw err;
  }
  return peer;
}

export interface BossEnqueueDrainResult {
  /** N producers calling `send` in a closed loop (latency: `send` call to its resolution). */
  enqueue: BossResult;
  /** The jobs enqueued above, then processed by one no-op worker fetching N per batch (no latency). */
  drain: BossResult;
}

/**
 * pg-boss enqueue rate, then no-op processing of the same jobs: one worker with `batchSize` N whose handler
 * wakes it again at once (`notifyWorker`), so it fetches batch after batch without its polling pause: the
 * fastest pg-boss drains a backlog with one worker. The drain's rate is jobs / (first fetch started -> last
 * `complete` acknowledged).
 */
export async function pgBossEnqueueDrainCell(
  adminUrl: string,
  n: number,
  limits: CellLimits,
): Promise<BossEnqueueDrainResult> {
  const b = await openBoss(adminUrl, `al_bench_run_boss_${n}`, n);
  const { boss } = b;
  try {
    await boss.start();
    await boss.createQueue('bench');
    await boss.createQueue('warm');
    const send =
      (queue: string) =>
      async (_w: number, i: number): Promise<number> => {
        const t0 = performance.now();
        const id = await boss.send(queue, { i });
        if (id === null) throw new Error('pg-boss send returned null');
        return performance.now() - t0;
      };
    await closedLoopOps(n, Math.max(20, 2 * n), limits.capMs, send('warm'));
    const enqueue = await closedLoopOps(n, limits.ops, limits.capMs, send('bench'), limits.minMs);

    const target = enqueue.ops;
    const load = nodeLoad();
    const start = performance.now();
    const worker: { id?: string } = {};
    worker.id = await boss.work('bench', { batchSize: n, pollingIntervalSeconds: 0.5 }, () => {
      if (worker.id !== undefined) boss.notifyWorker(worker.id);
      return Promise.resolve();
    });
    const deadline = start + COMPLETION_TIMEOUT_MS;
    while (b.completed() < target && performance.now() < deadline) await sleep(2);
    const seconds = (performance.now() - start) / 1000;
    const drained = b.completed();
    await boss.offWork('bench');
    const { check, allCompleted } = await jobStates(b.pool, 'bench');
    if (!allCompleted || drained !== target)
      process.stderr.write(`WARNING pg-boss drain N=${n}: ${check}; ${drained} of ${target} completed\n`);
    const drain: BossResult = {
      ops: drained,
      seconds,
      opsPerS: drained / seconds,
      p50Ms: NaN,
      p99Ms: NaN,
      ...load(),
      check,
    };
    return { enqueue: { ...enqueue, check: `${target} sent` }, drain };
  } finally {
    await b.close();
  }
}

// ---------------------------------------------------------------------------------------------------------
// The server's plain INSERT commit rate, and actionledger reservations, on one fresh migrated database

export interface InsertReserveResult {
  insert: Run;
  /** The reservations, with what PostgreSQL wrote for them (bench/pg-work.ts). */
  reserve: Run & { pgWork: PgWork };
}

export async function insertReserveCell(adminUrl: string, n: number, limits: CellLimits): Promise<InsertReserveResult> {
  const name = `al_bench_run_reserve_${n}`;
  const url = await freshDatabase(adminUrl, name);
  const pool = createPool(url, { max: n + 2, statementTimeoutMs: 60_000, applicationName: 'bench-reserve' });
  const client = await pool.connect();
  await migrate(client, 'actionledger', '"actionledger"');
  await client.query(
    'CREATE TABLE public.plain_insert (id bigserial PRIMARY KEY, payload text NOT NULL, at timestamptz NOT NULL DEFAULT now())',
  );
  client.release();
  const ledger = benchLedger(url, pool);
  const payload = JSON.stringify(ARGS);
  const timed =
    (fn: (w: number, i: number) => Promise<unknown>) =>
    async (w: number, i: number): Promise<number> => {
      const t0 = performance.now();
      await fn(w, i);
      return performance.now() - t0;
    };
  const insertOne = timed(() => pool.query('INSERT INTO public.plain_insert (payload) VALUES ($1)', [payload]));
  const reserveOne = (tag: string) => timed((w, i) => ledger.reserve(producerContext(tag, w, i), 'issue_refund', ARGS));
  try {
    await closedLoopOps(n, Math.max(20, 2 * n), limits.capMs, insertOne);
    const insert = await closedLoopOps(n, limits.ops, limits.capMs, insertOne, limits.minMs);
    await closedLoopOps(n, Math.max(20, 2 * n), limits.capMs, reserveOne('warm'));
    const meter = workMeter(url);
    await meter.start();
    const reserve = await closedLoopOps(n, limits.ops, limits.capMs, reserveOne('run'), limits.minMs);
    return { insert, reserve: { ...reserve, pgWork: await meter.stop(reserve.ops) } };
  } finally {
    ledger.stop();
    await pool.end();
    await dropDatabase(adminUrl, name);
  }
}

// ---------------------------------------------------------------------------------------------------------

export function gitHead(): string {
  try {
    const head = execFileSync('git', ['rev-parse', '--short', 'HEAD'], {
      encoding: 'utf8',
    }).trim();
    const status = execFileSync(
      'git',
      ['status', '--porcelain', '--untracked-files=no', '--', 'core', 'ledger', 'dispatcher', 'sandbox', 'sql'],
      { encoding: 'utf8' },
    );
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
export function median<T extends object>(runs: T[]): T {
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

export function medianOf(values: number[]): number {
  return median(values.map((v) => ({ v }))).v;
}

/** The median over rounds of a per-round ratio: cells of one round ran minutes apart at most. */
export function ratioOf(a: Run[], b: Run[]): number {
  return medianOf(a.map((r, i) => r.opsPerS / (b[i]?.opsPerS ?? NaN)));
}

/** Node + PostgreSQL CPU per operation, in ms; the sandbox provider's and authorizer's thread and other processes excluded. */
export const cpuMsPerOp = (r: Run): number =>
  ((r.cpu.nodeCores - (Number.isNaN(r.cpu.threadCores) ? 0 : r.cpu.threadCores) + r.cpu.postgresCores) * 1000) /
  r.opsPerS;

export const list = (runs: Run[]): string => runs.map((r) => r.opsPerS.toFixed(0)).join(', ');
export const round2 = (x: number): number | null => (Number.isFinite(x) ? Number(x.toFixed(2)) : null);
export const common = (r: Run): Record<string, number | null> => ({
  ops: r.ops,
  seconds: round2(r.seconds),
  main_thread_elu: round2(r.elu),
  machine_cpu_cores: round2(r.cpu.machineCores),
  node_cpu_cores: round2(r.cpu.nodeCores),
  sandbox_thread_cpu_cores: round2(r.cpu.threadCores),
  postgres_cpu_cores: round2(r.cpu.postgresCores),
  other_processes_cpu_cores: round2(r.cpu.otherCores),
});
