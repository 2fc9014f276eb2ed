/**
 * The gate's budgets, all taken inside the caller's transaction (a later refusal rolls every one back):
 *
 *   rate  -> one call from the principal's window per tool (`rate_limited`, with `retry_after_s`)
 *   caps  -> one unit (and the value) on each configured cap: per principal per day, per account per day,
 *            per conversation (`limit_exceeded`), each by one conditional upsert
 *   holds -> what a proposal, approval or operation keeps of the caps until it ends (released or moved on)
 */
import type { GateTool } from '../config/index.js';
import type { Queryable } from '../db/index.js';
import type { Value } from './checks.js';
import type { gateQueries } from './queries.js';
import { refuse } from './refusal.js';
import type { GateContext } from './types.js';

/** What holds a share of the caps: a proposal, an approval or an operation. */
export interface HoldSubject {
  proposal?: string;
  approval?: string;
  operation?: string;
}

export class Budgets {
  readonly #q: Readonly<typeof gateQueries>;

  constructor(q: Readonly<typeof gateQueries>) {
    this.#q = q;
  }

  /** Takes one call from the principal's window; throws `rate_limited` with `retry_after_s` when spent. */
  async takeRate(db: Queryable, tool: GateTool, ctx: GateContext): Promise<void> {
    if (tool.rate === null) return;
    const { rows } = await db.query(this.#q.rateWindowIncrement, [
      ctx.tenant_id,
      ctx.principal_id,
      tool.name,
      tool.rate.windowS,
      tool.rate.limit,
    ]);
    if (rows.length > 0) return;
    const after = await db.query<{ retry_after_s: number }>(this.#q.rateWindowRetryAfter, [tool.rate.windowS]);
    const retry = after.rows[0]?.retry_after_s ?? tool.rate.windowS;
    throw refuse(
      'rate_limited',
      `rate limit of ${tool.rate.limit} calls per ${tool.rate.windowS} s reached for ${tool.name}; try again in ${retry} s`,
      {
        retry_after_s: retry,
        details: { limit: tool.rate.limit, window_s: tool.rate.windowS },
      },
    );
  }

  /**
   * Reserves one unit (and the value) on every configured cap, each by one conditional upsert; throws
   * `limit_exceeded` naming the cap. Inside the caller's transaction: a later refusal rolls all of it back.
   * Returns the counters taken from.
   */
  async reserveCaps(db: Queryable, tool: GateTool, ctx: GateContext, value: Value | null): Promise<string[]> {
    const caps: [string, string, { maxCount: number | null; maxValue: number | null } | null][] = [
      ['principal_day', ctx.principal_id, tool.limits.perPrincipalDay],
      ['account_day', ctx.account_id, tool.limits.perAccountDay],
      ['conversation', ctx.conversation_id, tool.limits.perConversation],
    ];
    const ids: string[] = [];
    for (const [scope, key, cap] of caps) {
      if (cap === null) continue;
      const { rows } = await db.query<{ counter_id: string }>(this.#q.counterReserve, [
        ctx.tenant_id,
        tool.name,
        scope,
        key,
        // One counter per cap, whatever the call's currency: the caps' currency, or '-' for a count-only tool.
        tool.value?.limitsCurrency ?? '-',
        value?.amount ?? '0',
        cap.maxCount,
        value === null ? null : cap.maxValue === null ? null : String(cap.maxValue),
      ]);
      const row = rows[0];
      if (row === undefined) {
        throw refuse('limit_exceeded', `the ${scope.replace('_', ' per ')} cap for ${tool.name} would be exceeded`, {
          details: {
            scope,
            max_count: cap.maxCount,
            max_value: cap.maxValue,
            currency: tool.value?.limitsCurrency ?? null,
          },
        });
      }
      ids.push(row.counter_id);
    }
    return ids;
  }

  /** Records that `subject` holds one unit (and the value) of each counter. */
  async hold(db: Queryable, counters: string[], value: Value | null, subject: HoldSubject): Promise<void> {
    if (counters.length === 0) return;
    await db.query(this.#q.holdInsert, [
      counters,
      value?.amount ?? '0',
      subject.proposal ?? null,
      subject.approval ?? null,
      subject.operation ?? null,
    ]);
  }

  /** Moves a proposal's or approval's holds to the operation it became. */
  async transferHolds(
    db: Queryable,
    subject: { proposal?: string; approval?: string },
    operation: string,
  ): Promise<void> {
    await db.query(this.#q.holdTransfer, [subject.proposal ?? null, subject.approval ?? null, operation]);
  }

  /** Releases a proposal's or approval's holds, with the reason. */
  async releaseHolds(db: Queryable, subject: { proposal?: string; approval?: string }, reason: string): Promise<void> {
    await db.query(this.#q.holdRelease, [
      subject.approval !== undefined ? 'approval' : 'proposal',
      subject.approval ?? subject.proposal,
      reason,
    ]);
  }

  /** Gives back what a call took from its counters (one unit and the value each), held by nobody. */
  async giveBack(db: Queryable, counters: string[], value: Value | null): Promise<void> {
    if (counters.length === 0) return;
    await db.query(this.#q.counterGiveBack, [counters, value?.amount ?? '0']);
  }
}
