/**
 * The completer of one dispatcher worker: every fenced write that ends a claim outside the dispatch batch's own
 * transaction. Outcomes a batch could not commit, pre-dispatch refusals, releases of never-sent claims, and the
 * recovery of a claim the normal path could not finish.
 *
 * States of one claim it ends:
 *   outcome    - sent: the classified outcome, written again on its own connection when the batch's commit
 *                failed or its fate is unknown (a no-op if it landed)
 *   refused    - not sent, refused before dispatch: `needs_review` with `<stage>:<code>`
 *   released   - not sent and nothing decided against it (the authorization service could not decide, the
 *                provider's connection failed before any byte, a transient database failure, a kill switch
 *                engaged before the send): back to `pending` (`released:<code>`) after a growing backoff; once
 *                the operation was released as often as its tool's release limit allows, review instead
 *   recovered  - an unexpected failure: `unknown` if possibly sent, `needs_review` (`internal:<code>`) if not
 *   lost       - the claim was no longer current: nothing to write
 * Each write is fenced on the claim token and retried while the worker runs (dispatcher/persist.ts); when the
 * worker halts first, the claim stays executing for the reconciler.
 */
import type { ProviderContact } from '../ledger/index.js';
import { databaseErrorCode, isConnectionError, isTransient, sqlState } from '../db/index.js';
import { ActionLedgerError, isActionLedgerError, type ErrorCode } from '../core/errors.js';
import type { JsonValue } from '../core/json.js';
import type { DispatchContext } from './context.js';
import type { Outcome } from './executor.js';
import { untilWritten, WorkerHalted } from './persist.js';
import { releaseDelayMs } from '../core/retry.js';
import type { ClaimedOperation, DispatchItem, DispatchStage, FinalCheck } from './types.js';
import { sampledTraceIdOf } from '../core/tracing.js';

/** Past the backoff, the wake-up that claims a released operation again waits this much more (the clocks differ). */
const RELEASE_WAKE_MARGIN_MS = 50;

export class Completer {
  readonly #ctx: DispatchContext;

  constructor(ctx: DispatchContext) {
    this.#ctx = ctx;
  }

  /**
   * A claim the normal path could not finish. Never sent and the failure transient (a full disk, a lost
   * connection, a timeout): released back to pending (`released:<code>`), to be claimed again. Possibly sent:
   * `unknown`, for the reconciler's readback (the provider may have the effect, so it is never released). Not
   * sent but unexpected (a bug): `needs_review` (`internal:<code>`; a reviewed retry is safe). Each write is
   * retried while the worker runs; if it cannot be made, the claim leaves the heartbeat listing and the
   * reconciler takes it.
   */
  async recover(op: ClaimedOperation, sent: boolean, err: unknown): Promise<void> {
    const { o } = this.#ctx;
    if (err instanceof WorkerHalted) throw err;
    if (!sent && isTransient(err)) return this.release(op, 'database', databaseErrorCode(err) ?? 'database_error', err);
    const code =
      sqlState(err) ?? (isActionLedgerError(err) ? err.code : isConnectionError(err) ? 'connection_lost' : 'error');
    o.log.error({ err, operation_id: op.operation_id, sent }, 'dispatch failed unexpectedly');
    const wrote = sent
      ? await this.#complete(
          op,
          'unknown',
          null,
          { internal_error: code },
          null,
          `provider_outcome_unknown:internal:${code}`,
          'maybe_called',
        )
      : await this.#complete(
          op,
          'needs_review',
          null,
          { stage: 'internal', code },
          `internal:${code}`,
          `predispatch_refused:internal:${code}`,
          'not_called',
        );
    o.metrics.outcomes.inc({
      tool: op.tool_name,
      provider: op.provider_id,
      outcome: wrote ? (sent ? 'unknown' : 'needs_review') : 'lost',
    });
    if (wrote) this.#observeOutcome(op, sent ? 'unknown' : 'needs_review');
  }

  /**
   * Gives a never-sent claim back to the queue (see {@link dispatcherQueries.operationRelease}), available again
   * after an exponential backoff with jitter, or, once the operation has been released as often as its tool's
   * release limit allows, sends it to review as a refusal at `stage` with `code` (the provider was not called,
   * so a reviewed retry is safe). `counted: false` (a kill switch that caught it before the send) neither counts
   * nor ends in review: the claim skips it while the switch is engaged.
   */
  async release(
    op: ClaimedOperation,
    stage: DispatchStage,
    code: string,
    err?: unknown,
    { counted = true }: { counted?: boolean } = {},
  ): Promise<void> {
    const { o, q } = this.#ctx;
    const limit = o.config.tools.get(op.tool_name)?.releaseLimit ?? o.config.dispatcher.releaseLimit;
    const releases = op.dispatch_releases ?? 0;
    if (counted && releases >= limit) {
      return this.refuse(op, stage, code as ErrorCode, err, { releases, release_limit: limit });
    }
    const sqlstate = sqlState(err) ?? null;
    const delay = counted ? releaseDelayMs(releases, o.config.dispatcher) : o.config.dispatcher.releaseBackoffInitialMs;
    const detail = {
      ...((isActionLedgerError(err) && err.details !== undefined ? err.details : {}) as Record<string, JsonValue>),
      stage,
      code,
      ...(sqlstate === null ? {} : { sqlstate }),
      sent: false,
      provider_called: false,
      attempt: op.attempt,
      claim_token: op.claim_token,
      releases: releases + (counted ? 1 : 0),
      release_limit: limit,
      available_in_ms: delay,
    };
    const n = await untilWritten(
      async () =>
        (
          await o.pool.query<{ n: number }>(q.operationRelease, [
            op.operation_id,
            op.claim_token,
            o.workerId,
            `released:${code}`,
            delay,
            JSON.stringify(detail),
            counted,
          ])
        ).rows[0]?.n ?? 0,
      this.#ctx.halt(),
      this.#ctx.writeFailures,
      { operation_id: op.operation_id, write: 'release' },
    );
    o.metrics.outcomes.inc({
      tool: op.tool_name,
      provider: op.provider_id,
      outcome: n === 1 ? 'released' : 'lost',
    });
    // Nothing announces the moment it can be claimed again: this worker claims then (or its poll does first).
    if (n === 1) setTimeout(() => this.#ctx.wake(), delay + RELEASE_WAKE_MARGIN_MS).unref();
    o.log.warn(
      {
        operation_id: op.operation_id,
        stage,
        code,
        sqlstate,
        released: n === 1,
        releases: detail.releases,
        delay_ms: delay,
      },
      'claim released, never sent; the provider was not called',
    );
  }

  /** Settles a sent operation of a dispatch batch: writes its outcome again unless the batch committed it. */
  async settleOutcome(item: DispatchItem, outcome: Outcome, committed: boolean): Promise<void> {
    const { o } = this.#ctx;
    const { op } = item;
    try {
      // The batch's write failed, or its COMMIT's fate is unknown: write again on another connection, fenced on
      // the claim (a no-op if it landed). If this throws, the row stays executing for the reconciler.
      if (!committed)
        await this.#complete(
          op,
          outcome.status,
          outcome.receipt,
          outcome.result,
          reviewReason(outcome),
          outcome.reason,
          providerContact(outcome),
        );
      o.metrics.outcomes.inc({
        tool: op.tool_name,
        provider: op.provider_id,
        outcome: outcome.status,
      });
      this.#observeOutcome(op, outcome.status);
      o.log.info(
        {
          operation_id: op.operation_id,
          tool: op.tool_name,
          tenant: op.tenant_id,
          outcome: outcome.status,
          code: outcome.code ?? undefined,
        },
        'dispatched',
      );
      o.crash.reach('after_outcome_commit');
      item.resolve();
    } catch (err) {
      item.reject(err);
    }
  }

  /**
   * A sent item whose connection failed before any byte reached the provider (`provider_unreachable`): released
   * to the queue, counted (a provider that stays unreachable sends it to review once the limit is reached).
   */
  async settleUnsent(item: DispatchItem, outcome: Outcome): Promise<void> {
    try {
      const err = new ActionLedgerError(
        'provider_unreachable',
        'the provider connection failed before any byte was sent',
        {
          details: outcome.result,
        },
      );
      await this.release(item.op, 'provider', 'provider_unreachable', err);
      item.resolve();
    } catch (e) {
      item.reject(e);
    }
  }

  /** An operation whose evidence the dispatch batch's evidence statement refused: its claim was lost, or review. */
  async settleEvidence(item: DispatchItem, refusal: ActionLedgerError): Promise<void> {
    try {
      if (refusal.code === 'claim_lost') this.lost(item.op, 'evidence');
      // A decision that aged past its window before its evidence was recorded (by the database clock) says
      // nothing against the operation: ask again later.
      else if (refusal.code === 'authorization_stale') await this.release(item.op, 'evidence', refusal.code, refusal);
      else await this.refuse(item.op, 'evidence', refusal.code, refusal);
      item.resolve();
    } catch (err) {
      item.reject(err);
    }
  }

  /** An operation that failed the final check: a refusal code, or none when its row must be re-read to say why. */
  async settleUnchecked(item: DispatchItem, check: Exclude<FinalCheck, 'go'> | undefined): Promise<void> {
    const { o, q } = this.#ctx;
    const { op } = item;
    try {
      if (check === undefined) {
        const { rows: now } = await o.pool.query<{ status: string; claim_token: string }>(q.operationSelectClaim, [
          op.operation_id,
        ]);
        if (now[0]?.status !== 'executing' || now[0]?.claim_token !== op.claim_token) {
          this.lost(op, 'final_check');
          item.resolve();
          return;
        }
      }
      const code = check ?? 'authorization_stale';
      // Caught before the send by a kill switch: back to the queue, where the claim leaves it while the switch
      // is engaged (as every operation it covers), uncounted. A decision that aged before the send: ask again.
      // A revoked role is a decision against it: review.
      if (code === 'tool_disabled') await this.release(op, 'final_check', code, undefined, { counted: false });
      else if (code === 'authorization_stale') await this.release(op, 'final_check', code);
      else await this.refuse(op, 'final_check', code);
      item.resolve();
    } catch (err) {
      item.reject(err);
    }
  }

  /**
   * A pre-dispatch refusal: `needs_review` with `<stage>:<code>`; the provider was not called. `extra` goes into
   * the result beside the error's details (a release limit reached: how many releases there were).
   */
  async refuse(
    op: ClaimedOperation,
    stage: DispatchStage,
    code: ErrorCode,
    err?: unknown,
    extra: Record<string, JsonValue> = {},
  ): Promise<void> {
    const { o } = this.#ctx;
    o.metrics.refusals.inc({ stage, code });
    const details = isActionLedgerError(err) && err.details !== undefined ? err.details : {};
    const wrote = await this.#complete(
      op,
      'needs_review',
      null,
      { stage, code, ...(details as Record<string, JsonValue>), ...extra },
      `${stage}:${code}`,
      `predispatch_refused:${stage}:${code}`,
      'not_called',
    );
    if (wrote) this.#observeOutcome(op, 'needs_review');
    o.log.warn(
      {
        operation_id: op.operation_id,
        tool: op.tool_name,
        tenant: op.tenant_id,
        stage,
        code,
        wrote,
      },
      'pre-dispatch refusal; provider not called',
    );
  }

  /** The attempt's enqueue-to-outcome time: its queue wait (database clock) plus this worker's time since the claim. */
  #observeOutcome(op: ClaimedOperation, outcome: string): void {
    const since = op.claimed_at_ms === undefined ? 0 : (performance.now() - op.claimed_at_ms) / 1000;
    this.#ctx.o.metrics.observeEnqueueToOutcome(
      { provider: op.provider_id, outcome },
      op.queued_s + since,
      sampledTraceIdOf(op.span),
    );
  }

  lost(op: ClaimedOperation, stage: DispatchStage): void {
    this.#ctx.o.log.warn({ operation_id: op.operation_id, stage }, 'claim lost; nothing sent by this worker');
  }

  /**
   * A fenced outcome write; returns whether it changed the row (false: the claim was no longer current). A
   * transient failure is retried for as long as the worker runs (dispatcher/persist.ts): the claim stays listed
   * in the heartbeat meanwhile. Throws a non-transient failure, or `WorkerHalted` once the worker has stopped.
   */
  async #complete(
    op: ClaimedOperation,
    status: Outcome['status'],
    receipt: string | null,
    result: Record<string, JsonValue>,
    review: string | null,
    reason: string,
    contact: ProviderContact,
  ): Promise<boolean> {
    const { o, q } = this.#ctx;
    const n = await untilWritten(
      async () =>
        (
          await o.pool.query<{ n: number }>(q.operationComplete, [
            op.operation_id,
            op.claim_token,
            status,
            receipt,
            JSON.stringify(result),
            review,
            o.workerId,
            reason,
            contact,
          ])
        ).rows[0]?.n ?? 0,
      this.#ctx.halt(),
      this.#ctx.writeFailures,
      { operation_id: op.operation_id, write: status },
    );
    return n === 1;
  }
}

/** The review reason an outcome records: its reason when it goes to review, else none. */
export function reviewReason(o: Outcome): string | null {
  return o.status === 'needs_review' ? o.reason : null;
}

/** Whether the request may have left: only a connection that failed before any byte was written says no. */
export function providerContact(o: Outcome): ProviderContact {
  return o.code === 'provider_unreachable' ? 'not_called' : 'maybe_called';
}
