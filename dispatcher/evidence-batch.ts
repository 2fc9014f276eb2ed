/**
 * The evidence batch: records the authorization decisions of many claimed operations in one statement, each
 * judged by the database clock and only while its claim is current.
 *
 * States of one item:
 *   queued    - waiting while the batcher's openings are busy (two statements in flight, one when most of the
 *               worker's slots are taken; dispatcher/batcher.ts)
 *   recording - in the batch statement; the whole statement is retried on a lost connection or a conflict
 *               (`BATCH_RETRY_POLICY`: the insert is idempotent per claim, so one that landed without its reply
 *               is harmless to repeat)
 *   busy      - its row was held by another session: queued again after a short wait (`retryBusy`)
 *   settled   - resolved (evidence recorded), or rejected: `claim_lost`, a refusal (`authorization_stale`, a
 *               window rule), or the statement's failure (a transient one then releases its claim: nothing was sent)
 */
import { ActionLedgerError, isActionLedgerError } from '../core/errors.js';
import { retry } from '../core/retry.js';
import { checkWindows, type AuthorizationDecision } from './authorize.js';
import { Batcher, batchRetryPolicy, retryBusy, submit } from './batcher.js';
import type { DispatchContext } from './context.js';
import type { ClaimedOperation, EvidenceItem } from './types.js';

export class EvidenceBatch {
  readonly #ctx: DispatchContext;
  readonly #batcher: Batcher<EvidenceItem>;

  constructor(ctx: DispatchContext) {
    this.#ctx = ctx;
    this.#batcher = new Batcher(ctx.o.batchSize, (items) => this.#record(items), ctx.openings);
  }

  /**
   * Records `decision` for `op` in the next batch. Rejects with `claim_lost`, another coded refusal, or the
   * batch's database failure.
   */
  record(op: ClaimedOperation, decision: AuthorizationDecision): Promise<void> {
    return submit(this.#batcher, { op, decision });
  }

  /** Opens a batch of what waits if the openings allowed grew (a slot of the worker freed). */
  poke(): void {
    this.#batcher.poke();
  }

  async #record(items: EvidenceItem[]): Promise<void> {
    this.#ctx.o.metrics.batchOperations.observe({ stage: 'evidence' }, items.length);
    const { refused, busy } = await retry(() => this.#recordOnce(items), batchRetryPolicy(this.#ctx.halt()));
    for (const item of items) {
      const err = refused.get(item);
      if (busy.has(item)) retryBusy(this.#batcher, item, this.#ctx.halt());
      else if (err === undefined) item.resolve();
      else item.reject(err);
    }
  }

  async #recordOnce(
    items: EvidenceItem[],
  ): Promise<{ refused: Map<EvidenceItem, ActionLedgerError>; busy: Set<EvidenceItem> }> {
    const { o, prepared } = this.#ctx;
    const { profile } = o;
    const { rows } = await o.pool.query<{
      db_now: Date;
      operation_id: string;
      locked: boolean;
      current_approval_id: string;
      current_policy_version: string;
      recorded: boolean;
    }>({
      ...prepared.evidenceRecordBatch,
      values: [
        items.map((i) => i.op.operation_id),
        items.map((i) => i.op.claim_token),
        items.map((i) => i.op.attempt),
        items.map((i) => i.op.current_approval_id),
        items.map((i) => i.op.current_policy_version),
        items.map((i) => i.op.canonical_args_sha256),
        items.map((i) => i.decision.decisionSha256),
        items.map((i) => i.decision.authorizedAt.toISOString()),
        items.map((i) => i.decision.expiresAt.toISOString()),
        profile.maximumAuthorizationTtlMs,
        profile.maximumAuthorizationAgeMs,
        profile.maximumClockSkewMs,
      ],
    });
    const current = new Map(rows.map((r) => [r.operation_id, r]));
    const refused = new Map<EvidenceItem, ActionLedgerError>();
    const busy = new Set<EvidenceItem>();
    for (const item of items) {
      const { op, decision: d } = item;
      const row = current.get(op.operation_id);
      if (row === undefined) {
        refused.set(item, new ActionLedgerError('claim_lost', 'claim is no longer current'));
      } else if (!row.locked) {
        busy.add(item);
      } else if (
        row.current_approval_id !== op.current_approval_id ||
        row.current_policy_version !== op.current_policy_version
      ) {
        refused.set(
          item,
          new ActionLedgerError(
            'authorization_stale',
            'approval or policy version changed after the decision was requested',
          ),
        );
      } else {
        // The statement applied the windows; this names the rule that failed. Either refusing is enough: a
        // decision the two disagree on is refused too (evidence recorded or not, nothing is sent).
        try {
          checkWindows(d.authorizedAt, d.expiresAt, row.db_now, profile);
          if (!row.recorded)
            refused.set(
              item,
              new ActionLedgerError(
                'authorization_stale',
                'decision is outside the profile windows by the database clock',
              ),
            );
        } catch (err) {
          if (!isActionLedgerError(err)) throw err;
          refused.set(item, err);
        }
      }
    }
    return { refused, busy };
  }
}
