/**
 * The reconciler's, reviewers' and verifier's SQL. Every transition is the ledger's fenced transition
 * (ledger/transitions.ts): fenced on the state (and claim) it read, with its history row in the same
 * statement; `@schema.` is bound once at start (db/db.ts).
 */
import { releaseToQueueSql, transitionCte } from '../ledger/index.js';

/**
 * A claim is orphaned when its worker is unknown, stopped, or has not heartbeated for $1 ms; or when its worker
 * is alive but no longer lists the claim among those it holds, in a listing made at least $1 ms after the claim
 * (a claim made just before a heartbeat, not yet in its listing, is never taken). The age of a claim alone never
 * decides: only what its worker says, or its silence. The caller's writes stay fenced on the claim token.
 */
const ORPHANED = `(w.worker_id IS NULL OR w.stopped_at IS NOT NULL OR w.heartbeat_at < now() - make_interval(secs => $1::float8 / 1000)
      OR (w.claims_listed_at IS NOT NULL AND l.claimed_at < w.claims_listed_at - make_interval(secs => $1::float8 / 1000)
        AND NOT (l.claim_token = ANY (w.claim_tokens))))`;

export const reconcilerQueries = {
  /**
   * One pass at a time per schema, across fleets and CronJobs. The server releases the lock when the holding
   * connection closes: at once when the process dies, but for a host that vanished only once TCP keepalive
   * gives up (2 hours and more with the usual system defaults). The lock connection therefore sets its own
   * keepalives (idle 30 s, then 3 probes 10 s apart): a vanished pass frees the lock within about 60 s. The
   * settings are ignored on Unix-socket connections, whose peer cannot vanish without the server seeing it,
   * and stay on the pooled connection afterwards, where they only make a dead peer noticed sooner.
   */
  passLock: `
    SELECT set_config('tcp_keepalives_idle', '30', false), set_config('tcp_keepalives_interval', '10', false),
           set_config('tcp_keepalives_count', '3', false), pg_try_advisory_lock(hashtext($1)) AS locked`,
  passUnlock: `SELECT pg_advisory_unlock(hashtext($1))`,

  /**
   * Due `unknown` operations and orphaned `executing` ones (see ORPHANED: a dead or stopped worker's claims, and
   * claims a live worker no longer lists); $1 orphan threshold (ms), $2 limit.
   */
  candidates: `
    (SELECT l.operation_id, l.status, l.claim_token
     FROM @schema.operations l
     WHERE l.attention = 'unknown' AND l.status = 'unknown'
       AND (l.next_reconcile_at IS NULL OR l.next_reconcile_at <= now())
     ORDER BY l.next_reconcile_at NULLS FIRST
     LIMIT $2)
    UNION ALL
    (SELECT l.operation_id, l.status, l.claim_token
     FROM @schema.operation_claims c
     JOIN @schema.operations l ON l.operation_id = c.operation_id
     LEFT JOIN @schema.workers w ON w.worker_id = l.claimed_by
     WHERE l.status = 'executing' AND ${ORPHANED}
     ORDER BY l.updated_at
     LIMIT $2)`,

  /**
   * Whether a pass has work now: an orphaned `executing` claim (see ORPHANED; $1 the orphan threshold, ms), or an
   * `unknown` operation whose next check is due. The orphan watch's check.
   */
  orphansWaiting: `
    SELECT EXISTS (
      SELECT 1 FROM @schema.operation_claims c
      JOIN @schema.operations l ON l.operation_id = c.operation_id
      LEFT JOIN @schema.workers w ON w.worker_id = l.claimed_by
      WHERE l.status = 'executing' AND ${ORPHANED})
    OR EXISTS (
      SELECT 1 FROM @schema.operations l
      WHERE l.attention = 'unknown' AND l.status = 'unknown'
        AND (l.next_reconcile_at IS NULL OR l.next_reconcile_at <= now())) AS found`,

  /**
   * Marks worker $1 stopped (its process exited: the fleet's parent saw it), so the claims it held are orphaned at
   * once rather than once its heartbeat lapses. By id, never by host and pid: two containers with one host name
   * can each run a worker with the same pid. A worker already marked keeps its time.
   */
  workerExited: `UPDATE @schema.workers SET stopped_at = now() WHERE worker_id = $1 AND stopped_at IS NULL`,

  /**
   * Locks one candidate if it is still what the pass saw and still eligible (ORPHANED read again, under the
   * lock, against the worker's latest heartbeat and listing), skipping a row someone holds (a dispatcher inside
   * its provider call, another pass). $1 orphan threshold, $2 id, $3 status, $4 claim.
   */
  lockCandidate: `
    SELECT l.operation_id, l.status, l.claim_token, l.claimed_by, l.attempt, l.effect_key, l.tool_name,
           l.provider_id, l.tenant_id, l.canonical_args_sha256, l.reconcile_attempts, l.result_json,
           l.dispatch_releases, l.trace_context
    FROM @schema.operations l
    LEFT JOIN @schema.workers w ON w.worker_id = l.claimed_by
    WHERE l.operation_id = $2 AND l.status = $3 AND l.claim_token IS NOT DISTINCT FROM $4::uuid
      AND ((l.status = 'unknown' AND (l.next_reconcile_at IS NULL OR l.next_reconcile_at <= now()))
        OR (l.status = 'executing' AND ${ORPHANED}))
    FOR UPDATE OF l SKIP LOCKED`,

  /**
   * After an unexpected error: push the next check of an `unknown` row back (no state change, no history),
   * so one bad row cannot monopolise the head of every pass. Orphaned `executing` rows have no schedule;
   * they are retried on the next pass.
   */
  deferAfterError: `
    UPDATE @schema.operations
    SET next_reconcile_at = now() + make_interval(secs => $4::float8 / 1000)
    WHERE operation_id = $1 AND status = $2 AND status = 'unknown' AND claim_token IS NOT DISTINCT FROM $3::uuid`,

  /**
   * Whether the worker that held claim $2 of operation $1 recorded its evidence. The dispatcher sends a request
   * only after its evidence under the claim has committed, and the evidence statement locks the operation row
   * (SKIP LOCKED), as the reconciler does before asking: under the reconciler's lock, no evidence means no request
   * of that claim ever left, and none can any more (the evidence, the dispatch batch's row locks and every
   * outcome are fenced on the claim this pass is about to end).
   */
  evidenceExists: `
    SELECT EXISTS (SELECT 1 FROM @schema.authorization_evidence WHERE operation_id = $1 AND claim_token = $2) AS found`,

  /**
   * An orphaned claim that never sent anything, back to the queue (ledger/transitions.ts `releaseToQueueSql`):
   * $1 id, $2 claim, $3 actor, $4 reason (`released:worker_lost`), $5 wait (ms), $6 detail, $7 counted.
   */
  orphanRelease: releaseToQueueSql(),

  checkInsert: `
    INSERT INTO @schema.reconciliation_checks (operation_id, attempt, from_status, outcome, actor, detail)
    VALUES ($1, $2, $3, $4, $5, $6::jsonb)`,

  checksFor: `
    SELECT attempt, from_status, outcome, at, actor, detail
    FROM @schema.reconciliation_checks WHERE operation_id = $1 ORDER BY id`,

  /**
   * A reconciled end: succeeded with the provider's receipt, or needs_review with a reason. Fenced on the
   * status and claim read under the lock. $1 id, $2 from, $3 claim, $4 to, $5 receipt, $6 review reason,
   * $7 actor, $8 history reason, $9 detail, $10 provider contact learned (`no_effect_confirmed`, or NULL).
   */
  resolve: `
    WITH ${transitionCte({
      name: 'done',
      input: '(SELECT $1::uuid AS operation_id) i',
      from: '$2::text',
      to: '$4::text',
      fence: 'l.claim_token IS NOT DISTINCT FROM $3::uuid',
      set: 'provider_receipt = coalesce($5, provider_receipt), review_reason = $6, next_reconcile_at = NULL',
      contact: '$10::text',
      actor: '$7',
      reason: '$8',
      detail: '$9::jsonb',
    })}
    SELECT count(*)::int AS n FROM done`,

  /**
   * An inconclusive check: stays (or becomes) `unknown`, the next check after $4 ms. The history gains a row
   * only when the state changes (orphaned executing -> unknown); every check is in reconciliation_checks.
   */
  backoff: `
    WITH ${transitionCte({
      name: 'done',
      input: '(SELECT $1::uuid AS operation_id) i',
      from: '$2::text',
      to: "'unknown'",
      fence: 'l.claim_token IS NOT DISTINCT FROM $3::uuid',
      set: `reconcile_attempts = reconcile_attempts + $8::int,
          next_reconcile_at = now() + make_interval(secs => $4::float8 / 1000)`,
      actor: '$5',
      reason: '$6',
      detail: '$7::jsonb',
      historyWhen: "from_status <> 'unknown'",
    })}
    SELECT count(*)::int AS n FROM done`,

  /**
   * How long (ms; 0 or less: no longer) a request operation $1 sent may still be inside the provider: $2 ms (twice
   * the provider timeout and a margin) after it entered `unknown`, or from now while it is still `executing` (its
   * worker dead, so any request of it left before the row lock this pass holds was released). A history row is
   * stamped with its transaction's start: for the dispatcher's outcome, the dispatch batch's BEGIN, just before
   * the send.
   */
  inFlightLeft: `
    SELECT extract(epoch FROM coalesce(
             (SELECT max(h.at) FROM @schema.operation_history h
              WHERE h.operation_id = l.operation_id AND h.to_status = 'unknown' AND l.status = 'unknown'),
             now()) + make_interval(secs => $2::float8 / 1000) - now())::float8 * 1000 AS left_ms
    FROM @schema.operations l WHERE l.operation_id = $1`,
} as const;

export const reviewQueries = {
  /**
   * Operations in review, oldest entry into review first, with the total that matched before the limit. The
   * entry is the latest history row into needs_review (the row's updated_at when its history has none). $1
   * reason, exact or (with $2) a prefix; $3 tool; $4 tenant; $5 minimum seconds in review; $6 limit (NULL: all).
   */
  list: `
    SELECT o.operation_id, o.tenant_id, o.tool_name, o.review_reason, o.provider_contact, o.attempt,
           o.reconcile_attempts, e.entered_at, extract(epoch FROM now() - e.entered_at)::float8 AS age_s,
           count(*) OVER ()::int AS total
    FROM @schema.operations o
    CROSS JOIN LATERAL (
      SELECT coalesce(
        (SELECT max(h.at) FROM @schema.operation_history h
         WHERE h.operation_id = o.operation_id AND h.to_status = 'needs_review'),
        o.updated_at) AS entered_at) e
    WHERE o.attention = 'needs_review' AND o.status = 'needs_review'
      AND ($1::text IS NULL OR o.review_reason = $1 OR ($2::boolean AND left(o.review_reason, length($1)) = $1))
      AND ($3::text IS NULL OR o.tool_name = $3)
      AND ($4::text IS NULL OR o.tenant_id = $4)
      AND ($5::float8 IS NULL OR e.entered_at <= now() - make_interval(secs => $5::float8))
    ORDER BY e.entered_at, o.operation_id
    LIMIT $6::int`,

  /** Whether operation $1 belongs to tenant $2 (a tenant never changes, so no lock is needed). */
  inTenant: `SELECT 1 FROM @schema.operations WHERE operation_id = $1 AND tenant_id = $2`,

  lock: `
    SELECT operation_id, status, review_reason, provider_contact, attempt, tool_name, tenant_id, principal_id, task_id,
           workflow_step_id, provider_receipt, trace_context
    FROM @schema.operations WHERE operation_id = $1 FOR UPDATE`,

  /**
   * needs_review -> pending: a new dispatch attempt for the same operation and effect key, fenced on the review
   * reason read under the lock, with its history row ($5 actor, $6 detail, the new attempt added).
   */
  retry: `
    WITH ${transitionCte({
      name: 'done',
      input: '(SELECT $1::uuid AS operation_id) i',
      from: "'needs_review'",
      to: "'pending'",
      fence: 'l.review_reason = $2',
      set: `attempt = attempt + 1, claim_token = NULL, claimed_by = NULL, claimed_at = NULL,
          review_reason = NULL, reconcile_attempts = 0, next_reconcile_at = NULL, dispatch_releases = 0,
          current_approval_id = coalesce($3, current_approval_id),
          current_policy_version = coalesce($4, current_policy_version)`,
      actor: '$5',
      reason: "'review:retry'",
      detail: "$6::jsonb || jsonb_build_object('attempt', l.attempt)",
      returning: 'l.attempt',
    })}
    SELECT attempt FROM done`,
  outboxInsert: `INSERT INTO @schema.outbox (operation_id, attempt) VALUES ($1, $2)`,

  /** Any reviewed move, fenced on the state read under the lock; $1 id, $2 from, $3 to, $4 receipt, $5 review reason, $6 actor, $7 history reason, $8 detail. */
  move: `
    WITH ${transitionCte({
      name: 'done',
      input: '(SELECT $1::uuid AS operation_id) i',
      from: '$2::text',
      to: '$3::text',
      fence: 'TRUE',
      set: 'provider_receipt = coalesce($4, provider_receipt), review_reason = $5, next_reconcile_at = NULL',
      actor: '$6',
      reason: '$7',
      detail: '$8::jsonb',
    })}
    SELECT operation_id FROM done`,
} as const;
