/**
 * The fleet's health as the database records it, read at scrape time beside the ledger's status: when the
 * reconciliation schedule (pg-boss, reconciler/schedule.ts) last completed a pass, and the heartbeat age of
 * each worker that has not said it stopped. Every process reads the same rows, so any replica's /metrics
 * answers for the whole fleet.
 */
import { quoteSchemaName } from '../config/index.js';
import type { Queryable } from '../db/index.js';
import type { FleetReading } from '../core/metrics.js';
import { RECONCILE_QUEUE } from './schedule.js';

/**
 * A worker whose last heartbeat is older than this is left out: its claims went to the reconciler long ago
 * (the orphan threshold is seconds), and a row kept for every process that ever died would grow the
 * exposition without bound.
 */
export const SILENT_WORKER_WINDOW_S = 3600;

/** The workers not stopped that heartbeated within `$1` seconds, with that heartbeat's age. */
export function workersSql(schemaQuoted: string): string {
  return `SELECT worker_id, greatest(extract(epoch FROM now() - heartbeat_at), 0)::float8 AS age_s
       FROM ${schemaQuoted}.workers
       WHERE stopped_at IS NULL AND heartbeat_at > now() - make_interval(secs => $1)
       ORDER BY worker_id`;
}

export async function readFleetHealth(db: Queryable, schema: string, schemaQuoted: string): Promise<FleetReading> {
  const boss = quoteSchemaName(`${schema}_pgboss`);
  const [schedule, workers] = await Promise.all([
    (async () => {
      // The schedule's tables exist once a fleet has started it; a deployment that reconciles only from a
      // CronJob has none, and the gauge is then absent.
      const { rows } = await db.query<{ exists: boolean }>(`SELECT to_regclass($1) IS NOT NULL AS exists`, [
        `${boss}.archive`,
      ]);
      if (rows[0]?.exists !== true) return null;
      // pg-boss moves completed jobs from job to archive after 12 hours, then deletes them after days: the
      // newest is in one of the two. Before any job completed, the schedule's creation stands in for it.
      const r = await db.query<{ at_s: number | null }>(
        `SELECT extract(epoch FROM coalesce(
           greatest((SELECT max(completed_on) FROM ${boss}.job WHERE name = $1 AND state = 'completed'),
                    (SELECT max(completed_on) FROM ${boss}.archive WHERE name = $1 AND state = 'completed')),
           (SELECT created_on FROM ${boss}.schedule WHERE name = $1)))::float8 AS at_s`,
        [RECONCILE_QUEUE],
      );
      const at = r.rows[0]?.at_s ?? null;
      return at === null ? null : { queue: RECONCILE_QUEUE, last_completed_at_s: at };
    })(),
    db.query<{ worker_id: string; age_s: number }>(workersSql(schemaQuoted), [SILENT_WORKER_WINDOW_S]),
  ]);
  return {
    schedule,
    workers: workers.rows.map((w) => ({ worker: w.worker_id, heartbeat_age_s: w.age_s })),
  };
}
