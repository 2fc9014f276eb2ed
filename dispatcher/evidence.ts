/**
 * The evidence of a dispatch batch's authorization decisions: the values of the statement that records them
 * (dispatcherQueries.evidenceRecordBatch, the first statement of a batch's opening, dispatcher/dispatch-batch.ts)
 * and the verdict on each operation from its reply. The statement judges each decision by the database clock
 * and records it only while the operation's claim, approval and policy version are current; its reply says which
 * rows it found, which it could lock and which evidence exists.
 */
import { ActionLedgerError, isActionLedgerError } from '../core/errors.js';
import { checkWindows, type DispatchProfile } from '../protocol/index.js';
import type { DispatchItem } from './types.js';

/** One row of the evidence statement's reply. */
export interface EvidenceRow {
  db_now: Date;
  operation_id: string;
  claim_token: string;
  locked: boolean;
  current_approval_id: string;
  current_policy_version: string;
  recorded: boolean;
}

/**
 * An operation's evidence: `recorded` (committed, inserted now or by an earlier try under the same claim),
 * `busy` (its row was held by another session: the statement skipped it, to be tried again in a later batch), or
 * the refusal: `claim_lost`, `authorization_stale`, or the window rule the decision broke.
 */
export type EvidenceVerdict = 'recorded' | 'busy' | ActionLedgerError;

/** The evidence statement's values for `items`: element i of each array is one decision. */
export function evidenceValues(items: readonly DispatchItem[], profile: DispatchProfile): unknown[] {
  return [
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
  ];
}

/** The verdict on `item` from its row of the statement's reply (none: its claim is no longer current). */
export function evidenceVerdict(
  row: EvidenceRow | undefined,
  item: DispatchItem,
  profile: DispatchProfile,
): EvidenceVerdict {
  const { op, decision: d } = item;
  if (row === undefined) return new ActionLedgerError('claim_lost', 'claim is no longer current');
  if (!row.locked) return 'busy';
  if (row.current_approval_id !== op.current_approval_id || row.current_policy_version !== op.current_policy_version)
    return new ActionLedgerError(
      'authorization_stale',
      'approval or policy version changed after the decision was requested',
    );
  // The statement applied the windows; this names the rule that failed. Either refusing is enough: a decision
  // the two disagree on is refused too (evidence recorded or not, nothing is sent).
  try {
    checkWindows(d.authorizedAt, d.expiresAt, row.db_now, profile);
  } catch (err) {
    if (!isActionLedgerError(err)) throw err;
    return err;
  }
  return row.recorded
    ? 'recorded'
    : new ActionLedgerError('authorization_stale', 'decision is outside the profile windows by the database clock');
}
