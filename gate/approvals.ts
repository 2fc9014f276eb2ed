/**
 * Approval by another person. The request is frozen into a canonical envelope (requester, subject, tool,
 * canonical arguments, resources with their versions, plan and policy version, the effect in words, created /
 * expires) whose sha256 the approver must send back with the approval id (approval-envelope.ts builds it, and
 * checks it again with today's state at execute):
 *
 *   pending --approve(id, displayed hash) x N distinct non-requesters--> approved --execute--> executed
 *   pending | approved --reject(reason)--> rejected
 *   pending | approved --(TTL passed, noticed on the next touch or by expireDue)--> expired
 *   pending | approved --(plan changed; or on execute: stale resource, permission, limits, policy)--> invalidated
 *   (executed, rejected, expired and invalidated are final: a trigger refuses any change)
 *
 * On approval the dynamic checks run again with today's state; anything stale answers `reapproval_required`
 * and reserves nothing. The reservation carries the approval id and policy version; a re-approval of the
 * same workflow step reaches the same operation and effect key (the ledger's identity), only recording the
 * new approval id while it is still pending.
 *
 * What this does not prove: the hash shows the approver saw this exact stored envelope, not that they read
 * it; the envelope is as trustworthy as the server that stored it. Rate windows are not charged again at
 * approval: the call was counted when it was made.
 */
import { bindQueries, withTransaction, type Queryable } from '../db/index.js';
import { ActionLedgerError, asActionLedgerError } from '../core/errors.js';
import type { JsonObject } from '../core/json.js';
import type { GateTool } from '../config/index.js';
import type { AuditEntry } from './audit.js';
import type { GateCore } from './core.js';
import { checkReviewer, type Value } from './checks.js';
import { Refused, refuse } from './refusal.js';
import { gateOperationQueries } from './queries.js';
import type { ApproveOptions, GateContext, GateResult, Reviewer } from './types.js';
import {
  approvalStaleness,
  NOT_FOUND,
  requestApproval,
  UUID,
  type ApprovalRow,
  type ApprovalView,
} from './approval-envelope.js';
import { foundInWords, hiddenInJson } from '../core/visible-text.js';
import { approvalBlockers, type ApprovalBlocker, type ApprovalCaller } from './approval-blockers.js';

export class Approvals {
  readonly #oq: Readonly<typeof gateOperationQueries>;

  constructor(private readonly core: GateCore) {
    this.#oq = bindQueries(gateOperationQueries, core.config.schemaQuoted);
  }

  /** Builds, stores and returns the envelope of a call that needs approval (inside the pipeline's transaction). */
  request(
    c: Queryable,
    ctx: GateContext,
    t: GateTool,
    args: JsonObject,
    sha: string,
    counters: string[],
    value: Value | null,
  ): Promise<GateResult> {
    return requestApproval(this.core, c, { ctx, tool: t, args, sha, counters, value });
  }

  /** The stored envelope and its hash, for the person deciding (same tenant only). Throws `not_found`, or a database failure's code. */
  async show(approvalId: string, reviewer: Pick<Reviewer, 'tenant_id'>): Promise<ApprovalView> {
    if (typeof approvalId !== 'string' || !UUID.test(approvalId)) throw new ActionLedgerError('not_found', NOT_FOUND);
    const row = (
      await this.core.pool
        .query<ApprovalRow>(this.core.q.approvalSelect, [approvalId, reviewer.tenant_id])
        .catch((err: unknown) => {
          throw asActionLedgerError(err);
        })
    ).rows[0];
    if (row === undefined) throw new ActionLedgerError('not_found', NOT_FOUND);
    return {
      approval_id: row.approval_id,
      status: row.status,
      envelope: row.envelope_json,
      envelope_sha256: row.envelope_sha256,
      approvers: row.approvers,
      reason: row.reason,
      operation_id: row.operation_id,
    };
  }

  /**
   * Why `caller` cannot approve it now (approval-blockers.ts): empty when they may. Read without writing, on the
   * pool; the same checks approving and executing run, so a surface does not offer what would be refused.
   * Throws `not_found` (also for another tenant's approval), or a database failure's code.
   */
  async blockers(approvalId: string, caller: ApprovalCaller): Promise<ApprovalBlocker[]> {
    try {
      const row = await this.#row(this.core.pool, approvalId, caller.tenant_id);
      return await approvalBlockers(this.core, this.core.pool, row, caller);
    } catch (err) {
      if (err instanceof Refused) throw new ActionLedgerError(err.refusal.error, err.refusal.message);
      throw asActionLedgerError(err);
    }
  }

  async #run(
    action: AuditEntry['action'],
    reviewer: Reviewer,
    step: (c: Queryable, audit: Partial<AuditEntry>, who: Reviewer) => Promise<GateResult>,
  ): Promise<GateResult> {
    const core = this.core;
    const audit: Partial<AuditEntry> = {};
    let written = false;
    let result: GateResult;
    let context: Partial<Reviewer> = reviewer;
    try {
      const who = checkReviewer(reviewer);
      context = who;
      result = await withTransaction(core.pool, async (c) => {
        const r = await step(c, audit, who).catch((err: unknown) => {
          if (err instanceof Refused && audit.detail?.commit === true) return err.refusal;
          throw err;
        });
        await core.audit.decision(c, {
          action,
          outcome: r.ok ? r.status : r.error,
          context,
          tool: audit.tool ?? null,
          subjectId: audit.subjectId ?? null,
          detail: audit.detail ?? {},
        });
        written = true;
        return r;
      });
      core.wakeIfReserved(result);
    } catch (err) {
      written = false;
      result =
        err instanceof Refused
          ? err.refusal
          : core.failures
              .failed(err, { action, tool: audit.tool ?? null, subject_id: audit.subjectId ?? null })
              .toRefusal();
    }
    if (!written) {
      await core.audit.after({
        action,
        outcome: result.ok ? result.status : result.error,
        context,
        tool: audit.tool ?? null,
        subjectId: audit.subjectId ?? null,
        detail: audit.detail ?? {},
      });
    }
    return result;
  }

  async #row(c: Queryable, id: string, tenant: string, lock = false): Promise<ApprovalRow> {
    if (typeof id !== 'string' || !UUID.test(id)) throw refuse('not_found', NOT_FOUND);
    const row = (
      await c.query<ApprovalRow>(lock ? this.core.q.approvalSelectForUpdate : this.core.q.approvalSelect, [id, tenant])
    ).rows[0];
    if (row === undefined) throw refuse('not_found', NOT_FOUND);
    return row;
  }

  async #expire(c: Queryable, row: ApprovalRow, audit: Partial<AuditEntry>): Promise<never> {
    await c.query(this.core.q.approvalExpire, [row.approval_id]);
    audit.detail = { commit: true };
    throw refuse('approval_expired', 'this approval expired; request a new one', { request_id: row.approval_id });
  }

  async #reviewerMay(c: Queryable, row: ApprovalRow, reviewer: Reviewer): Promise<void> {
    const tool = this.core.tool(row.tool_name);
    const revoked = await this.core.access.roleRevoked(c, reviewer.tenant_id, reviewer.principal_id, reviewer.role);
    if (tool === undefined || !tool.approverRoles.has(reviewer.role) || revoked)
      throw refuse('permission_denied', 'your role may not decide this approval');
  }

  /**
   * Approves by id AND the envelope hash the approver was shown, in one conditional UPDATE (pending, inside
   * its TTL, not the requester, not a second vote) that records the role the approver voted with; when the required number of distinct approvers is reached
   * it executes (see {@link Approvals.execute}). Refusals: `not_found`, `permission_denied`,
   * `approval_hash_mismatch`, `self_approval_forbidden`, `approval_expired`, `invalid_state_transition`,
   * `config_invalid` (the tool binds resources this process has no resolver for; nothing recorded),
   * `hidden_characters` (the envelope holds characters a reader would not see as written, or right-to-left
   * text, and the approver did not acknowledge them: `acknowledgeHiddenCharacters`), and those of execute.
   */
  async approve(
    approvalId: string,
    displayedHash: string,
    reviewer: Reviewer,
    options: ApproveOptions = {},
  ): Promise<GateResult> {
    const first = await this.#run('approve', reviewer, async (c, audit, who) => {
      const row = await this.#row(c, approvalId, who.tenant_id);
      audit.tool = row.tool_name;
      audit.subjectId = row.approval_id;
      await this.#reviewerMay(c, row, who);
      // Refused before the vote is recorded: approving here could never execute (the operator CLI has no
      // resolvers), and an approval committed without its execution is a decision nobody carried out.
      const missing = (this.core.tool(row.tool_name)?.resources ?? [])
        .filter((r) => this.core.registry.resolver(r.type) === undefined)
        .map((r) => r.type);
      if (missing.length > 0) {
        throw refuse(
          'config_invalid',
          `${row.tool_name} binds resources (${missing.join(', ')}) this process cannot resolve; nothing was recorded: approve it through the service that registers them`,
          { request_id: row.approval_id },
        );
      }
      // What a person reads is what they approve: a character drawn as nothing, reordering its neighbours or
      // striking through a digit is shown as its code everywhere, text written right to left (which reorders
      // the digits around it) is reported beside them, and approving either takes a second, explicit yes.
      const hidden = hiddenInJson(row.envelope_json);
      if (hidden.length > 0 && options.acknowledgeHiddenCharacters !== true)
        throw refuse(
          'hidden_characters',
          `what you are asked to approve holds ${hidden.length === 50 ? '50 or more' : String(hidden.length)} place(s) a reader would not see as stored, hidden characters or right-to-left text (${foundInWords(hidden, 3)}); read them as shown, then approve with the acknowledgement, or reject`,
          { request_id: row.approval_id, details: { hidden } },
        );
      const upd = await c.query<{ status: string }>(this.core.q.approvalApprove, [
        row.approval_id,
        who.tenant_id,
        String(displayedHash),
        who.principal_id,
        who.role,
      ]);
      const status = upd.rows[0]?.status;
      if (status === 'approved')
        return { ok: true, status: 'approved', request_id: row.approval_id, message: 'approved' };
      if (status === 'pending') {
        audit.detail = { approvers_needed: row.required_approvals };
        return {
          ok: true,
          status: 'pending_approvals',
          request_id: row.approval_id,
          message: 'recorded; more approvers are needed',
        };
      }
      // Refused: say exactly why, from the row as it is now.
      const now = await this.#row(c, approvalId, who.tenant_id);
      if ((now.status === 'pending' || now.status === 'approved') && now.expired) await this.#expire(c, now, audit);
      if (now.status === 'expired')
        throw refuse('approval_expired', 'this approval expired; request a new one', { request_id: now.approval_id });
      if (now.status !== 'pending')
        throw refuse('invalid_state_transition', `this approval is already ${now.status}`, {
          request_id: now.approval_id,
        });
      if (now.envelope_sha256 !== displayedHash)
        throw refuse(
          'approval_hash_mismatch',
          'the approval you were shown is not the one stored; reload it and review again',
          { request_id: now.approval_id },
        );
      if (now.requester_id === who.principal_id || now.approvers.includes(who.principal_id)) {
        throw refuse(
          'self_approval_forbidden',
          'another person must approve this (the requester never approves, and nobody counts twice)',
          { request_id: now.approval_id },
        );
      }
      throw refuse('invalid_state_transition', 'this approval changed while approving', {
        request_id: now.approval_id,
      });
    });
    if (!first.ok && first.error !== undefined) return first;
    if (first.ok && first.status === 'pending_approvals') return first;
    return this.execute(approvalId, reviewer);
  }

  /** Rejects with a reason; final. `not_found`, `permission_denied`, `approval_expired`, `invalid_state_transition`. */
  reject(approvalId: string, reviewer: Reviewer, reason: string): Promise<GateResult> {
    return this.#run('reject', reviewer, async (c, audit, who) => {
      const row = await this.#row(c, approvalId, who.tenant_id, true);
      audit.tool = row.tool_name;
      audit.subjectId = row.approval_id;
      await this.#reviewerMay(c, row, who);
      if (typeof reason !== 'string' || reason.trim() === '' || reason.length > 1000)
        throw refuse('invalid_request', 'a rejection needs a reason (at most 1000 characters)');
      if ((row.status === 'pending' || row.status === 'approved') && row.expired) await this.#expire(c, row, audit);
      const upd = await c.query(this.core.q.approvalReject, [row.approval_id, who.tenant_id, reason]);
      if (upd.rowCount !== 1)
        throw refuse('invalid_state_transition', `this approval is already ${row.status}`, {
          request_id: row.approval_id,
        });
      audit.detail = { reason };
      return { ok: true, status: 'rejected', request_id: row.approval_id, message: 'rejected' };
    });
  }

  /**
   * Executes an approved approval: idempotent (an executed one returns its operation). The actor needs one of
   * the tool's approver roles, not revoked (`permission_denied`), as for approving. Re-runs the dynamic
   * checks with today's state: kill switch (`tool_disabled`, stays approved for a later retry), then plan
   * version, policy version, the requester's permission, today's caps over what it holds, and every bound
   * resource version; any of those stale -> `invalidated` and `reapproval_required`, nothing reserved.
   */
  execute(approvalId: string, actor: Reviewer): Promise<GateResult> {
    return this.#run('execute', actor, async (c, audit, who) => {
      const core = this.core;
      const row = await this.#row(c, approvalId, who.tenant_id, true);
      audit.tool = row.tool_name;
      audit.subjectId = row.approval_id;
      await this.#reviewerMay(c, row, who); // the same rule as approving: an approver role, not revoked
      if (row.status === 'executed' && row.operation_id !== null) {
        const op = (
          await c.query<{ operation_id: string; effect_key: string; status: never }>(this.#oq.operationSelect, [
            row.operation_id,
          ])
        ).rows[0];
        return {
          ok: true,
          status: 'reserved',
          operation_id: row.operation_id,
          effect_key: op?.effect_key ?? '',
          created: false,
          request_id: row.approval_id,
          message: 'already executed',
        };
      }
      if ((row.status === 'pending' || row.status === 'approved') && row.expired) await this.#expire(c, row, audit);
      if (row.status !== 'approved')
        throw refuse('invalid_state_transition', `this approval is ${row.status}`, { request_id: row.approval_id });
      const killed = await core.access.killSwitch(c, row.tenant_id, row.tool_name);
      if (killed !== null)
        throw refuse(
          'tool_disabled',
          `${row.tool_name} is disabled for now (${killed.reason}); the approval stays valid until it expires`,
          { request_id: row.approval_id },
        );

      const stale = await approvalStaleness(core, c, row);
      if (stale !== null) {
        await c.query(core.q.approvalInvalidate, [row.approval_id, stale.reason]);
        audit.detail = { commit: true, ...stale };
        throw refuse(
          'reapproval_required',
          `what was approved no longer holds (${stale.reason}); nothing was done, a new approval is needed`,
          { request_id: row.approval_id, details: stale },
        );
      }
      const r = await core.reservation.reserve(
        c,
        {
          tenant_id: row.tenant_id,
          principal_id: row.requester_id,
          task_id: row.task_id,
          workflow_step_id: row.workflow_step_id,
          role: row.requester_role,
        },
        row.tool_name,
        row.arguments_json,
        { kind: 'approval', id: row.approval_id, policyVersion: row.policy_version },
        { counters: [], value: null, subject: { approval: row.approval_id } },
      );
      const upd = await c.query(core.q.approvalExecuted, [row.approval_id, r.operation_id]);
      if (upd.rowCount !== 1)
        throw refuse('invalid_state_transition', 'this approval changed while executing', {
          request_id: row.approval_id,
        });
      audit.detail = { operation_id: r.operation_id, created: r.created };
      return {
        ok: true,
        status: 'reserved',
        operation_id: r.operation_id,
        effect_key: r.effect_key,
        created: r.created,
        operation_status: r.status,
        request_id: row.approval_id,
        message: 'approved and reserved',
      };
    });
  }

  /**
   * Marks every pending or approved approval past its TTL `expired` (releasing its holds) and audits each, in
   * one transaction: all of it or none (`audit_unavailable` when the audit rows cannot be written).
   */
  async expireDue(): Promise<number> {
    return withTransaction(this.core.pool, async (c) => {
      const { rows } = await c.query<{ approval_id: string; tenant_id: string; tool_name: string }>(
        this.core.q.approvalExpireDue,
      );
      for (const r of rows)
        await this.core.audit.decision(c, {
          action: 'expire',
          outcome: 'expired',
          context: { tenant_id: r.tenant_id },
          tool: r.tool_name,
          subjectId: r.approval_id,
        });
      return rows.length;
    });
  }
}
