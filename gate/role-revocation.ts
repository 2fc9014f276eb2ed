/**
 * What a role revocation changes besides the revocation row: the revoked approver's votes on approvals still
 * pending stop counting, so such an approval needs another approver. Shared by `Gate.revokeRole` and the
 * principal store, each calling it in the transaction that records the revocation.
 */
import { bindQueries, type Queryable } from '../db/index.js';
import { gateQueries } from './queries.js';

/**
 * Withdraws the pending votes the principal cast with `role` in the tenant (and those whose role was never
 * recorded), on `db` (the caller's transaction). Returns the approvals changed. Throws only what PostgreSQL
 * throws.
 */
export async function withdrawPendingVotes(
  db: Queryable,
  schemaQuoted: string,
  revoked: { tenant_id: string; principal_id: string; role: string },
): Promise<string[]> {
  const { rows } = await db.query<{ approval_id: string }>(
    bindQueries(gateQueries, schemaQuoted).pendingVotesWithdraw,
    [revoked.tenant_id, revoked.principal_id, revoked.role],
  );
  return rows.map((r) => r.approval_id);
}
