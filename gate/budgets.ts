/**
 * The gate's budgets, all inside the caller's transaction (a later refusal rolls every one back):
 *
 *   rate  -> one call from the principal's window per tool (`rate_limited`, with `retry_after_s`)
 *   caps  -> one unit (and the value) on each configured cap: per principal per day, per account per day,
 *            per conversation (`limit_exceeded`), each by one conditional upsert
 *   holds -> what a proposal, approval or operation keeps of the caps until it ends (released or moved on)
 *
 * The rate and the caps are taken by a call's admission statement (gate/admission.ts); the holds of an
 * operation a call reserved are written with the gate's record of it (gate/reservation.ts). The rest is here.
 */
import type { Queryable } from '../db/index.js';
import type { Value } from './checks.js';
import type { gateQueries } from './queries.js';

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
