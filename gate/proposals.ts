/**
 * Confirmation by the user: a proposal records the exact arguments and their hash; the confirm
 * token is returned once and only its sha256 is stored.
 *
 *   proposed --confirm(token, next turn)--> confirmed --execute()--> executed
 *   proposed | confirmed --cancel()--> cancelled
 *   proposed | confirmed --(TTL passed, noticed on the next touch)--> expired      (all three final)
 *
 * Confirm is not replayable (a second one is `invalid_state_transition`); execute is idempotent (the same
 * operation again) and builds the payload from the stored proposal, never from re-supplied arguments, which
 * are only compared by hash (`params_mismatch`).
 *
 * What this does not prove: the same-turn rule forces one user-turn boundary between proposal and
 * confirmation, and the model cannot forge the turn id (it comes from the trusted context). It is NOT proof
 * that a human clicked anything: on the agent path the model still decides when to call confirm, so treat it
 * as turn-separated, model-mediated confirmation. Tools whose effect must be a person's decision use approval
 * mode `threshold` or `always` instead.
 *
 * A proposal is its principal's: only a context of the same tenant and principal (for a service acting for
 * users, the same end user) confirms, executes or cancels it. Anyone else, in the tenant or not, is answered
 * `proposal_not_found`, exactly as for an unknown id or token, so that its existence is not revealed; the
 * attempt is audited as that refusal, naming the proposal it aimed at and `not_owner` in its detail. Nothing
 * about the proposal changes (not even a due expiry).
 */
import { withTransaction, type Queryable } from '../db/index.js';
import { canonicalArguments, sha256Hex, type JsonObject } from '../core/json.js';
import type { AuditEntry } from './audit.js';
import { checkGateContext } from './checks.js';
import type { GateCore } from './core.js';
import { Refused, refuse } from './refusal.js';
import type { GateContext, GateResult } from './types.js';

type ProposalRow = {
  proposal_id: string;
  tenant_id: string;
  principal_id: string;
  role: string;
  account_id: string;
  conversation_id: string;
  turn_id: string;
  trace_id: string;
  task_id: string;
  workflow_step_id: string;
  tool_name: string;
  arguments_json: JsonObject;
  args_sha256: string;
  policy_version: string;
  status: 'proposed' | 'confirmed' | 'executed' | 'cancelled' | 'expired';
  operation_id: string | null;
  expires_at: Date;
  expired: boolean;
};

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const NOT_FOUND = 'no such proposal';

export class Proposals {
  constructor(private readonly core: GateCore) {}

  /**
   * Runs `step` in a transaction and always audits: a refusal with an expiry it noticed still commits the
   * expiry (a lazily expired proposal stays expired), then the refusal is returned.
   */
  async #run(
    action: AuditEntry['action'],
    context: GateContext,
    step: (c: Queryable, audit: Partial<AuditEntry>) => Promise<GateResult>,
  ): Promise<GateResult> {
    const core = this.core;
    const audit: Partial<AuditEntry> = {};
    let result: GateResult;
    try {
      const ctx = checkGateContext(context);
      result = await withTransaction(core.pool, async (c) => {
        const r = await step(c, audit).catch((err: unknown) => {
          if (err instanceof Refused && audit.detail?.commit === true) return err.refusal;
          throw err;
        });
        await core.audit.decision(c, {
          action,
          outcome: r.ok ? r.status : r.error,
          context: ctx,
          tool: audit.tool ?? null,
          subjectId: audit.subjectId ?? null,
          detail: audit.detail ?? {},
        });
        audit.detail = { ...audit.detail, written: true };
        return r;
      });
      core.wakeIfReserved(result);
    } catch (err) {
      result =
        err instanceof Refused
          ? err.refusal
          : core.failures
              .failed(err, { action, tool: audit.tool ?? null, subject_id: audit.subjectId ?? null })
              .toRefusal();
    }
    if (audit.detail?.written !== true) {
      await core.audit.after({
        action,
        outcome: result.ok ? result.status : result.error,
        context,
        tool: audit.tool ?? null,
        subjectId: audit.subjectId ?? null,
        ...(audit.detail === undefined ? {} : { detail: audit.detail }),
      });
    }
    return result;
  }

  /** Marks an expired proposal `expired` (committed even though the caller is refused). */
  async #expireIfDue(c: Queryable, row: ProposalRow, audit: Partial<AuditEntry>): Promise<void> {
    if (!row.expired || (row.status !== 'proposed' && row.status !== 'confirmed')) return;
    await c.query(this.core.q.proposalExpire, [row.proposal_id]);
    audit.detail = { commit: true, expired: true };
    throw refuse('proposal_expired', 'this proposal expired; propose again', { request_id: row.proposal_id });
  }

  /**
   * Confirms a proposal by its token, from `proposed` only, in a later user turn than the proposal, by the
   * proposal's own principal. Refusals: `proposal_not_found` (unknown token, or another tenant's or another
   * principal's proposal), `proposal_expired`, `invalid_state_transition` (a replayed confirm),
   * `proposal_same_turn_confirm`.
   */
  confirm(token: string, context: GateContext): Promise<GateResult> {
    return this.#run('confirm', context, async (c, audit) => {
      const hash = sha256Hex(typeof token === 'string' ? token : '');
      const row = (await c.query<ProposalRow>(this.core.q.proposalByToken, [hash, context.tenant_id])).rows[0];
      this.#owned(row, context, audit);
      await this.#expireIfDue(c, row, audit);
      if (row.status !== 'proposed')
        throw refuse('invalid_state_transition', `this proposal is ${row.status}; a confirmation counts once`, {
          request_id: row.proposal_id,
        });
      if (row.turn_id === context.turn_id) {
        throw refuse(
          'proposal_same_turn_confirm',
          'this action cannot be confirmed in the turn it was proposed in; ask the user, then confirm after they answer',
          { request_id: row.proposal_id },
        );
      }
      const upd = await c.query(this.core.q.proposalConfirm, [row.proposal_id, context.principal_id, context.turn_id]);
      if (upd.rowCount !== 1)
        throw refuse('invalid_state_transition', 'this proposal is no longer awaiting confirmation', {
          request_id: row.proposal_id,
        });
      return {
        ok: true,
        status: 'confirmed',
        request_id: row.proposal_id,
        message: 'confirmed; execute it to carry it out',
      };
    });
  }

  /**
   * Cancels a proposal from `proposed` or `confirmed`, by its own principal; `proposal_not_found` (unknown, or
   * another tenant's or principal's), `proposal_expired`, `invalid_state_transition`.
   */
  cancel(proposalId: string, context: GateContext): Promise<GateResult> {
    return this.#run('cancel', context, async (c, audit) => {
      const row = await this.#byId(c, proposalId, context, audit);
      await this.#expireIfDue(c, row, audit);
      const upd = await c.query(this.core.q.proposalCancel, [row.proposal_id]);
      if (upd.rowCount !== 1)
        throw refuse('invalid_state_transition', `this proposal is ${row.status} and cannot be cancelled`, {
          request_id: row.proposal_id,
        });
      return { ok: true, status: 'cancelled', request_id: row.proposal_id, message: 'cancelled' };
    });
  }

  /**
   * Executes a confirmed proposal, by its own principal (anyone else: `proposal_not_found`): idempotent (an
   * executed one returns its operation), payload from the stored arguments; arguments given here must hash to
   * the proposed ones (`params_mismatch`, nothing reserved). Re-checks permission and the kill switch with
   * today's state.
   */
  /* eslint-disable max-lines-per-function -- one transaction read top to bottom: its checks in order (state,
     arguments hash, permission, kill switch), then the reservation */
  execute(proposalId: string, context: GateContext, options: { args?: unknown } = {}): Promise<GateResult> {
    return this.#run('execute', context, async (c, audit) => {
      const core = this.core;
      const row = await this.#byId(c, proposalId, context, audit);
      if (options.args !== undefined) {
        let sha = '';
        try {
          sha = sha256Hex(canonicalArguments(options.args, core.config.argumentBounds));
        } catch {
          sha = '';
        }
        if (sha !== row.args_sha256) {
          throw refuse('params_mismatch', 'these arguments are not the ones proposed and confirmed; nothing was done', {
            request_id: row.proposal_id,
            details: { proposed_args_sha256: row.args_sha256 },
          });
        }
      }
      if (row.status === 'executed' && row.operation_id !== null) {
        const op = await core.ledger.reserve(
          {
            tenant_id: row.tenant_id,
            principal_id: row.principal_id,
            task_id: row.task_id,
            workflow_step_id: row.workflow_step_id,
            approval_id: `proposal:${row.proposal_id}`,
            policy_version: row.policy_version,
          },
          row.tool_name,
          row.arguments_json,
          { client: c },
        );
        return {
          ok: true,
          status: 'reserved',
          operation_id: op.operation_id,
          effect_key: op.effect_key,
          created: false,
          operation_status: op.status,
          request_id: row.proposal_id,
          message: 'already executed',
        };
      }
      await this.#expireIfDue(c, row, audit);
      if (row.status !== 'confirmed')
        throw refuse('invalid_state_transition', `this proposal is ${row.status}; only a confirmed proposal executes`, {
          request_id: row.proposal_id,
        });
      const tool = core.tool(row.tool_name);
      if (tool === undefined || !(await core.access.permitted(c, tool, row.tenant_id, row.principal_id, row.role)))
        throw refuse('permission_denied', `the proposer's role may no longer call ${row.tool_name}`);
      const killed = await core.access.killSwitch(c, row.tenant_id, row.tool_name);
      if (killed !== null) throw refuse('tool_disabled', `${row.tool_name} is disabled for now (${killed.reason})`);
      const r = await core.reservation.reserve(
        c,
        {
          tenant_id: row.tenant_id,
          principal_id: row.principal_id,
          task_id: row.task_id,
          workflow_step_id: row.workflow_step_id,
          role: row.role,
        },
        row.tool_name,
        row.arguments_json,
        { kind: 'proposal', id: `proposal:${row.proposal_id}`, policyVersion: row.policy_version },
        { counters: [], value: null, subject: { proposal: row.proposal_id } },
      );
      const upd = await c.query(core.q.proposalExecuted, [row.proposal_id, r.operation_id]);
      if (upd.rowCount !== 1)
        throw refuse('invalid_state_transition', 'this proposal changed state while executing', {
          request_id: row.proposal_id,
        });
      return {
        ok: true,
        status: 'reserved',
        operation_id: r.operation_id,
        effect_key: r.effect_key,
        created: r.created,
        operation_status: r.status,
        request_id: row.proposal_id,
        message: 'executed',
      };
    });
  }
  /* eslint-enable max-lines-per-function */

  async #byId(c: Queryable, id: string, context: GateContext, audit: Partial<AuditEntry>): Promise<ProposalRow> {
    if (typeof id !== 'string' || !UUID.test(id)) throw refuse('proposal_not_found', NOT_FOUND);
    const row = (await c.query<ProposalRow>(this.core.q.proposalById, [id, context.tenant_id])).rows[0];
    this.#owned(row, context, audit);
    return row;
  }

  /**
   * The proposal found (already in the context's tenant) is the context's principal's, or the answer is the
   * unknown id's `proposal_not_found`, before anything about it is looked at or changed. The refusal's audit
   * row names the proposal and says `not_owner`: the caller learns nothing it would not from a random id.
   */
  #owned(row: ProposalRow | undefined, context: GateContext, audit: Partial<AuditEntry>): asserts row is ProposalRow {
    if (row === undefined) throw refuse('proposal_not_found', NOT_FOUND);
    audit.tool = row.tool_name;
    audit.subjectId = row.proposal_id;
    if (row.principal_id !== context.principal_id) {
      audit.detail = { not_owner: true };
      throw refuse('proposal_not_found', NOT_FOUND);
    }
  }
}
