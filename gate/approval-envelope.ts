/**
 * The approval envelope: built, hashed and stored when a call needs approval, and checked again against
 * today's state when an approved one is executed (see approvals.ts for the lifecycle).
 */
import { randomBytes, randomUUID } from 'node:crypto';
import type { Queryable } from '../db/index.js';
import { canonicalJson, sha256Hex, type JsonObject } from '../core/json.js';
import type { GateTool } from '../config/index.js';
import type { Value } from './checks.js';
import type { GateCore } from './core.js';
import { refuse } from './refusal.js';
import type { BoundResource, GateContext, GateResult } from './types.js';

export type ApprovalRow = {
  approval_id: string;
  tenant_id: string;
  requester_id: string;
  requester_role: string;
  account_id: string;
  conversation_id: string;
  trace_id: string;
  task_id: string;
  workflow_step_id: string;
  tool_name: string;
  arguments_json: JsonObject;
  args_sha256: string;
  resources: BoundResource[];
  plan_version: string;
  policy_version: string;
  envelope_json: JsonObject;
  envelope_sha256: string;
  status: 'pending' | 'approved' | 'executed' | 'rejected' | 'expired' | 'invalidated';
  required_approvals: number;
  approvers: string[];
  reason: string | null;
  operation_id: string | null;
  created_at: Date;
  expires_at: Date;
  expired: boolean;
};

export interface ApprovalView {
  approval_id: string;
  status: ApprovalRow['status'];
  envelope: JsonObject;
  envelope_sha256: string;
  approvers: string[];
  reason: string | null;
  operation_id: string | null;
}

/** Turns the notification triggers off for the rest of the transaction (sql/0014). */
const NOTIFICATIONS_OFF = "SELECT set_config('actionledger.notifications', 'off', true)";

export const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
export const NOT_FOUND = 'no such approval';
const DEFAULT_PLAN = '-';

/** What a call that needs approval brings to its request. */
export interface ApprovalCall {
  ctx: GateContext;
  tool: GateTool;
  args: JsonObject;
  /** The canonical arguments' sha256. */
  sha: string;
  /** The cap counters the call holds until the approval is decided. */
  counters: string[];
  value: Value | null;
}

/** Builds, stores and returns the envelope of a call that needs approval (inside the pipeline's transaction). */
export async function requestApproval(core: GateCore, c: Queryable, call: ApprovalCall): Promise<GateResult> {
  const { ctx, tool: t, args, sha, counters, value } = call;
  const resources = await core.registry.resolveResources(c, t, ctx.tenant_id, args);
  if (resources === null) throw refuse('not_found', 'not found');
  const id = randomUUID();
  const created = new Date();
  const expires = new Date(created.getTime() + t.approval.ttlS * 1000);
  const plan =
    ctx.plan_version ??
    (await c.query<{ plan_version: string }>(core.q.planCurrent, [ctx.tenant_id, ctx.principal_id, ctx.task_id]))
      .rows[0]?.plan_version ??
    DEFAULT_PLAN;
  const envelope: JsonObject = {
    approval_id: id,
    requester: { tenant_id: ctx.tenant_id, principal_id: ctx.principal_id, role: ctx.role },
    subject: { account_id: ctx.account_id, conversation_id: ctx.conversation_id },
    identity: { task_id: ctx.task_id, workflow_step_id: ctx.workflow_step_id },
    tool: t.name,
    arguments: args,
    args_sha256: sha,
    resources: resources.map((r) => ({ ...r })),
    plan_version: plan,
    policy_version: core.config.gate.policyVersion,
    effect: describeEffect(t, args),
    required_approvals: t.approval.approvers,
    created_at: created.toISOString(),
    expires_at: expires.toISOString(),
    // 128 random bits that only the full envelope carries: copies with redacted arguments (notifications)
    // leave it out, so nobody holding such a copy can confirm a guess of a redacted value against the hash.
    salt: randomBytes(16).toString('hex'),
  };
  const envelopeSha = sha256Hex(canonicalJson(envelope));
  // Without a notification destination nothing would ever deliver or remove the event the insert writes (a
  // copy of the unredacted envelope): this transaction writes none (sql/0014).
  if (core.config.notifications.destinations.size === 0) await c.query(NOTIFICATIONS_OFF);
  await c.query(core.q.approvalInsert, [
    id,
    ctx.tenant_id,
    ctx.principal_id,
    ctx.role,
    ctx.account_id,
    ctx.conversation_id,
    ctx.trace_id,
    ctx.task_id,
    ctx.workflow_step_id,
    t.name,
    canonicalJson(args),
    sha,
    JSON.stringify(resources),
    plan,
    core.config.gate.policyVersion,
    canonicalJson(envelope),
    envelopeSha,
    t.approval.approvers,
    created,
    expires,
  ]);
  await core.budgets.hold(c, counters, value, { approval: id });
  return {
    ok: false,
    error: 'approval_required',
    message: `${t.name} needs approval by another person; it is waiting as ${id}`,
    request_id: id,
    expires_at: expires.toISOString(),
  };
}

/**
 * Why an approved envelope no longer holds, checked with today's state at execute: the plan or policy version
 * moved (the plan of the requester's own task: tenant, requester, task), the requester lost the permission,
 * the caps it holds are now over today's limits, or a bound resource changed version. Null: it still holds.
 */
export async function approvalStaleness(
  core: GateCore,
  c: Queryable,
  row: ApprovalRow,
): Promise<(Record<string, unknown> & { reason: string }) | null> {
  const plan =
    (await c.query<{ plan_version: string }>(core.q.planCurrent, [row.tenant_id, row.requester_id, row.task_id]))
      .rows[0]?.plan_version ?? DEFAULT_PLAN;
  if (plan !== row.plan_version) return { reason: 'plan_changed', approved: row.plan_version, current: plan };
  if (row.policy_version !== core.config.gate.policyVersion)
    return { reason: 'policy_changed', approved: row.policy_version, current: core.config.gate.policyVersion };
  const tool = core.tool(row.tool_name);
  if (
    tool === undefined ||
    !(await core.access.permitted(c, tool, row.tenant_id, row.requester_id, row.requester_role))
  )
    return { reason: 'permission_denied' };
  const held = await c.query<{ scope: string; used_count: number; used_value: string }>(core.q.holdCountersOf, [
    row.approval_id,
  ]);
  for (const h of held.rows) {
    const cap =
      h.scope === 'principal_day'
        ? tool.limits.perPrincipalDay
        : h.scope === 'account_day'
          ? tool.limits.perAccountDay
          : tool.limits.perConversation;
    if (cap === null) continue;
    if (
      (cap.maxCount !== null && h.used_count > cap.maxCount) ||
      (cap.maxValue !== null && Number(h.used_value) > cap.maxValue)
    )
      return { reason: 'limit_exceeded', scope: h.scope };
  }
  const now = await core.registry.resolveResources(c, tool, row.tenant_id, row.arguments_json);
  const changed = row.resources
    .filter((r, i) => now?.[i]?.version !== r.version)
    .map((r, i) => ({
      type: r.type,
      id: r.id,
      approved_version: r.version,
      current_version: now?.[i]?.version ?? null,
    }));
  if (now === null || changed.length > 0) return { reason: 'stale_resource', resources: changed };
  return null;
}

/** The effect in words: the tool's template with {argument} filled in, or the tool and its canonical arguments. */
export function describeEffect(t: GateTool, args: JsonObject): string {
  if (t.effect === null) return `${t.name} ${canonicalJson(args)}`;
  return t.effect.replace(/\{([A-Za-z_][A-Za-z0-9_]*)\}/g, (_, name: string) => {
    const v = args[name];
    return v === undefined ? `{${name}}` : typeof v === 'string' ? v : canonicalJson(v);
  });
}
