/**
 * Review actions: what a person does with an operation the system could not finish on its own. Each is one
 * transaction that locks the operation, checks its state, moves it fenced on that state, and appends a
 * history row naming who did it and why (the audit trail).
 *
 * | action              | from                      | to                                         |
 * |---------------------|---------------------------|--------------------------------------------|
 * | `retry`             | needs_review, when the recorded provider contact proves no effect (readback said no effect, or the provider was never called) | pending: a new outbox attempt, same operation and effect key, fresh authorization again |
 * | `resolve-succeeded` | needs_review, unknown     | succeeded, with the receipt the reviewer found |
 * | `resolve-failed`    | needs_review              | failed (a later pass compensates the task's earlier steps) |
 * | `compensate`        | succeeded, needs_review   | compensating, with a minted compensation operation |
 */
import type { Config } from '../config/index.js';
import { bindQueries, withTransaction, type Pool } from '../db/index.js';
import { ActionLedgerError } from '../core/errors.js';
import type { JsonValue } from '../core/json.js';
import type { Compensator } from '../compensator/index.js';
import { outboxChannel } from '../ledger/index.js';
import { providerHasNoEffect, type ProviderContact } from '../ledger/index.js';
import { AuditWriter } from '../gate/index.js';
import { reviewQueries } from './queries.js';
import { inSpan, linkActiveSpan, SpanKind } from '../core/tracing.js';

export interface ReviewInput {
  /** Who: a person or system identity, recorded in the history. */
  actor: string;
  /** Why, in words a later reader understands. */
  reason: string;
  /**
   * The tenant the actor acts in (the HTTP API's caller): an operation of another tenant is refused
   * `not_found`, exactly as a missing one, before anything is read under a lock. Absent: any tenant (the CLI).
   */
  tenant?: string;
  /** The request that asked (the HTTP API's request id): recorded in the audit row as its trace id. */
  requestId?: string;
}

export interface ReviewResult {
  ok: true;
  operation_id: string;
  from: string;
  to: string;
  attempt?: number;
  compensation?: 'minted' | 'escalated';
}

/**
 * Whether a reviewed retry (a new attempt with the same effect key) cannot apply the effect twice: the
 * operation's recorded provider contact (ledger/transitions.ts `ProviderContact`) says no request of its
 * current attempt left, or a readback found no effect. `maybe_called`, or no fact at all, is never safe.
 */
export function retryIsSafe(contact: ProviderContact | null | undefined): boolean {
  return providerHasNoEffect(contact);
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const RECEIPT = /^[\x21-\x7e]{1,256}$/;

/** Text safe for the audit columns (no NUL, no lone surrogates, bounded); null when not text. */
function printable(v: unknown): string | null {
  return typeof v === 'string'
    ? v
        .toWellFormed()
        .replace(/\u0000/g, '\uFFFD')
        .slice(0, 2000)
    : null;
}

function checkText(field: string, v: unknown, max: number): string {
  if (
    typeof v !== 'string' ||
    v.trim().length === 0 ||
    v.length > max ||
    !v.isWellFormed() ||
    /[\u0000-\u001f\u007f]/.test(v)
  ) {
    throw new ActionLedgerError(
      'invalid_review',
      `${field} is required: non-empty text of at most ${max} characters without control characters`,
      { details: { field } },
    );
  }
  return v;
}

/** The operation as a review action read it under its row lock. */
export type LockedOperation = {
  operation_id: string;
  status: string;
  review_reason: string | null;
  provider_contact: ProviderContact;
  attempt: number;
  tool_name: string;
  /** The trace it was reserved under (sql/0020_operation_trace_context.sql), linked from the action's span. */
  trace_context?: string | null;
};
type Locked = LockedOperation;

/**
 * What a retry made on someone's behalf adds (a review policy, reconciler/review-policy.ts): a check run under
 * the row lock after the retry's own (state, expectation, provider contact), in the same transaction.
 */
export interface RetryGuard {
  /** Throws to refuse (nothing changes); returns what the history row records beside the retry's own detail. */
  check(c: Pick<Pool, 'query'>, op: LockedOperation): Promise<Record<string, JsonValue>>;
  /** Recorded in the audit row's detail, done or refused. */
  audit: Record<string, JsonValue>;
}

/**
 * The attempt and review reason the operation had when the caller chose it (a listing, a console page): when it
 * has since moved on (retried, back in review for another reason), the action is refused under the row lock,
 * not applied to a state nobody looked at.
 */
export interface Expectation {
  attempt: number;
  reviewReason: string;
}

/** The state a review action may say it saw. */
export interface ExpectOptions {
  expect?: Expectation;
}

/** What a retry may add: a fresh approval, and the state the caller saw when it chose the operation. */
export interface RetryOptions extends ExpectOptions {
  approvalId?: string;
  policyVersion?: string;
}

/** Refuses an action whose expectation no longer holds: `invalid_state_transition`. */
export function checkExpectation(
  action: string,
  op: { status: string; attempt: number; review_reason: string | null },
  expect: Expectation | undefined,
): void {
  if (expect === undefined) return;
  if (op.attempt === expect.attempt && op.review_reason === expect.reviewReason) return;
  throw new ActionLedgerError(
    'invalid_state_transition',
    'the operation changed since it was selected: it is in review with another attempt or reason',
    {
      details: {
        status: op.status,
        action,
        attempt: op.attempt,
        review_reason: op.review_reason,
        expected_attempt: expect.attempt,
        expected_review_reason: expect.reviewReason,
      },
    },
  );
}

export class Review {
  readonly #config: Config;
  readonly #pool: Pool;
  readonly #audit: AuditWriter;
  readonly #compensator: Compensator;
  readonly #q: Readonly<typeof reviewQueries>;

  constructor(config: Config, pool: Pool, compensator: Compensator) {
    this.#config = config;
    this.#pool = pool;
    this.#audit = new AuditWriter({ config, pool });
    this.#compensator = compensator;
    this.#q = bindQueries(reviewQueries, config.schemaQuoted);
  }

  /**
   * Throws `invalid_review`, `not_found`, `invalid_state_transition` (also when `expect` no longer holds),
   * `retry_not_safe`.
   */
  async retry(operationId: string, input: ReviewInput & RetryOptions): Promise<ReviewResult> {
    return this.#audited('retry', operationId, input, () => this.#retry(operationId, input));
  }

  /**
   * The same retry, asked on someone's behalf (a review policy a person wrote ahead of time): the same checks,
   * fence and audit row, with `guard` checked under the row lock as well. `expect` is required: whoever acts
   * without a person looking acts only on the state it read. Throws as {@link retry} does, and whatever the
   * guard throws.
   */
  async retryGuarded(
    operationId: string,
    input: ReviewInput & { expect: Expectation },
    guard: RetryGuard,
  ): Promise<ReviewResult> {
    return this.#audited('retry', operationId, input, () => this.#retry(operationId, input, guard), guard.audit);
  }

  /** Throws `invalid_review`, `not_found`, `invalid_state_transition` (also when `expect` no longer holds). */
  async resolveSucceeded(
    operationId: string,
    input: ReviewInput & ExpectOptions & { receipt: string },
  ): Promise<ReviewResult> {
    return this.#audited('resolve_succeeded', operationId, input, () => this.#resolveSucceeded(operationId, input));
  }

  /** Throws `invalid_review`, `not_found`, `invalid_state_transition` (also when `expect` no longer holds). */
  async resolveFailed(operationId: string, input: ReviewInput & ExpectOptions): Promise<ReviewResult> {
    return this.#audited('resolve_failed', operationId, input, () => this.#resolveFailed(operationId, input));
  }

  /** Throws `invalid_review`, `not_found`, `invalid_state_transition` (also when `expect` no longer holds). */
  async compensate(operationId: string, input: ReviewInput & ExpectOptions): Promise<ReviewResult> {
    return this.#audited('compensate', operationId, input, () => this.#compensate(operationId, input));
  }

  /**
   * Every review action, done or refused, gets a row in the audit log (`gate_audit`, action `review:<name>`)
   * beside the operation's own history: who asked, why, and what came of it.
   */
  async #audited(
    action: string,
    operationId: string,
    input: Partial<ReviewInput>,
    run: () => Promise<ReviewResult>,
    extra: Record<string, JsonValue> = {},
  ): Promise<ReviewResult> {
    const started = performance.now();
    // An operation outside the actor's tenant is audited like a missing one: no tenant or tool read from it.
    let foreign = false;
    // Written through the gate's audit writer: a refused row falls back to a smaller one, and a lost one is logged
    // and counted (actionledger_audit_lost_total), never dropped silently.
    const write = async (outcome: string, detail: Record<string, unknown>): Promise<void> => {
      const id = UUID.test(operationId) ? operationId : null;
      await this.#audit.after({
        action: `review:${action}`,
        outcome,
        context: {
          principal_id: printable(input?.actor) ?? undefined,
          tenant_id: input?.tenant,
          trace_id: input?.requestId,
        },
        subjectId: id ?? printable(operationId),
        operationId: foreign ? null : id,
        detail: { ...extra, ...(input?.requestId === undefined ? detail : { ...detail, request_id: input.requestId }) },
        durationMs: performance.now() - started,
      });
    };
    try {
      if (input?.tenant !== undefined && !(await this.#inTenant(operationId, input.tenant))) {
        foreign = true;
        throw new ActionLedgerError('not_found', 'no such operation');
      }
      // The action's span (a child of the request that asked for it), linked to the operation's trace by #lock.
      const r = await inSpan(
        `review ${action}`,
        SpanKind.INTERNAL,
        () => ({ 'actionledger.operation_id': operationId, 'actionledger.review_action': action }),
        () => run(),
      );
      await write('ok', {
        why: printable(input?.reason),
        from: r.from,
        to: r.to,
        ...(r.attempt === undefined ? {} : { attempt: r.attempt }),
      });
      return r;
    } catch (err) {
      await write(err instanceof ActionLedgerError ? err.code : 'internal', { why: printable(input?.reason) });
      throw err;
    }
  }

  async #retry(operationId: string, input: ReviewInput & RetryOptions, guard?: RetryGuard): Promise<ReviewResult> {
    const { actor, reason } = this.#input(input);
    const approval = input.approvalId === undefined ? null : checkText('approval id', input.approvalId, 256);
    const policy = input.policyVersion === undefined ? null : checkText('policy version', input.policyVersion, 256);
    return withTransaction(this.#pool, async (c) => {
      const op = await this.#lock(c, operationId);
      if (op.status !== 'needs_review') throw this.#wrongState('retry', op.status);
      checkExpectation('retry', op, input.expect);
      if (!retryIsSafe(op.provider_contact)) {
        throw new ActionLedgerError(
          'retry_not_safe',
          `retry needs proof that the provider has no effect; this operation is in review for ${op.review_reason} and the provider may have been called`,
          {
            details: { review_reason: op.review_reason, provider_contact: op.provider_contact },
          },
        );
      }
      const guarded = guard === undefined ? {} : await guard.check(c, op);
      const { rows } = await c.query<{ attempt: number }>(this.#q.retry, [
        operationId,
        op.review_reason,
        approval,
        policy,
        actor,
        JSON.stringify({
          ...guarded,
          why: reason,
          previous_review_reason: op.review_reason,
          provider_contact: op.provider_contact,
          approval_id: approval,
          policy_version: policy,
        }),
      ]);
      const attempt = rows[0]?.attempt;
      if (attempt === undefined) throw new Error('retry fence missed under the row lock');
      await c.query(this.#q.outboxInsert, [operationId, attempt]);
      await c.query('SELECT pg_notify($1, $2)', [outboxChannel(this.#config.schema), '']);
      return { ok: true as const, operation_id: operationId, from: 'needs_review', to: 'pending', attempt };
    });
  }

  async #resolveSucceeded(
    operationId: string,
    input: ReviewInput & ExpectOptions & { receipt: string },
  ): Promise<ReviewResult> {
    const { actor, reason } = this.#input(input);
    if (typeof input.receipt !== 'string' || !RECEIPT.test(input.receipt)) {
      throw new ActionLedgerError(
        'invalid_review',
        'a receipt is required: 1 to 256 printable ASCII characters, no spaces',
        { details: { field: 'receipt' } },
      );
    }
    return this.#move(
      operationId,
      ['needs_review', 'unknown'],
      'succeeded',
      input.receipt,
      actor,
      'review:resolve_succeeded',
      { why: reason, receipt: input.receipt },
      input.expect,
    );
  }

  async #resolveFailed(operationId: string, input: ReviewInput & ExpectOptions): Promise<ReviewResult> {
    const { actor, reason } = this.#input(input);
    return this.#move(
      operationId,
      ['needs_review'],
      'failed',
      null,
      actor,
      'review:resolve_failed',
      { why: reason },
      input.expect,
    );
  }

  async #compensate(operationId: string, input: ReviewInput & ExpectOptions): Promise<ReviewResult> {
    const { actor, reason } = this.#input(input);
    if (!UUID.test(operationId)) throw new ActionLedgerError('not_found', 'no such operation');
    const before = await this.#pool.query<{ status: string }>(
      `SELECT status FROM ${this.#config.schemaQuoted}.operations WHERE operation_id = $1`,
      [operationId],
    );
    const r = await this.#compensator.compensate(
      operationId,
      actor,
      `review:compensate: ${reason}`,
      ['succeeded', 'needs_review'],
      true,
      (op) => checkExpectation('compensate', op, input.expect),
    );
    if (r === 'unchanged') throw this.#wrongState('compensate', before.rows[0]?.status ?? 'unknown');
    return {
      ok: true,
      operation_id: operationId,
      from: before.rows[0]?.status ?? '',
      to: r === 'minted' ? 'compensating' : 'needs_review',
      compensation: r,
    };
  }

  /** Whether the operation is in the tenant (true for a malformed id: the action refuses it as missing). */
  async #inTenant(operationId: string, tenant: string): Promise<boolean> {
    if (!UUID.test(operationId)) return true;
    const { rows } = await this.#pool.query(this.#q.inTenant, [operationId, tenant]);
    return rows.length === 1;
  }

  #input(input: ReviewInput): ReviewInput {
    return { actor: checkText('actor', input?.actor, 256), reason: checkText('reason', input?.reason, 2000) };
  }

  async #lock(c: Pick<Pool, 'query'>, operationId: string): Promise<Locked> {
    if (!UUID.test(operationId)) throw new ActionLedgerError('not_found', 'no such operation');
    const { rows } = await c.query<Locked>(this.#q.lock, [operationId]);
    const op = rows[0];
    if (op === undefined) throw new ActionLedgerError('not_found', 'no such operation');
    linkActiveSpan(op.trace_context);
    return op;
  }

  #wrongState(action: string, status: string): ActionLedgerError {
    return new ActionLedgerError('invalid_state_transition', `cannot ${action} an operation in ${status}`, {
      details: { status, action },
    });
  }

  async #move(
    operationId: string,
    from: string[],
    to: string,
    receipt: string | null,
    actor: string,
    reason: string,
    detail: Record<string, unknown>,
    expect?: Expectation,
  ): Promise<ReviewResult> {
    return withTransaction(this.#pool, async (c) => {
      const op = await this.#lock(c, operationId);
      const action = reason.replace('review:', '').replace('_', '-');
      if (!from.includes(op.status)) throw this.#wrongState(action, op.status);
      checkExpectation(action, op, expect);
      const { rows } = await c.query(this.#q.move, [
        operationId,
        op.status,
        to,
        receipt,
        null,
        actor,
        reason,
        JSON.stringify({ ...detail, previous_review_reason: op.review_reason }),
      ]);
      if (rows.length !== 1) throw new Error('review fence missed under the row lock');
      return { ok: true as const, operation_id: operationId, from: op.status, to };
    });
  }
}
