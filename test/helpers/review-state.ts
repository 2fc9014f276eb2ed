/**
 * Puts an operation where a dispatcher (or the reconciler) would leave it, through the ledger's own fenced
 * transitions: claimed by a test worker, its outbox row gone, then out of `executing` to review (or to `unknown`,
 * due in an hour), with the review reason and provider contact given. For tests of what reads or acts on review.
 */
import { bindQueries, type Pool } from '../../db/index.js';
import { transitionCte, type ProviderContact } from '../../ledger/index.js';

const Q = {
  claim: `WITH ${transitionCte({
    name: 'done',
    input: '(SELECT $1::uuid AS operation_id) i',
    from: "'pending'",
    to: "'executing'",
    fence: 'TRUE',
    set: "claim_token = gen_random_uuid(), claimed_by = 'worker-test', claimed_at = now()",
    actor: "'worker-test'",
    reason: "'claimed'",
    detail: "'{}'::jsonb",
  })} SELECT count(*)::int AS n FROM done`,
  outboxDone: `DELETE FROM @schema.outbox WHERE operation_id = $1`,
  /** executing -> $2 with review reason $3 (null for unknown), contact $4; $5 false: the caller dates the history. */
  out: `WITH ${transitionCte({
    name: 'done',
    input: '(SELECT $1::uuid AS operation_id) i',
    from: "'executing'",
    to: '$2::text',
    fence: 'TRUE',
    set: `review_reason = $3, claim_token = NULL,
      next_reconcile_at = CASE WHEN $2::text = 'unknown' THEN now() + interval '1 hour' ELSE next_reconcile_at END`,
    contact: '$4::text',
    actor: "'worker-test'",
    reason: "coalesce($3, 'provider_outcome_unknown:timeout')",
    detail: "'{}'::jsonb",
    historyWhen: '$5::boolean',
  })} SELECT count(*)::int AS n FROM done`,
  datedHistory: `INSERT INTO @schema.operation_history (operation_id, from_status, to_status, at, actor, reason)
    VALUES ($1, 'executing', $2, now() - make_interval(secs => $3::float8), 'worker-test', $4)`,
} as const;

export interface PutOut {
  /** Default `needs_review`. */
  to?: 'needs_review' | 'unknown';
  /** The review reason; default `final_check:tool_disabled` (none for `unknown`). */
  reason?: string | null;
  /** Default `not_called`. */
  contact?: ProviderContact;
  /** Its history row dated this many seconds back. */
  agoS?: number;
}

/** Moves pending operation `id` out as `put` says; throws when any step found it elsewhere. */
export async function putOut(
  db: { pool: Pool; config: { schemaQuoted: string } },
  id: string,
  put: PutOut = {},
): Promise<void> {
  const q = bindQueries(Q, db.config.schemaQuoted);
  const to = put.to ?? 'needs_review';
  const reason = put.reason === undefined ? (to === 'unknown' ? null : 'final_check:tool_disabled') : put.reason;
  const claimed = await db.pool.query<{ n: number }>(q.claim, [id]);
  if (claimed.rows[0]?.n !== 1) throw new Error(`claim of ${id} missed`);
  await db.pool.query(q.outboxDone, [id]);
  const moved = await db.pool.query<{ n: number }>(q.out, [
    id,
    to,
    reason,
    put.contact ?? 'not_called',
    put.agoS === undefined,
  ]);
  if (moved.rows[0]?.n !== 1) throw new Error(`move of ${id} to ${to} missed`);
  if (put.agoS !== undefined)
    await db.pool.query(q.datedHistory, [id, to, put.agoS, reason ?? 'provider_outcome_unknown:timeout']);
}
