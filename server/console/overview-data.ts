/**
 * The overview's numbers for one tenant, read from the database so any replica answers for the whole fleet
 * (several processes write the ledger; none holds the picture in memory). Each read walks an index that exists
 * and is bounded: the recent operations by `operations_tenant_created_idx` over the window only, the open states
 * by `operations_attention_idx` and the narrow `outbox` and `operation_claims` tables, the pending approvals by
 * `gate_approvals_pending_idx`; kill switches and workers are small tables. Nothing counts the whole ledger
 * (the finished states, `failed` among them, are counted only within the window).
 *
 * One reading takes one connection of the API's pool (shared with the gate and /v1): its statements run one after
 * another in one read-only REPEATABLE READ transaction, so every number comes from the same snapshot. Readings
 * are shared ({@link overviewReader}): requests for the same tenant and window while one is read, or within
 * {@link READING_TTL_MS} after, get that reading, and a process reads one overview at a time.
 *
 * The same quantities as `/metrics` (server/api/routes/system.ts, read at scrape time by core/metrics.ts), for
 * one tenant: `queue` is `actionledger_outbox_depth` and `actionledger_outbox_oldest_age_seconds`, `open` is
 * `actionledger_operations{status}` for the open states, `approvals` is `actionledger_gate_approvals_pending` and
 * `_overdue`, `kill_switches` is `actionledger_gate_kill_switches_engaged` (a switch on every tenant, `*`,
 * included), `workers` is `actionledger_worker_heartbeat_age_seconds` (the fleet's, not a tenant's).
 */
import { OPERATION_STATUSES, type OperationStatus } from '../../core/types.js';
import type { Pool, PoolClient } from '../../db/index.js';
import { SILENT_WORKER_WINDOW_S, workersSql } from '../../reconciler/index.js';

/** The states an operation may be in, in the order the overview draws them (the ledger's own order). */
export const OUTCOMES = OPERATION_STATUSES;
export type Outcome = OperationStatus;

/**
 * The states that are not at an end: counted whole, never by window. `failed` is an end (rows in it accumulate for
 * good): it is counted in the window, with the other outcomes.
 */
export const OPEN_STATES = ['pending', 'executing', 'unknown', 'needs_review', 'compensating'] as const;

/** The window the per-minute chart and the latency cover, in minutes: 5 to 60, 15 by default. */
export const WINDOWS = [5, 15, 30, 60] as const;

export interface Overview {
  tenant: string;
  /** When this was read, by the database's clock. */
  at: string;
  window_minutes: number;
  /**
   * Operations created in each minute of the window, by the state they are in now (oldest minute first): the
   * current minute so far and the `window_minutes - 1` whole minutes before it.
   */
  per_minute: { minute: string; by_outcome: Record<Outcome, number> }[];
  /** The same operations, summed (exactly what the chart draws). */
  window_totals: Record<Outcome, number>;
  /** Dispatch attempts waiting in the outbox, and the oldest one's age in seconds (null when none waits). */
  queue: { depth: number; oldest_age_s: number | null };
  /** Operations in the open states, whatever their age. */
  open: Record<(typeof OPEN_STATES)[number], number>;
  /** Operations in review by reason, most first. */
  review: { reason: string; count: number }[];
  /** Approvals waiting for a person: how many, how many past their time, the next ones to expire. */
  approvals: {
    pending: number;
    overdue: number;
    next: { approval_id: string; tool_name: string; requester_id: string; expires_at: string; expires_in_s: number }[];
  };
  /**
   * From the reservation (its entry into the outbox) to `succeeded` recorded, for the operations of the window
   * that succeeded: the median and the 99th percentile in seconds (null without any).
   */
  latency: { p50_s: number | null; p99_s: number | null; count: number };
  kill_switches: { tenant_id: string; tool_name: string; engaged_at: string; engaged_by: string; reason: string }[];
  /** Dispatcher workers not stopped that heartbeated within the last hour, with the age of that heartbeat. */
  workers: { worker: string; heartbeat_age_s: number }[];
}

const zero = <K extends string>(keys: readonly K[]): Record<K, number> =>
  Object.fromEntries(keys.map((k) => [k, 0])) as Record<K, number>;

/**
 * Where the window starts: the whole minute `$2 - 1` minutes before the current one, so the window is exactly the
 * chart's buckets (the counts, their sums and the latency cover the same rows).
 */
const WINDOW_START = `date_trunc('minute', now()) - make_interval(mins => $2 - 1)`;

/** The per-minute statement: the tenant's operations created in the window, by minute and state. */
export function perMinuteSql(s: string): string {
  return `SELECT date_trunc('minute', created_at) AS minute, status, count(*)::int AS n
       FROM ${s}.operations
       WHERE tenant_id = $1 AND created_at >= ${WINDOW_START}
       GROUP BY 1, 2`;
}

/** The latency statement: percentiles over the window's succeeded operations. */
export function latencySql(s: string): string {
  return `SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - created_at))::float8 AS p50,
         percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - created_at))::float8 AS p99,
         count(*)::int AS n
       FROM ${s}.operations
       WHERE tenant_id = $1 AND created_at >= ${WINDOW_START} AND status = 'succeeded'`;
}

/** The queue statement: the outbox (only what waits) joined to its operations by primary key. */
export function queueSql(s: string): string {
  return `SELECT count(*)::int AS depth, extract(epoch FROM now() - min(o.created_at))::float8 AS oldest_s,
         count(DISTINCT o.operation_id) FILTER (WHERE op.status = 'pending')::int AS pending
       FROM ${s}.outbox o JOIN ${s}.operations op USING (operation_id)
       WHERE op.tenant_id = $1`;
}

/**
 * The open states the partial index on `attention` finds, but review (counted by reason, below): from the index
 * alone. `failed` is left out: it is an end, counted in the window.
 */
export function attentionSql(s: string): string {
  return `SELECT attention, count(*)::int AS n
       FROM ${s}.operations
       WHERE attention IN ('unknown', 'compensating') AND tenant_id = $1
       GROUP BY 1`;
}

/** The operations in review by reason: only those rows are read from the table (for `review_reason`). */
export function reviewSql(s: string): string {
  return `SELECT coalesce(review_reason, '') AS reason, count(*)::int AS n
       FROM ${s}.operations
       WHERE attention = 'needs_review' AND tenant_id = $1
       GROUP BY 1`;
}

export function executingSql(s: string): string {
  return `SELECT count(*)::int AS n FROM ${s}.operation_claims c JOIN ${s}.operations op USING (operation_id)
       WHERE op.tenant_id = $1 AND op.status = 'executing'`;
}

/** Pending approvals by `gate_approvals_pending_idx` (the predicate spelled as the index's, as gate/status.ts does). */
export function approvalsSql(s: string): string {
  return `SELECT approval_id::text, tool_name, requester_id, expires_at,
         extract(epoch FROM expires_at - now())::float8 AS expires_in_s,
         count(*) OVER ()::int AS pending,
         count(*) FILTER (WHERE expires_at <= now()) OVER ()::int AS overdue
       FROM ${s}.gate_approvals
       WHERE tenant_id = $1 AND status IN ('pending', 'approved') AND status = 'pending'
       ORDER BY expires_at
       LIMIT 1000`;
}

/** Every statement the overview runs, by name (for EXPLAIN in the tests). */
export function overviewStatements(s: string): Record<string, string> {
  return {
    perMinute: perMinuteSql(s),
    latency: latencySql(s),
    queue: queueSql(s),
    attention: attentionSql(s),
    review: reviewSql(s),
    executing: executingSql(s),
    approvals: approvalsSql(s),
    killSwitches: killSwitchesSql(s),
    workers: workersSql(s),
  };
}

/** The kill switches engaged on the tenant or on every tenant (`*`). */
export function killSwitchesSql(s: string): string {
  return `SELECT tenant_id, tool_name, engaged_at, engaged_by, reason FROM ${s}.gate_kill_switches
       WHERE tenant_id IN ($1, '*') ORDER BY engaged_at`;
}

/** How long a reading is handed to the requests for the same tenant and window after it was read. */
export const READING_TTL_MS = 2_000;

export interface OverviewReader {
  /** The overview of `tenant` over the last `minutes`: a reading shared with concurrent and recent requests. */
  read(tenant: string, minutes: number): Promise<Overview>;
}

/**
 * One reading per (tenant, window) at a time, kept {@link READING_TTL_MS} (the page and its JSON, polled every few
 * seconds by each open tab, share it), and one reading at a time in this process: the overview never holds more than
 * one connection of `pool`, however many tabs are open on however many tenants. A failed reading is not kept.
 */
export function overviewReader(
  pool: Pick<Pool, 'connect'>,
  schema: { schema: string; schemaQuoted: string },
  options: { ttlMs?: number; now?: () => number } = {},
): OverviewReader {
  const ttl = options.ttlMs ?? READING_TTL_MS;
  const now = options.now ?? Date.now;
  const readings = new Map<string, { promise: Promise<Overview>; until: number }>();
  let lane: Promise<unknown> = Promise.resolve();
  return {
    read(tenant, minutes) {
      const t = now();
      for (const [key, r] of readings) if (r.until <= t) readings.delete(key);
      const key = JSON.stringify([tenant, minutes]);
      const kept = readings.get(key);
      if (kept !== undefined) return kept.promise;
      const promise = lane.then(() => readOverview(pool, schema, tenant, minutes));
      lane = promise.catch(() => undefined);
      const entry = { promise, until: Number.POSITIVE_INFINITY };
      readings.set(key, entry);
      promise.then(
        () => {
          entry.until = now() + ttl;
        },
        () => {
          if (readings.get(key) === entry) readings.delete(key);
        },
      );
      return promise;
    },
  };
}

/**
 * Reads the overview of one tenant over the last `minutes` on one connection, in one read-only REPEATABLE READ
 * transaction (one snapshot: the tiles agree with each other). Throws only what PostgreSQL throws.
 */
export async function readOverview(
  pool: Pick<Pool, 'connect'>,
  schema: { schema: string; schemaQuoted: string },
  tenant: string,
  minutes: number,
): Promise<Overview> {
  const client = await pool.connect();
  let broken = false;
  try {
    await client.query('BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY');
    try {
      const o = await readInSnapshot(client, schema.schemaQuoted, tenant, minutes);
      await client.query('COMMIT');
      return o;
    } catch (e) {
      await client.query('ROLLBACK').catch(() => {
        broken = true;
      });
      throw e;
    }
  } finally {
    client.release(broken);
  }
}

async function readInSnapshot(db: PoolClient, s: string, tenant: string, minutes: number): Promise<Overview> {
  // One statement after another: one connection, never several of the pool at once.
  const clock = await db.query<{ at: Date }>('SELECT now() AS at');
  const perMinute = await db.query<{ minute: Date; status: Outcome; n: number }>(perMinuteSql(s), [tenant, minutes]);
  const latency = await db.query<{ p50: number | null; p99: number | null; n: number }>(latencySql(s), [
    tenant,
    minutes,
  ]);
  const queue = await db.query<{ depth: number; oldest_s: number | null; pending: number }>(queueSql(s), [tenant]);
  const attention = await db.query<{ attention: string; n: number }>(attentionSql(s), [tenant]);
  const inReview = await db.query<{ reason: string; n: number }>(reviewSql(s), [tenant]);
  const executing = await db.query<{ n: number }>(executingSql(s), [tenant]);
  const approvals = await db.query<{
    approval_id: string;
    tool_name: string;
    requester_id: string;
    expires_at: Date;
    expires_in_s: number;
    pending: number;
    overdue: number;
  }>(approvalsSql(s), [tenant]);
  const switches = await db.query<{
    tenant_id: string;
    tool_name: string;
    engaged_at: Date;
    engaged_by: string;
    reason: string;
  }>(killSwitchesSql(s), [tenant]);
  const workers = await db.query<{ worker_id: string; age_s: number }>(workersSql(s), [SILENT_WORKER_WINDOW_S]);
  const at = clock.rows[0]?.at ?? new Date();
  const { per_minute, totals } = byMinute(at, minutes, perMinute.rows);
  const open = zero(OPEN_STATES);
  open.pending = queue.rows[0]?.pending ?? 0;
  open.executing = executing.rows[0]?.n ?? 0;
  for (const r of attention.rows) if (Object.hasOwn(open, r.attention)) open[r.attention as keyof typeof open] += r.n;
  const review: Overview['review'] = inReview.rows.map((r) => ({ reason: r.reason, count: r.n }));
  open.needs_review = review.reduce((a, r) => a + r.count, 0);
  review.sort((a, b) => b.count - a.count || a.reason.localeCompare(b.reason));
  const l = latency.rows[0];
  const a0 = approvals.rows[0];
  return {
    tenant,
    at: at.toISOString(),
    window_minutes: minutes,
    per_minute,
    window_totals: totals,
    queue: { depth: queue.rows[0]?.depth ?? 0, oldest_age_s: queue.rows[0]?.oldest_s ?? null },
    open,
    review,
    approvals: {
      pending: a0?.pending ?? 0,
      overdue: a0?.overdue ?? 0,
      next: approvals.rows.slice(0, 10).map((r) => ({
        approval_id: r.approval_id,
        tool_name: r.tool_name,
        requester_id: r.requester_id,
        expires_at: new Date(r.expires_at).toISOString(),
        expires_in_s: Math.round(r.expires_in_s),
      })),
    },
    latency: { p50_s: l?.p50 ?? null, p99_s: l?.p99 ?? null, count: l?.n ?? 0 },
    kill_switches: switches.rows.map((k) => ({ ...k, engaged_at: new Date(k.engaged_at).toISOString() })),
    workers: workers.rows.map((w) => ({ worker: w.worker_id, heartbeat_age_s: w.age_s })),
  };
}

/**
 * Every minute of the window gets a point, empty or not, so the chart's time axis is even; and the sums. `at` is
 * the transaction's `now()`, the one the statements' window start was computed from: the same buckets.
 */
function byMinute(
  at: Date,
  minutes: number,
  rows: readonly { minute: Date; status: Outcome; n: number }[],
): { per_minute: Overview['per_minute']; totals: Record<Outcome, number> } {
  const start = Math.floor(at.getTime() / 60_000) * 60_000 - (minutes - 1) * 60_000;
  const list = Array.from({ length: minutes }, (_, i) => new Date(start + i * 60_000).toISOString());
  const buckets = new Map(list.map((m) => [m, zero(OUTCOMES)]));
  const totals = zero(OUTCOMES);
  for (const r of rows) {
    const bucket = buckets.get(new Date(r.minute).toISOString());
    if (bucket === undefined || !Object.hasOwn(bucket, r.status)) continue;
    bucket[r.status] += r.n;
    totals[r.status] += r.n;
  }
  return { per_minute: list.map((minute) => ({ minute, by_outcome: buckets.get(minute) ?? zero(OUTCOMES) })), totals };
}
