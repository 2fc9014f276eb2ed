/**
 * The overview's numbers for one tenant, read from the database so any replica answers for the whole fleet
 * (several processes write the ledger; none holds the picture in memory). Each read walks an index that exists
 * and is bounded: the recent operations by `operations_tenant_created_idx` over the window only, the open states
 * by `operations_attention_idx` and the narrow `outbox` and `operation_claims` tables, the pending approvals by
 * `gate_approvals_pending_idx`; kill switches and workers are small tables. Nothing counts the whole ledger
 * (the finished states are counted only within the window).
 *
 * The same quantities as `/metrics` (server/api/routes/system.ts, read at scrape time by core/metrics.ts), for
 * one tenant: `queue` is `actionledger_outbox_depth` and `actionledger_outbox_oldest_age_seconds`, `open` is
 * `actionledger_operations{status}` for the open states, `approvals` is `actionledger_gate_approvals_pending` and
 * `_overdue`, `kill_switches` is `actionledger_gate_kill_switches_engaged` (a switch on every tenant, `*`,
 * included), `workers` is `actionledger_worker_heartbeat_age_seconds` (the fleet's, not a tenant's).
 */
import type { Queryable } from '../../db/index.js';
import { readFleetHealth } from '../../reconciler/index.js';

/** The states an operation may be in, in the order the overview draws them. */
export const OUTCOMES = [
  'pending',
  'executing',
  'succeeded',
  'unknown',
  'needs_review',
  'compensating',
  'compensated',
  'failed',
] as const;
export type Outcome = (typeof OUTCOMES)[number];

/** The states that are not at an end, or need a person (failed): counted whole, never by window. */
export const OPEN_STATES = ['pending', 'executing', 'unknown', 'needs_review', 'compensating', 'failed'] as const;

/** The window the per-minute chart and the latency cover, in minutes: 5 to 60, 15 by default. */
export const WINDOWS = [5, 15, 30, 60] as const;

export interface Overview {
  tenant: string;
  /** When this was read, by the database's clock. */
  at: string;
  window_minutes: number;
  /** Operations created in each minute of the window, by the state they are in now (oldest minute first). */
  per_minute: { minute: string; by_outcome: Record<Outcome, number> }[];
  /** The same operations, summed. */
  window_totals: Record<Outcome, number>;
  /** Dispatch attempts waiting in the outbox, and the oldest one's age in seconds (null when none waits). */
  queue: { depth: number; oldest_age_s: number | null };
  /** Operations in the open states (and failed), whatever their age. */
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

/** The per-minute statement: the tenant's operations created in the window, by minute and state. */
export function perMinuteSql(s: string): string {
  return `SELECT date_trunc('minute', created_at) AS minute, status, count(*)::int AS n
       FROM ${s}.operations
       WHERE tenant_id = $1 AND created_at >= now() - make_interval(mins => $2)
       GROUP BY 1, 2`;
}

/** The latency statement: percentiles over the window's succeeded operations. */
export function latencySql(s: string): string {
  return `SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - created_at))::float8 AS p50,
         percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - created_at))::float8 AS p99,
         count(*)::int AS n
       FROM ${s}.operations
       WHERE tenant_id = $1 AND created_at >= now() - make_interval(mins => $2) AND status = 'succeeded'`;
}

/** The queue statement: the outbox (only what waits) joined to its operations by primary key. */
export function queueSql(s: string): string {
  return `SELECT count(*)::int AS depth, extract(epoch FROM now() - min(o.created_at))::float8 AS oldest_s,
         count(DISTINCT o.operation_id) FILTER (WHERE op.status = 'pending')::int AS pending
       FROM ${s}.outbox o JOIN ${s}.operations op USING (operation_id)
       WHERE op.tenant_id = $1`;
}

/** The states that need attention, by the partial index on `attention`. */
export function attentionSql(s: string): string {
  return `SELECT attention, coalesce(review_reason, '') AS reason, count(*)::int AS n
       FROM ${s}.operations
       WHERE attention IS NOT NULL AND tenant_id = $1
       GROUP BY 1, 2`;
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
    executing: executingSql(s),
    approvals: approvalsSql(s),
  };
}

/** Reads the overview of one tenant over the last `minutes`. Throws only what PostgreSQL throws. */
export async function readOverview(
  db: Queryable,
  schema: { schema: string; schemaQuoted: string },
  tenant: string,
  minutes: number,
): Promise<Overview> {
  const s = schema.schemaQuoted;
  const [clock, perMinute, latency, queue, attention, executing, approvals, switches, fleet] = await Promise.all([
    db.query<{ at: Date }>('SELECT now() AS at'),
    db.query<{ minute: Date; status: Outcome; n: number }>(perMinuteSql(s), [tenant, minutes]),
    db.query<{ p50: number | null; p99: number | null; n: number }>(latencySql(s), [tenant, minutes]),
    db.query<{ depth: number; oldest_s: number | null; pending: number }>(queueSql(s), [tenant]),
    db.query<{ attention: string; reason: string; n: number }>(attentionSql(s), [tenant]),
    db.query<{ n: number }>(executingSql(s), [tenant]),
    db.query<{
      approval_id: string;
      tool_name: string;
      requester_id: string;
      expires_at: Date;
      expires_in_s: number;
      pending: number;
      overdue: number;
    }>(approvalsSql(s), [tenant]),
    db.query<{ tenant_id: string; tool_name: string; engaged_at: Date; engaged_by: string; reason: string }>(
      `SELECT tenant_id, tool_name, engaged_at, engaged_by, reason FROM ${s}.gate_kill_switches
       WHERE tenant_id IN ($1, '*') ORDER BY engaged_at`,
      [tenant],
    ),
    readFleetHealth(db, schema.schema, s),
  ]);
  const at = clock.rows[0]?.at ?? new Date();
  const { per_minute, totals } = byMinute(at, minutes, perMinute.rows);
  const open = zero(OPEN_STATES);
  open.pending = queue.rows[0]?.pending ?? 0;
  open.executing = executing.rows[0]?.n ?? 0;
  const review: Overview['review'] = [];
  for (const r of attention.rows) {
    if (Object.hasOwn(open, r.attention)) open[r.attention as keyof typeof open] += r.n;
    if (r.attention === 'needs_review') review.push({ reason: r.reason, count: r.n });
  }
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
    workers: fleet.workers.map((w) => ({ worker: w.worker, heartbeat_age_s: w.heartbeat_age_s })),
  };
}

/** Every minute of the window gets a point, empty or not, so the chart's time axis is even; and the sums. */
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
    if (bucket !== undefined && Object.hasOwn(bucket, r.status)) bucket[r.status] += r.n;
    if (Object.hasOwn(totals, r.status)) totals[r.status] += r.n;
  }
  return { per_minute: list.map((minute) => ({ minute, by_outcome: buckets.get(minute) ?? zero(OUTCOMES) })), totals };
}
