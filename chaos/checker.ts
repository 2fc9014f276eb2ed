/**
 * The invariants of a chaos run, read from the ledger, its history and the provider's own record of what it
 * received and applied. Each row must be 0.
 */
import { createHash } from 'node:crypto';
import type { Pool } from '../db/db.js';
import type { OperationStatus } from '../core/types.js';
import type { ProviderContact } from '../ledger/index.js';
import { retryIsSafe } from '../reconciler/review.js';
import { historyProblems } from '../reconciler/verify.js';
import type { ProviderEffect, ProviderRequest } from '../sandbox/provider.js';

/**
 * A gate decision the run saw allow something: a kill switch engaged or lifted (key: the tool name or `*`), a
 * role revoked or restored (key: `principal/role`).
 */
export interface GateChange {
  action: 'kill_switch' | 'role';
  outcome: 'engaged' | 'lifted' | 'revoked' | 'restored';
  tenant_id: string;
  key: string;
}

export interface Invariant {
  name: string;
  violations: number;
  examples: string[];
}

export interface CheckResult {
  invariants: Invariant[];
  violated: number;
  byStatus: Record<string, number>;
  providerRequests: number;
  providerEffects: number;
}

/** Clock allowance between the provider's timestamps (this process) and PostgreSQL's (same machine). */
const SKEW_MS = 250;

export async function checkInvariants(input: {
  pool: Pool;
  schema: string;
  reservedIds: readonly string[];
  effects: readonly ProviderEffect[];
  requests: readonly ProviderRequest[];
  /** The kill-switch and role changes the run's gate calls returned from. */
  gateChanges?: readonly GateChange[];
}): Promise<CheckResult> {
  const s = input.schema;
  const { rows: ops } = await input.pool.query<{
    operation_id: string;
    effect_key: string;
    status: OperationStatus;
    review_reason: string | null;
    provider_contact: ProviderContact;
  }>(`SELECT operation_id, effect_key, status, review_reason, provider_contact FROM ${s}.operations`);
  // The reason too: a dispatcher's release (executing -> pending) is legal only with its `released:` reason.
  const { rows: hist } = await input.pool.query<{
    operation_id: string;
    from_status: OperationStatus | null;
    to_status: OperationStatus;
    reason: string;
  }>(`SELECT operation_id, from_status, to_status, reason FROM ${s}.operation_history ORDER BY operation_id, id`);
  const { rows: evidence } = await input.pool.query<{
    operation_id: string;
    args_sha256: string;
    authorized_at: Date;
    expires_at: Date;
    recorded_at: Date;
  }>(`SELECT operation_id, args_sha256, authorized_at, expires_at, recorded_at FROM ${s}.authorization_evidence`);
  const byId = new Map(ops.map((o) => [o.operation_id, o]));
  const byKey = new Map(ops.map((o) => [o.effect_key, o]));
  const invariants: Invariant[] = [];
  const add = (name: string, examples: string[]): void =>
    void invariants.push({ name, violations: examples.length, examples: examples.slice(0, 5) });

  const effectsPerKey = new Map<string, number>();
  for (const e of input.effects) effectsPerKey.set(e.key, (effectsPerKey.get(e.key) ?? 0) + 1);
  add(
    'effect keys with more than one provider effect',
    [...effectsPerKey].filter(([, n]) => n > 1).map(([k, n]) => `${k}: ${n}`),
  );
  add(
    'operations lost',
    input.reservedIds.filter((id) => !byId.has(id)),
  );
  add(
    'operations not at an end or in review with a reason',
    ops
      .filter(
        (o) =>
          !(
            o.status === 'succeeded' ||
            o.status === 'failed' ||
            o.status === 'compensated' ||
            (o.status === 'needs_review' && o.review_reason !== null)
          ),
      )
      .map((o) => `${o.operation_id}: ${o.status}`),
  );

  // After the final reconciliation nothing may be left in flight: an executing row is a dispatch nobody
  // finished or reconciled, an unknown row a readback never settled. Review is an end only with its reason.
  add(
    'operations left executing or unknown, or in review without a reason, after the final reconciliation',
    ops
      .filter(
        (o) =>
          o.status === 'executing' ||
          o.status === 'unknown' ||
          (o.status === 'needs_review' && (o.review_reason ?? '') === ''),
      )
      .map((o) => `${o.operation_id}: ${o.status}`),
  );

  const evByOp = new Map<string, typeof evidence>();
  for (const e of evidence) (evByOp.get(e.operation_id) ?? evByOp.set(e.operation_id, []).get(e.operation_id))?.push(e);
  const unauthorized: string[] = [];
  for (const r of input.requests) {
    if (r.method !== 'POST' || r.key === undefined) continue;
    const op = byKey.get(r.key);
    const bodySha = createHash('sha256').update(r.body).digest('hex');
    const at = r.at.getTime();
    const ok =
      op !== undefined &&
      (evByOp.get(op.operation_id) ?? []).some(
        (e) =>
          e.args_sha256 === bodySha &&
          e.recorded_at.getTime() <= at + SKEW_MS &&
          e.authorized_at.getTime() <= at + SKEW_MS &&
          e.expires_at.getTime() >= at - SKEW_MS,
      );
    if (!ok) unauthorized.push(`${r.key} at ${r.at.toISOString()}`);
  }
  add('dispatches without a fresh authorization bound to the sent bytes', unauthorized);

  const histByOp = new Map<string, typeof hist>();
  for (const h of hist) (histByOp.get(h.operation_id) ?? histByOp.set(h.operation_id, []).get(h.operation_id))?.push(h);
  add(
    'illegal transitions or broken histories',
    ops.flatMap((o) =>
      historyProblems(histByOp.get(o.operation_id) ?? [], o.status).map((p) => `${o.operation_id}: ${p.detail}`),
    ),
  );

  add(
    'provider effects the ledger denies (failed, or in review as never applied)',
    [...effectsPerKey.keys()].filter((k) => {
      const o = byKey.get(k);
      return (
        o === undefined || o.status === 'failed' || (o.status === 'needs_review' && retryIsSafe(o.provider_contact))
      );
    }),
  );
  add(
    'succeeded operations without a provider effect',
    ops.filter((o) => o.status === 'succeeded' && !effectsPerKey.has(o.effect_key)).map((o) => o.operation_id),
  );

  add(
    'allowing gate decisions without their audit row',
    await unauditedDecisions(input.pool, s, input.gateChanges ?? []),
  );

  const byStatus: Record<string, number> = {};
  for (const o of ops) {
    const k =
      o.status === 'needs_review'
        ? `needs_review (${(o.review_reason ?? '').split(':').slice(0, 2).join(':')})`
        : o.status;
    byStatus[k] = (byStatus[k] ?? 0) + 1;
  }
  return {
    invariants,
    violated: invariants.reduce((n, i) => n + (i.violations > 0 ? 1 : 0), 0),
    byStatus,
    providerRequests: input.requests.filter((r) => r.method === 'POST').length,
    providerEffects: input.effects.length,
  };
}

/**
 * Allowing gate decisions that have no `gate_audit` row. The run's authorizer is the sandbox one (it keeps its
 * deny, slow and stale faults), so no built-in `authorize` decision is taken and there is none to look for;
 * the gate decisions that allow something here are the agent's accepted calls and the operator's kill-switch
 * and role changes. So: every operation the gate reserved (a `gate_operations` row) has an allowed `call`
 * row naming it, and each (action, outcome, tenant, tool or principal/role) has at least as many audit rows as
 * the run saw such calls return (a call repeated after a cut COMMIT may leave one more row, never one fewer).
 */
async function unauditedDecisions(pool: Pool, s: string, changes: readonly GateChange[]): Promise<string[]> {
  const { rows: calls } = await pool.query<{ operation_id: string }>(
    `SELECT g.operation_id FROM ${s}.gate_operations g
     WHERE NOT EXISTS (SELECT 1 FROM ${s}.gate_audit a WHERE a.action = 'call' AND a.outcome = 'allowed' AND a.subject_id = g.operation_id::text)
     ORDER BY g.operation_id`,
  );
  const out = calls.map((r) => `call allowed for ${r.operation_id}`);
  const { rows: audited } = await pool.query<{ k: string; n: number }>(
    `SELECT action || ' ' || outcome || ' ' || coalesce(tenant_id, '') || ' ' ||
            CASE WHEN action = 'role' THEN coalesce(principal_id, '') || '/' || coalesce(role, '') ELSE coalesce(tool_name, '') END AS k,
            count(*)::int AS n
     FROM ${s}.gate_audit WHERE action IN ('kill_switch', 'role') GROUP BY 1`,
  );
  const have = new Map(audited.map((r) => [r.k, r.n]));
  const want = new Map<string, number>();
  for (const c of changes) {
    const k = `${c.action} ${c.outcome} ${c.tenant_id} ${c.key}`;
    want.set(k, (want.get(k) ?? 0) + 1);
  }
  for (const [k, n] of want) if ((have.get(k) ?? 0) < n) out.push(`${k}: ${n} returned, ${have.get(k) ?? 0} audited`);
  return out;
}
