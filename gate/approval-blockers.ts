/**
 * Why a person cannot approve an approval now, read without writing: one list every surface shows (the console
 * before it offers Approve, the API's GET of one approval, the Slack click's answer), so none of them works it
 * out again. Each blocker is the code approving would be refused with, a message a person reads, and the
 * details behind it:
 *
 * - the approval itself, at most one: final (`invalid_state_transition` with its status), past its TTL
 *   (`approval_expired`), its tool held by a kill switch (`tool_disabled`), bound to resources this process
 *   cannot resolve (`config_invalid`), stale against today's state (`reapproval_required`, the same checks
 *   execute runs), or approved already and waiting to be executed (`invalid_state_transition`);
 * - the person: the requester (`self_approval_forbidden`, `details.reason` `requester`) or someone whose vote is
 *   already counted (`already_approved`); holding no approver role of the tool that is not revoked
 *   (`permission_denied`);
 * - the stored envelope not hashing to its recorded sha256 (`approval_hash_mismatch`): nobody could be shown it.
 *
 * Hidden characters in the envelope are not a blocker: they are a requirement (approving takes an explicit
 * acknowledgement, `ApproveOptions.acknowledgeHiddenCharacters`), and each surface asks for it on its own.
 * An empty list means the person may approve now; the gate still decides under its lock when they do.
 */
import type { ErrorCode } from '../core/errors.js';
import { canonicalJson, sha256Hex } from '../core/json.js';
import type { Queryable } from '../db/index.js';
import { approvalStaleness, type ApprovalRow } from './approval-envelope.js';
import type { GateCore } from './core.js';

export interface ApprovalBlocker {
  code: ErrorCode;
  message: string;
  details: Record<string, unknown>;
}

/** Who would approve: their principal in the tenant and the roles they hold there. */
export interface ApprovalCaller {
  tenant_id: string;
  principal_id: string;
  roles: readonly string[];
}

/** The blockers of the approval `row` (read in the caller's tenant) for `caller`, in the order above. */
export async function approvalBlockers(
  core: GateCore,
  c: Queryable,
  row: ApprovalRow,
  caller: ApprovalCaller,
): Promise<ApprovalBlocker[]> {
  const blockers: ApprovalBlocker[] = [];
  const state = await stateBlocker(core, c, row);
  if (state !== null) blockers.push(state);
  if (row.requester_id === caller.principal_id)
    blockers.push({
      code: 'self_approval_forbidden',
      message: `you asked for this yourself (as ${row.requester_id}): another approver must decide it`,
      details: { reason: 'requester', requester_id: row.requester_id },
    });
  else if (row.approvers.includes(caller.principal_id))
    blockers.push({
      code: 'self_approval_forbidden',
      message: 'you approved this already; nobody counts twice: it waits for another approver',
      details: { reason: 'already_approved' },
    });
  const role = await roleBlocker(core, c, row, caller);
  if (role !== null) blockers.push(role);
  const computed = sha256Hex(canonicalJson(row.envelope_json));
  if (computed !== row.envelope_sha256)
    blockers.push({
      code: 'approval_hash_mismatch',
      message: 'the stored envelope does not hash to its recorded sha256; it cannot be approved',
      details: { recorded: row.envelope_sha256, computed },
    });
  return blockers;
}

/** Whether the approval itself could still be approved and executed now (null: it could). */
async function stateBlocker(core: GateCore, c: Queryable, row: ApprovalRow): Promise<ApprovalBlocker | null> {
  if (row.status !== 'pending' && row.status !== 'approved')
    return {
      code: 'invalid_state_transition',
      message: `this approval is ${row.status}`,
      details: { status: row.status, reason: row.reason },
    };
  if (row.expired)
    return {
      code: 'approval_expired',
      message: 'this approval is past its time to live',
      details: { expires_at: row.expires_at.toISOString() },
    };
  const killed = await core.access.killSwitch(c, row.tenant_id, row.tool_name);
  if (killed !== null)
    return {
      code: 'tool_disabled',
      message: `a kill switch holds ${row.tool_name} (${killed.reason})`,
      details: { reason: killed.reason },
    };
  const unresolved = (core.tool(row.tool_name)?.resources ?? [])
    .filter((r) => core.registry.resolver(r.type) === undefined)
    .map((r) => r.type);
  if (unresolved.length > 0)
    return {
      code: 'config_invalid',
      message: `${row.tool_name} binds resources (${unresolved.join(', ')}) this process cannot resolve: approve it through the service that registers them`,
      details: { resources: unresolved },
    };
  const stale = await approvalStaleness(core, c, row);
  if (stale !== null)
    return {
      code: 'reapproval_required',
      message: `what this approval binds no longer holds (${stale.reason}); the requester must ask again`,
      details: stale,
    };
  if (row.status === 'approved')
    return {
      code: 'invalid_state_transition',
      message: 'this approval is approved already; it waits to be executed',
      details: { status: row.status, reason: row.reason },
    };
  return null;
}

/** The caller holds none of the tool's approver roles, or only revoked ones. */
async function roleBlocker(
  core: GateCore,
  c: Queryable,
  row: ApprovalRow,
  caller: ApprovalCaller,
): Promise<ApprovalBlocker | null> {
  const approverRoles = [...(core.tool(row.tool_name)?.approverRoles ?? [])];
  for (const role of caller.roles)
    if (approverRoles.includes(role) && !(await core.access.roleRevoked(c, row.tenant_id, caller.principal_id, role)))
      return null;
  return {
    code: 'permission_denied',
    message: `your roles in ${row.tenant_id} (${caller.roles.join(', ')}) may not decide ${row.tool_name}; it needs one of: ${approverRoles.join(', ') || 'nobody (no approver role is configured)'}`,
    details: { roles: [...caller.roles], approver_roles: approverRoles },
  };
}
