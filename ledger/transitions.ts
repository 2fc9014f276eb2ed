/**
 * The operation state machine, owned by the ledger: the legal transitions, and the one statement shape every
 * component moves an operation with.
 *
 * {@link transitionCte} is the only way an operation's status changes after its reservation. It writes a
 * data-modifying CTE: one `UPDATE ... RETURNING`, fenced on the status the caller expects (and whatever else
 * the caller checks: claim token, review reason), feeding one `INSERT INTO operation_history`. The history row
 * cannot be forgotten and cannot describe a move that did not happen. The input is a row source, so one
 * statement moves a batch (`unnest` of arrays) as cheaply as one operation.
 *
 * The database holds the same table (`operation_transitions`, migration 0007) and refuses, with SQLSTATE
 * `P0T01` (`illegal_transition`), any status change that is not in it; a test keeps the two equal.
 *
 * The returned text is fixed at module load: callers build it once into their `queries.ts` constants, with
 * `$n` parameters for every value. Nothing here is interpolated per call.
 */
import type { OperationStatus } from '../core/types.js';

/** One legal move. `null` is the reservation itself. */
export interface LegalTransition {
  from: OperationStatus | null;
  to: OperationStatus;
  /** When set, the move is legal only with a history reason starting with this text. */
  reasonPrefix?: string;
}

/**
 * The legal transitions. A `pending -> pending` row records a refreshed approval or policy version, not a
 * state change. `executing -> pending` is a dispatcher's release of a claim whose request it never sent, and
 * is legal only with a `released:` reason.
 */
export const LEGAL_TRANSITIONS: readonly LegalTransition[] = Object.freeze([
  { from: null, to: 'pending' },
  { from: 'pending', to: 'pending' },
  { from: 'pending', to: 'executing' },
  { from: 'executing', to: 'succeeded' },
  { from: 'executing', to: 'unknown' },
  { from: 'executing', to: 'needs_review' },
  { from: 'executing', to: 'failed' },
  { from: 'executing', to: 'pending', reasonPrefix: 'released:' },
  { from: 'unknown', to: 'succeeded' },
  { from: 'unknown', to: 'needs_review' },
  { from: 'needs_review', to: 'pending' },
  { from: 'needs_review', to: 'succeeded' },
  { from: 'needs_review', to: 'failed' },
  { from: 'needs_review', to: 'compensating' },
  { from: 'succeeded', to: 'compensating' },
  { from: 'compensating', to: 'compensated' },
  { from: 'compensating', to: 'needs_review' },
] satisfies LegalTransition[]);

/** Whether a history row's move is legal; a row without its reason fails every move that needs one. */
export function isLegalTransition(from: OperationStatus | null, to: OperationStatus, reason?: string): boolean {
  return LEGAL_TRANSITIONS.some(
    (t) =>
      t.from === from &&
      t.to === to &&
      (t.reasonPrefix === undefined || (reason !== undefined && reason.startsWith(t.reasonPrefix))),
  );
}

/**
 * Whether the provider may have been called for an operation, a typed fact on the operation row
 * (`operations.provider_contact`), never inferred from reason text:
 *
 * - `not_called`: no request of the current attempt has left. Set by the reservation, a release, a reviewed
 *   retry, and by the worker holding the claim when it refuses before its send (or the connection failed
 *   before any byte of the request was written).
 * - `maybe_called`: a request may have left. Set by the claim, the statement that hands the operation to a
 *   worker: the send itself happens inside a transaction a crash can undo, so a mark written next to it could
 *   vanish while the request did not. The database also sets it on every move into `executing`, `succeeded`,
 *   `unknown`, `compensating` and `compensated`.
 * - `no_effect_confirmed`: the provider's readback by effect key says it holds no effect for the operation.
 */
export type ProviderContact = 'not_called' | 'maybe_called' | 'no_effect_confirmed';

/** The contact values that prove a new attempt with the same effect key cannot apply the effect twice. */
export function providerHasNoEffect(contact: ProviderContact | null | undefined): boolean {
  return contact === 'not_called' || contact === 'no_effect_confirmed';
}

/**
 * One fenced transition, as CTE text to embed after `WITH`. The target row is `l` (`@schema.operations`),
 * the input row `i`. Every part is SQL text with `$n` parameters, fixed when the caller's queries are built.
 */
export interface TransitionSpec {
  /** The CTE's name; its rows are what `returning` lists (`l.operation_id` always). */
  name: string;
  /** A row source aliased `i` with an `operation_id` column: `unnest($1::uuid[], ...) AS i(operation_id, ...)`. */
  input: string;
  /** The status the caller expects (SQL): the fence every transition has. */
  from: string;
  /** The status it moves to (SQL; may read `i`). */
  to: string;
  /**
   * Further fences (SQL conditions on `l` and `i`): the claim token, the review reason read. `'TRUE'` only for a
   * caller that holds the row lock and has read the state under it.
   */
  fence: string;
  /** Other columns the move sets (`col = expr, ...`), or empty. `status`, `updated_at` are set here. */
  set?: string;
  /** What the caller knows about the provider contact (SQL, may be NULL); see {@link ProviderContact}. */
  contact?: string;
  actor: string;
  reason: string;
  /** The history row's detail (SQL yielding jsonb; may read `l` after the update and `i`). */
  detail: string;
  /** More columns for the CTE's rows (`l.x, i.y`). */
  returning?: string;
  /** Writes the history row only when this holds (SQL over the CTE's columns `from_status`, `to_status`). */
  historyWhen?: string;
}

/**
 * The CTE pair for one fenced transition: `<name>` (the moved rows) and `<name>_history` (their history
 * rows, inserted by the same statement). Embed it after `WITH` and select from `<name>`.
 */
export function transitionCte(s: TransitionSpec): string {
  const set = s.set === undefined || s.set.trim() === '' ? '' : `${s.set}, `;
  return `${s.name} AS (
      UPDATE @schema.operations l
      SET status = ${s.to}, ${set}provider_contact = coalesce(${s.contact ?? 'NULL'}, l.provider_contact), updated_at = now()
      FROM ${s.input}
      WHERE l.operation_id = i.operation_id AND l.status = ${s.from} AND (${s.fence})
      RETURNING l.operation_id, (${s.from})::text AS from_status, l.status AS to_status, (${s.actor})::text AS history_actor,
                (${s.reason})::text AS history_reason, (${s.detail})::jsonb AS history_detail${s.returning === undefined ? '' : `, ${s.returning}`}
    ), ${s.name}_history AS (
      INSERT INTO @schema.operation_history (operation_id, from_status, to_status, actor, reason, detail)
      SELECT operation_id, from_status, to_status, history_actor, history_reason, history_detail FROM ${s.name}
      ${s.historyWhen === undefined ? '' : `WHERE ${s.historyWhen}`}
    )`;
}

/**
 * The one statement that gives a claim never sent back to the queue (the dispatcher's release, and the
 * reconciler's of an orphaned claim with no evidence): executing -> pending under the same attempt and effect
 * key, fenced on the claim, the outbox row re-inserted available after a wait, the history row with its reason
 * (which must start `released:`, see LEGAL_TRANSITIONS). Parameters: $1 operation id, $2 claim token, $3 actor,
 * $4 reason, $5 wait in ms, $6 detail (jsonb), $7 whether it counts towards the operation's release limit
 * (`dispatch_releases`). Returns `n`, 1 when it moved the row. `@schema.` is bound by the caller.
 */
export function releaseToQueueSql(): string {
  return `
    WITH ${transitionCte({
      name: 'released',
      input: '(SELECT $1::uuid AS operation_id) i',
      from: "'executing'",
      to: "'pending'",
      fence: 'l.claim_token = $2',
      set: `claim_token = NULL, claimed_by = NULL, claimed_at = NULL,
          dispatch_releases = l.dispatch_releases + CASE WHEN $7::boolean THEN 1 ELSE 0 END`,
      contact: "'not_called'",
      actor: '$3',
      reason: '$4',
      detail: '$6::jsonb',
      returning: 'l.attempt',
    })}, queued AS (
      INSERT INTO @schema.outbox (operation_id, attempt, available_at)
      SELECT operation_id, attempt, now() + make_interval(secs => $5::float8 / 1000) FROM released
      ON CONFLICT (operation_id, attempt) DO UPDATE SET available_at = excluded.available_at
    )
    SELECT count(*)::int AS n FROM released`;
}
