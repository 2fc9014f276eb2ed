/**
 * `Gate.call`: the agent-facing front door. The model is a caller with the privileges of nobody; everything
 * it asks for passes one pipeline, in this order, stopping at the first refusal:
 *
 *   unknown_tool -> permission_denied -> tool_disabled -> rate_limited -> invalid_arguments
 *   -> invalid_request / not_found (business) -> limit_exceeded
 *   -> confirmation_required (proposal) | approval_required (envelope) | reserve in the ledger
 *
 * Budgets, the proposal or approval, the reservation and the audit row of an accepted call commit in one
 * transaction. A refusal rolls that transaction back, so a refused call consumes no rate and no cap, and is
 * then written to the audit log on its own. An audit row that cannot be written fails the transaction: the call
 * is refused `audit_unavailable` and nothing it would have recorded is kept. Every result is a value the model
 * can read; nothing here throws at the agent loop (a database failure is its coded refusal, such as
 * `storage_full`, logged with the SQLSTATE; anything unexpected is `internal`).
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { sqlState, SQLSTATE, withTransaction, type Queryable } from '../db/index.js';
import { asActionLedgerError, type ErrorCode } from '../core/errors.js';
import { tenantClusterRefusal } from '../config/index.js';
import { identifier } from '../core/identifier.js';
import { canonicalJson, sha256Hex, type JsonObject } from '../core/json.js';
import type { GateTool } from '../config/index.js';
import { Approvals } from './approvals.js';
import { listKillSwitches, type KillSwitchRow } from './kill-switch-list.js';
import { withdrawPendingVotes } from './role-revocation.js';
import { admit } from './admission.js';
import { checkArguments, checkGateContext, valueOf, type Value } from './checks.js';
import { GateCore, type GateDeps } from './core.js';
import { Refused, refuse } from './refusal.js';
import { housekeepingWith, type GateHousekeepingSummary } from './housekeeping.js';
import { Proposals } from './proposals.js';
import type { GateNamedStatements } from './queries.js';
import type { ApproveOptions, GateContext, GateResult, Reviewer } from './types.js';
import { inSpan, SpanKind, tracingOn } from '../core/tracing.js';

/** What engaging a kill switch waited for: covered operations executing, and those a wait gave up on. */
export interface KillSwitchEngaged {
  /** Pending operations the switch holds (they are claimed once it is lifted), counted when it committed. */
  pending_held: number;
  executing: number;
  still_in_flight: number;
  /**
   * Set when the database failed after the switch committed: the switch is engaged, but the wait (or the list
   * of operations to wait for) did not complete; the operations it did not wait for are counted in flight.
   */
  wait_failed?: ErrorCode;
}

export interface CallOptions {
  /** For proposals: a shorter confirmation window than configured (never longer); whole seconds, at least 1. */
  ttl_s?: number;
}

/** Throws `invalid_request` unless `ttl_s` is absent or a whole number of seconds >= 1. */
function checkCallOptions(options: unknown): void {
  const ttl = (options as CallOptions | null | undefined)?.ttl_s;
  if (ttl !== undefined && !(typeof ttl === 'number' && Number.isSafeInteger(ttl) && ttl >= 1)) {
    throw refuse('invalid_request', 'ttl_s must be a whole number of seconds, at least 1', {
      details: { field: 'ttl_s' },
    });
  }
}

export class Gate {
  readonly #core: GateCore;
  readonly proposals: Proposals;
  readonly approvals: Approvals;

  /** Throws `config_invalid` when a configured validator or resource resolver is not registered. */
  constructor(deps: GateDeps) {
    this.#core = new GateCore(deps);
    this.proposals = new Proposals(this.#core);
    this.approvals = new Approvals(this.#core);
  }

  /** The engaged kill switches, oldest first. */
  killSwitches(): Promise<KillSwitchRow[]> {
    return listKillSwitches(this.#core.pool, this.#core.config.schemaQuoted);
  }

  /** The configured gate tool of that name (its roles, approval mode, schema), or undefined. */
  tool(name: string): GateTool | undefined {
    return this.#core.tool(name);
  }

  /** Runs the pipeline for one tool call. Never throws; see the module comment for the order. */
  async call(context: GateContext, tool: string, args: unknown, options: CallOptions = {}): Promise<GateResult> {
    if (!tracingOn()) return this.#call(context, tool, args, options);
    // The gate's decision as a span (the reservation's is its child), its outcome an attribute: allowed, or
    // the refusal's code. The tool is named only when it is configured, so a hostile name is never recorded, and
    // the tenant only from a context that passes the gate's own check (else the call's refusal says why).
    const known = typeof tool === 'string' && this.#core.tool(tool) !== undefined;
    let tenant: string | undefined;
    try {
      tenant = checkGateContext(context).tenant_id;
    } catch {
      tenant = undefined;
    }
    return inSpan(
      `gate ${known ? tool : 'call'}`,
      SpanKind.INTERNAL,
      () => ({
        'actionledger.tool': known ? tool : 'unknown',
        ...(tenant === undefined ? {} : { 'actionledger.tenant': tenant }),
      }),
      async (span) => {
        const r = await this.#call(context, tool, args, options);
        span?.setAttribute('actionledger.decision', r.ok ? 'allowed' : r.error);
        if (r.ok && r.operation_id !== undefined) span?.setAttribute('actionledger.operation_id', r.operation_id);
        return r;
      },
    );
  }

  async #call(context: GateContext, tool: string, args: unknown, options: CallOptions): Promise<GateResult> {
    const started = performance.now();
    const core = this.#core;
    let result: GateResult;
    let audited = false;
    try {
      const ctx = checkGateContext(context);
      const elsewhere = tenantClusterRefusal(core.config, ctx.tenant_id);
      if (elsewhere !== null) throw refuse('tenant_wrong_cluster', elsewhere.message, { details: elsewhere.details });
      if (typeof tool !== 'string') throw refuse('invalid_request', 'the tool name must be a string');
      const t = core.tool(tool);
      if (t === undefined) throw refuse('unknown_tool', `there is no tool named ${JSON.stringify(tool.slice(0, 64))}`);
      checkCallOptions(options);
      const decide = (named: GateNamedStatements | null): Promise<GateResult> =>
        withTransaction(core.pool, async (client) => {
          // An allowed call's audit row goes with the gate's record of its operation (gate/reservation.ts).
          const decision = { audited: false, started, named };
          const r = await this.#pipeline(client, ctx, t, args, options, decision);
          if (!decision.audited)
            await core.audit.decision(client, {
              action: 'call',
              outcome: r.ok ? 'allowed' : r.error,
              context: ctx,
              tool,
              subjectId: r.ok ? (r.operation_id ?? null) : (r.request_id ?? null),
              args,
              durationMs: performance.now() - started,
            });
          audited = true;
          return r;
        });
      try {
        result = await decide(core.named);
      } catch (err) {
        // The session lost a named statement, or its plan cannot run after a migration: that try rolled back
        // whole, and the decision is made again as unnamed text (gate/admission.ts).
        if (!namedStatementLost(err)) throw err;
        result = await decide(null);
      }
      core.wakeIfReserved(result);
    } catch (err) {
      audited = false;
      result =
        err instanceof Refused
          ? err.refusal
          : core.failures.failed(err, { action: 'call', tool: typeof tool === 'string' ? tool : null }).toRefusal();
    }
    if (!audited) {
      // Never dropped silently: a fallback row, or a logged and counted loss when the database is down.
      await core.audit.after({
        action: 'call',
        outcome: result.ok ? 'allowed' : result.error,
        context,
        tool: typeof tool === 'string' ? tool : null,
        args,
        durationMs: performance.now() - started,
        detail: result.ok ? {} : { message: result.message },
      });
    }
    return result;
  }

  async #pipeline(
    client: Queryable,
    ctx: GateContext,
    t: GateTool,
    args: unknown,
    options: CallOptions,
    decision: { audited: boolean; started: number; named: GateNamedStatements | null },
  ): Promise<GateResult> {
    const core = this.#core;
    if (!core.access.granted(t, ctx.tenant_id, ctx.role))
      throw refuse('permission_denied', `your role may not call ${t.name}`);
    // The checks that need no database run before the admission statement, whose caps need the value; each
    // refusal is still answered in its place in the pipeline's order, after the database's earlier ones.
    const checked = held(() => checkArguments(t, args, core.config.argumentBounds));
    const valued = checked.ok ? held(() => valueOf(t, checked.value.args)) : null;
    const value = valued?.ok === true ? valued.value : null;
    const mode = t.approval.mode;
    const needsApproval =
      mode === 'always' ||
      (mode === 'threshold' && value !== null && Number(value.amount) > (t.approval.threshold ?? Infinity));
    // A retried call of a step already reserved with these arguments is the same effect: it answers with the
    // existing operation and takes nothing from the caps a second time. The lookup is by the whole identity,
    // tenant included, so another tenant's steps are never seen there. The plan version is the principal's
    // task's (tenant, principal, task): another principal naming the same task id records its own, and
    // invalidates only its own approvals.
    const admitted = await admit(
      client,
      core.q,
      t,
      ctx,
      checked.ok && valued?.ok === true
        ? { sha256: checked.value.sha256, value, replayFree: mode !== 'confirm' && !needsApproval }
        : null,
      decision.named,
    );
    if (admitted.access !== null) throw admitted.access;
    if (!checked.ok) throw checked.refused;
    await core.registry.validateBusiness(client, t, ctx, checked.value.args);
    if (valued?.ok === false) throw valued.refused;
    if (admitted.caps !== null) throw admitted.caps;
    const counters = admitted.counters;
    for (const approvalId of admitted.invalidated)
      await core.audit.decision(client, {
        action: 'invalidate',
        outcome: 'plan_changed',
        context: ctx,
        subjectId: approvalId,
        detail: { plan_version: ctx.plan_version },
      });

    const canonicalArgs = checked.value.args;
    const sha = checked.value.sha256;
    if (mode === 'confirm') return this.#propose(client, ctx, t, canonicalArgs, sha, counters, value, options);
    if (needsApproval) return this.approvals.request(client, ctx, t, canonicalArgs, sha, counters, value);
    const r = await core.reservation.reserve(
      client,
      ctx,
      t.name,
      canonicalArgs,
      { kind: 'auto', id: 'auto', policyVersion: core.config.gate.policyVersion },
      { counters, value },
      {
        audit: (operationId) => ({
          action: 'call',
          outcome: 'allowed',
          context: ctx,
          tool: t.name,
          subjectId: operationId,
          args,
          durationMs: performance.now() - decision.started,
        }),
        named: decision.named !== null,
      },
    );
    decision.audited = true;
    return {
      ok: true,
      status: 'reserved',
      operation_id: r.operation_id,
      effect_key: r.effect_key,
      created: r.created,
      operation_status: r.status,
      message: `${t.name} accepted`,
    };
  }

  /**
   * Stores the exact arguments and their hash and returns a confirm token exactly once (only its sha256 is
   * kept). TTL is min(requested, configured).
   */
  async #propose(
    client: Queryable,
    ctx: GateContext,
    t: GateTool,
    args: JsonObject,
    sha: string,
    counters: string[],
    value: Value | null,
    options: CallOptions,
  ): Promise<GateResult> {
    const core = this.#core;
    const configured = core.config.gate.confirmationTtlS;
    const ttl = options.ttl_s === undefined ? configured : Math.min(options.ttl_s, configured);
    const id = randomUUID();
    const token = randomBytes(32).toString('base64url');
    const { rows } = await client.query<{ expires_at: Date }>(core.q.proposalInsert, [
      id,
      ctx.tenant_id,
      ctx.principal_id,
      ctx.role,
      ctx.account_id,
      ctx.conversation_id,
      ctx.turn_id,
      ctx.trace_id,
      ctx.task_id,
      ctx.workflow_step_id,
      t.name,
      canonicalJson(args),
      sha,
      sha256Hex(token),
      core.config.gate.policyVersion,
      ttl,
    ]);
    await core.budgets.hold(client, counters, value, { proposal: id });
    return {
      ok: false,
      error: 'confirmation_required',
      message: `${t.name} needs the user's confirmation: ask them, and confirm in their next turn`,
      request_id: id,
      confirm_token: token,
      expires_at: rows[0]?.expires_at.toISOString() ?? '',
    };
  }

  /** See {@link Proposals.confirm}. */
  confirm(token: string, context: GateContext): Promise<GateResult> {
    return this.proposals.confirm(token, context);
  }

  /** See {@link Proposals.cancel}. */
  cancelProposal(proposalId: string, context: GateContext): Promise<GateResult> {
    return this.proposals.cancel(proposalId, context);
  }

  /** See {@link Proposals.execute}. */
  executeProposal(proposalId: string, context: GateContext, options: { args?: unknown } = {}): Promise<GateResult> {
    return this.proposals.execute(proposalId, context, options);
  }

  /** See {@link Approvals.approve}. */
  approve(
    approvalId: string,
    displayedHash: string,
    reviewer: Reviewer,
    options: ApproveOptions = {},
  ): Promise<GateResult> {
    return this.approvals.approve(approvalId, displayedHash, reviewer, options);
  }

  /** See {@link Approvals.reject}. */
  reject(approvalId: string, reviewer: Reviewer, reason: string): Promise<GateResult> {
    return this.approvals.reject(approvalId, reviewer, reason);
  }

  /**
   * Housekeeping for a schedule or `actionledger gate expire`: marks approvals and proposals past their TTL
   * `expired` (releasing their holds, audited) and deletes rate windows that ended. Returns what it did.
   * The fleet's schedule calls {@link runGateHousekeeping}, the same pass without a Gate.
   */
  housekeeping(): Promise<GateHousekeepingSummary> {
    return housekeepingWith(this.#core, this.approvals);
  }

  /**
   * Engages a kill switch ('*' for every tenant or tool): committed first, with its audit row (or not at all:
   * `audit_unavailable`), so from then on new calls are refused, pending operations held, and claimed ones not
   * yet sent refused at the dispatcher's final check. Then waits, operation by operation, for the covered
   * requests that were already at the provider to have their outcomes recorded: each wait is one short
   * statement that holds nothing, so a hanging provider delays only this call. Returns how many covered
   * operations were executing, and how many were still at the provider when a wait gave up (the pool's
   * statement timeout, or the database failing after the switch committed: it is engaged either way); those
   * finish, or go unknown, without the switch's say, and how many pending operations it holds. Throws
   * `unknown_tool` / `unknown_tenant` for a target the configuration does not know (nothing written), and the
   * database's coded error when the switch was not engaged.
   */
  async engageKillSwitch(tenant: string, tool: string, actor: string, reason: string): Promise<KillSwitchEngaged> {
    const core = this.#core;
    core.access.checkSwitchTarget(tenant, tool);
    const held = await coded(() =>
      withTransaction(core.pool, async (c) => {
        await c.query(core.q.killSwitchEngage, [tenant, tool, actor, reason]);
        const pending = await c.query<{ n: number }>(core.q.killSwitchPending, [tenant, tool]);
        await core.audit.decision(c, {
          action: 'kill_switch',
          outcome: 'engaged',
          context: { tenant_id: tenant, principal_id: actor },
          tool,
          detail: { reason },
        });
        return pending.rows[0]?.n ?? 0;
      }),
    );
    // From here the switch is engaged: a database failure while waiting is reported, never thrown (a thrown
    // code would say nothing was written).
    let rows: { operation_id: string }[];
    try {
      rows = (await core.pool.query<{ operation_id: string }>(core.q.killSwitchInFlight, [tenant, tool])).rows;
    } catch (err) {
      const code = core.failures.failed(err, { action: 'kill_switch', stage: 'list_in_flight' }).code;
      return { pending_held: held, executing: 0, still_in_flight: 0, wait_failed: code };
    }
    let stillInFlight = 0;
    let waitFailed: ErrorCode | undefined;
    for (const { operation_id } of rows) {
      try {
        await core.pool.query(core.q.killSwitchAwaitOperation, [operation_id]);
      } catch (err) {
        if (sqlState(err) !== SQLSTATE.queryCanceled)
          waitFailed = core.failures.failed(err, { action: 'kill_switch', stage: 'await', operation_id }).code;
        stillInFlight++;
      }
    }
    return {
      pending_held: held,
      executing: rows.length,
      still_in_flight: stillInFlight,
      ...(waitFailed === undefined ? {} : { wait_failed: waitFailed }),
    };
  }

  /** Lifts a kill switch; held operations are dispatched again. Returns false when none was engaged. Throws coded errors. */
  async liftKillSwitch(tenant: string, tool: string, actor: string): Promise<boolean> {
    const lifted = await coded(() =>
      withTransaction(this.#core.pool, async (c) => {
        const { rowCount } = await c.query(this.#core.q.killSwitchLift, [tenant, tool]);
        await this.#core.audit.decision(c, {
          action: 'kill_switch',
          outcome: rowCount === 0 ? 'not_engaged' : 'lifted',
          context: { tenant_id: tenant, principal_id: actor },
          tool,
        });
        return rowCount !== 0;
      }),
    );
    // The operations it held are claimable now: the dispatchers are told, as after a reservation.
    if (lifted) this.#core.ledger.wake();
    return lifted;
  }

  /**
   * Takes a role from a principal at once: new calls, approvals, dispatch authorization and the dispatcher's
   * final check all see it, and the principal's votes on approvals still pending in the tenant stop counting
   * (returned as `votes_withdrawn`). Committed with its audit row or not at all; throws `invalid_context` for a
   * malformed name and coded errors (`audit_unavailable`, `storage_full`, ...).
   */
  async revokeRole(
    tenant: string,
    principal: string,
    role: string,
    actor: string,
  ): Promise<{ votes_withdrawn: string[] }> {
    const revoked = {
      tenant_id: identifier('tenant_id', tenant),
      principal_id: identifier('principal_id', principal),
      role: identifier('role', role),
    };
    return coded(() =>
      withTransaction(this.#core.pool, async (c) => {
        await c.query(this.#core.q.roleRevoke, [revoked.tenant_id, revoked.principal_id, revoked.role, actor]);
        const withdrawn = await withdrawPendingVotes(c, this.#core.config.schemaQuoted, revoked);
        await this.#core.audit.decision(c, {
          action: 'role',
          outcome: 'revoked',
          context: revoked,
          detail: { by: actor, votes_withdrawn: withdrawn },
        });
        return { votes_withdrawn: withdrawn };
      }),
    );
  }

  /** Gives a revoked role back; committed with its audit row or not at all; throws coded errors. */
  async restoreRole(tenant: string, principal: string, role: string, actor: string): Promise<void> {
    await coded(() =>
      withTransaction(this.#core.pool, async (c) => {
        await c.query(this.#core.q.roleRestore, [tenant, principal, role]);
        await this.#core.audit.decision(c, {
          action: 'role',
          outcome: 'restored',
          context: { tenant_id: tenant, principal_id: principal, role },
          detail: { by: actor },
        });
      }),
    );
  }
}

/** Whether `err` (or the error it wraps) is a named statement the session lost (26000) or cannot run (0A000). */
function namedStatementLost(err: unknown): boolean {
  const state = sqlState(err) ?? sqlState((err as { cause?: unknown } | null)?.cause);
  return state === SQLSTATE.invalidStatementName || state === SQLSTATE.featureNotSupported;
}

/** `fn`'s value, or the refusal it threw (held for its place in the pipeline's order); anything else is thrown. */
function held<T>(fn: () => T): { ok: true; value: T } | { ok: false; refused: Refused } {
  try {
    return { ok: true, value: fn() };
  } catch (err) {
    if (err instanceof Refused) return { ok: false, refused: err };
    throw err;
  }
}

/** Runs `fn`, turning anything it throws into its coded error (a database failure keeps its SQLSTATE in details). */
async function coded<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    throw asActionLedgerError(err);
  }
}
