/**
 * The gate's state at a glance, read at scrape time for the fleet's gauges: approvals and proposals still
 * waiting for a person, cap holds not yet released, and kill switches engaged (with the oldest one's age).
 * One statement over partial indexes (pending approvals, open holds) and small tables.
 */
import type { Queryable } from '../db/index.js';

export interface GateReading {
  approvals_pending: number;
  /** Approvals waiting past their TTL, not yet marked expired by housekeeping. */
  approvals_overdue: number;
  proposals_open: number;
  cap_holds_open: number;
  kill_switches_engaged: number;
  oldest_kill_switch_age_s: number | null;
}

/** Throws only what PostgreSQL throws. */
export async function readGateStatus(db: Queryable, schemaQuoted: string): Promise<GateReading> {
  const s = schemaQuoted;
  const { rows } = await db.query<Record<keyof GateReading, string | null>>(
    `SELECT
       (SELECT count(*) FROM ${s}.gate_approvals WHERE status IN ('pending', 'approved') AND status = 'pending') AS approvals_pending,
       (SELECT count(*) FROM ${s}.gate_approvals WHERE status IN ('pending', 'approved') AND status = 'pending' AND expires_at <= now()) AS approvals_overdue,
       (SELECT count(*) FROM ${s}.gate_proposals WHERE status IN ('proposed', 'confirmed')) AS proposals_open,
       (SELECT count(*) FROM ${s}.gate_cap_holds WHERE released_at IS NULL) AS cap_holds_open,
       (SELECT count(*) FROM ${s}.gate_kill_switches) AS kill_switches_engaged,
       (SELECT extract(epoch FROM now() - min(engaged_at)) FROM ${s}.gate_kill_switches) AS oldest_kill_switch_age_s`,
  );
  const r = rows[0];
  const n = (v: string | null | undefined): number => Number(v ?? 0);
  return {
    approvals_pending: n(r?.approvals_pending),
    approvals_overdue: n(r?.approvals_overdue),
    proposals_open: n(r?.proposals_open),
    cap_holds_open: n(r?.cap_holds_open),
    kill_switches_engaged: n(r?.kill_switches_engaged),
    oldest_kill_switch_age_s:
      r?.oldest_kill_switch_age_s === null || r?.oldest_kill_switch_age_s === undefined
        ? null
        : Number(r.oldest_kill_switch_age_s),
  };
}
