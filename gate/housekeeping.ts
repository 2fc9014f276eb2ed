/**
 * The gate's scheduled housekeeping: what lazy expiry alone never does for a subject nobody touches again.
 *
 *   approvals past their TTL (pending | approved)  -> expired, holds released, audited
 *   proposals past their TTL (proposed | confirmed) -> expired, holds released, audited
 *   rate windows that ended over a minute ago      -> deleted
 *
 * An abandoned proposal otherwise holds its share of a cap until someone touches it, which may be never.
 * `runGateHousekeeping` needs only the configuration and a pool, so the fleet's reconciliation pass (and
 * `actionledger gate expire`, and a CronJob) can run it; running it twice at once is safe (each row changes
 * once, by a conditional UPDATE).
 */
import type { Config } from '../config/index.js';
import { withTransaction, type Pool } from '../db/index.js';
import { asActionLedgerError } from '../core/errors.js';
import { Approvals } from './approvals.js';
import { GateCore, type GateDeps } from './core.js';

export interface GateHousekeepingSummary {
  approvals_expired: number;
  proposals_expired: number;
  rate_windows_pruned: number;
}

/** Expires due proposals of `core`'s database and audits each; returns how many. */
export async function expireDueProposals(core: GateCore): Promise<number> {
  return withTransaction(core.pool, async (c) => {
    const { rows } = await c.query<{ proposal_id: string; tenant_id: string; tool_name: string }>(
      core.q.proposalExpireDue,
    );
    for (const r of rows)
      await core.audit.decision(c, {
        action: 'expire',
        outcome: 'expired',
        context: { tenant_id: r.tenant_id },
        tool: r.tool_name,
        subjectId: r.proposal_id,
        detail: { subject: 'proposal' },
      });
    return rows.length;
  });
}

/**
 * One housekeeping pass over `core`'s database (see the module comment). Each step is its own transaction,
 * with its audit rows; a database failure throws its code (`audit_unavailable`, `storage_full`, ...) and the
 * steps after it wait for the next pass.
 */
export async function housekeepingWith(core: GateCore, approvals: Approvals): Promise<GateHousekeepingSummary> {
  try {
    const approvalsExpired = await approvals.expireDue();
    const proposalsExpired = await expireDueProposals(core);
    const pruned = await core.pool.query(core.q.rateWindowPrune);
    return {
      approvals_expired: approvalsExpired,
      proposals_expired: proposalsExpired,
      rate_windows_pruned: pruned.rowCount ?? 0,
    };
  } catch (err) {
    throw asActionLedgerError(err);
  }
}

/**
 * The gate's housekeeping for a schedule: expires due approvals and proposals (releasing the caps they hold)
 * and prunes ended rate windows. Needs no ledger, validators or resolvers. Throws a database failure's code.
 */
export async function runGateHousekeeping(
  config: Config,
  pool: Pool,
  observe: Pick<GateDeps, 'log' | 'metrics'> = {},
): Promise<GateHousekeepingSummary> {
  const core = new GateCore({
    config,
    pool,
    ledger: undefined as never,
    withoutValidators: true,
    withoutResolvers: true,
    ...observe,
  });
  return housekeepingWith(core, new Approvals(core));
}
