/**
 * The dispatcher's SQL. Every write is fenced on the state and claim token it expects, and every status change
 * is the ledger's fenced transition (ledger/transitions.ts) with its history row in the same statement;
 * `@schema.` is bound once at start (db/db.ts).
 */
import { releaseToQueueSql, transitionCte } from '../ledger/index.js';

export const dispatcherQueries = {
  // The batch statements below find their operations by primary key (`operation_id = ANY($1)`) and then test the
  // status. No index of the operations table names the status (sql/0018_hot_ledger_row.sql), so the planner has
  // no status index to prefer to the primary key.

  /**
   * Claims up to $1 waiting operations for worker $2 in one statement: lock outbox and ledger rows (skipping
   * rows another worker holds), delete the outbox rows, mark the operations `executing` with a fresh claim
   * token, and append the history. Operations of a tenant or tool under a gate kill switch stay pending, their
   * outbox rows untouched, until the switch is lifted.
   *
   * The queue is walked through outbox_available_idx and each operation found by key; no index of the operations
   * table names the status, so even a generic plan built over an empty ledger (a worker's first claim on a new
   * deployment) has no open-operations index to read instead (test/dispatcher/claim-session.test.ts).
   *
   * The kill-switch test is written as `(no switch at all OR none for this row)`, not as the plain NOT EXISTS:
   * PostgreSQL turns that into an anti-join estimated to leave one row (the switch table is empty and never
   * analyzed, or holds a switch for another tenant), and then reads and sorts the whole queue instead of the
   * first rows of outbox_available_idx: 300-600 ms against 2.4-3.5 ms at 100,000 queued (`npm run bench`). Under the
   * OR it stays a filter, and the uncorrelated test runs once per statement.
   *
   * `more_waiting` (the same on every row) says whether the statement's snapshot held more available outbox rows
   * than its limit, counted without regard to locks, kill switches or status, so never fewer than remain
   * claimable: a claim that filled its limit and saw no more needs no claim after it until a wake-up (a
   * reservation committed after the snapshot sends one), and a worker whose every claim fills its limit (one
   * slot) does not send an empty claim after each operation. What becomes claimable by time alone (a released
   * claim's row, available after its backoff) sends no wake-up: `next_in_ms` is how long until the earliest such
   * row is available (NULL for none; a row parked at 'infinity' is left out, as PostgreSQL before 17 cannot
   * subtract it), for the worker to wake itself then.
   *
   * Without synchronous standbys, the claim commits asynchronously (`synchronous_commit` off for its own
   * transaction, set by `async_commit`): it does not wait for its WAL to reach the disk. What may follow a claim
   * before anything else is written is the authorization request, which changes no effect (the built-in service's
   * audit row of it is a later commit in this database, so it cannot outlive the claim); the provider request waits
   * for the evidence statement, fenced on this claim token and committed synchronously, and flushing that commit
   * flushes all the WAL before it, the claim's included. A server crash before that flush loses the claim and
   * nothing else: the operation is `pending` again with its outbox row, no provider request was sent under it, and
   * the evidence write fails on the token. With synchronous standbys (`synchronous_standby_names` set) the claim
   * keeps the server's setting and waits for them: a standby's wait can be cancelled (the commit then stands on the
   * primary alone, with a warning), and a later failover must not bring back as `pending` an operation whose
   * request was sent. Measured: see docs/performance.md "Waking the dispatchers".
   */
  outboxClaimBatch: `
    WITH picked AS (
      SELECT o.operation_id, o.attempt
      FROM @schema.outbox o
      JOIN @schema.operations l ON l.operation_id = o.operation_id
      WHERE o.available_at <= now() AND l.status = 'pending'
        AND (NOT EXISTS (SELECT 1 FROM @schema.gate_kill_switches)
          OR NOT EXISTS (
            SELECT 1 FROM @schema.gate_kill_switches k
            WHERE k.tenant_id IN (l.tenant_id, '*') AND k.tool_name IN (l.tool_name, '*')))
      ORDER BY o.available_at
      LIMIT $1
      FOR UPDATE OF o, l SKIP LOCKED
    ), taken AS (
      DELETE FROM @schema.outbox o USING picked p
      WHERE o.operation_id = p.operation_id AND o.attempt = p.attempt
      RETURNING o.operation_id, o.attempt, o.available_at
    ), ${transitionCte({
      name: 'claimed',
      input: 'taken i',
      from: "'pending'",
      to: "'executing'",
      fence: 'TRUE',
      set: 'claim_token = gen_random_uuid(), claimed_by = $2, claimed_at = now(), attempt = i.attempt',
      actor: '$2',
      reason: "'claimed'",
      detail: "jsonb_build_object('attempt', l.attempt, 'claim_token', l.claim_token)",
      returning: `l.effect_key, l.principal_id, l.task_id, l.workflow_step_id, l.tool_name, l.tenant_id, l.provider_id,
                l.provider_endpoint, l.idempotency_header, l.canonical_args_sha256, l.arguments_json,
                l.current_approval_id, l.current_policy_version, l.claim_token, l.attempt, l.dispatch_releases,
                l.trace_context`,
    })}, more AS (
      SELECT count(*) > $1 AS waiting,
             (SELECT extract(epoch FROM min(f.available_at) - now()) * 1000
              FROM @schema.outbox f WHERE f.available_at > now() AND f.available_at < 'infinity')::float8 AS next_in_ms
      FROM (SELECT 1 FROM @schema.outbox w WHERE w.available_at <= now() LIMIT $1 + 1) w
    ), async_commit AS (
      SELECT set_config('synchronous_commit',
        CASE WHEN current_setting('synchronous_standby_names') = '' THEN 'off'
             ELSE current_setting('synchronous_commit') END, true) AS setting
    )
    SELECT operation_id, effect_key, principal_id, task_id, workflow_step_id, tool_name, tenant_id, provider_id,
           provider_endpoint, idempotency_header, canonical_args_sha256, arguments_json, current_approval_id,
           current_policy_version, claim_token, attempt, dispatch_releases, trace_context,
           greatest(extract(epoch FROM now() - (SELECT t.available_at FROM taken t
                                                WHERE t.operation_id = claimed.operation_id)), 0)::float8 AS queued_s,
           more.waiting AS more_waiting, more.next_in_ms
    FROM claimed CROSS JOIN async_commit CROSS JOIN more`,

  /**
   * Records a batch of authorization decisions in one statement (its own transaction, committed and flushed
   * before the dispatch batch's BEGIN that follows it on the same connection: dispatcher/dispatch-batch.ts).
   * Element i of the arrays is one decision. Each operation is locked (in key order) and its evidence inserted
   * only while it is still executing under that claim with the same approval and policy version, and with the
   * decision inside the profile's windows by the database clock: $10 maximum TTL, $11 maximum age, $12 clock
   * skew, all in ms (the same rules as `checkWindows`, which the caller applies to `db_now` for the refusal's
   * code).
   *
   * A row another session holds (a reviewer, a revocation, a migration) is skipped, not waited for: its
   * batch-mates go on, and it comes back with `locked` false for the caller to try again in a later batch.
   * Returns one row per (operation, claim) still current (in this statement's snapshot); `recorded` says its
   * evidence exists, inserted now or by an earlier attempt of this statement whose reply was lost.
   */
  evidenceRecordBatch: `
    WITH input AS (
      SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::int[], $4::text[], $5::text[], $6::text[], $7::text[], $8::timestamptz[], $9::timestamptz[])
        AS i(operation_id, claim_token, attempt, approval_id, policy_version, args_sha256, decision_sha256, authorized_at, expires_at)
    ), claimed AS (
      SELECT l.operation_id, l.claim_token
      FROM input i
      JOIN @schema.operations l ON l.operation_id = i.operation_id AND l.claim_token = i.claim_token
      WHERE l.operation_id = ANY($1::uuid[]) AND l.status = 'executing'
    ), current AS (
      SELECT l.operation_id, l.claim_token, l.current_approval_id, l.current_policy_version
      FROM input i
      JOIN @schema.operations l ON l.operation_id = i.operation_id AND l.claim_token = i.claim_token
      WHERE l.operation_id = ANY($1::uuid[]) AND l.status = 'executing'
      ORDER BY l.operation_id
      FOR UPDATE OF l SKIP LOCKED
    ), recorded AS (
      INSERT INTO @schema.authorization_evidence AS e (
        operation_id, attempt, claim_token, approval_id, policy_version, args_sha256, decision_sha256, authorized_at, expires_at)
      SELECT i.operation_id, i.attempt, i.claim_token, i.approval_id, i.policy_version, i.args_sha256, i.decision_sha256, i.authorized_at, i.expires_at
      FROM input i JOIN current c ON c.operation_id = i.operation_id AND c.claim_token = i.claim_token
      WHERE c.current_approval_id = i.approval_id AND c.current_policy_version = i.policy_version
        AND i.expires_at > i.authorized_at
        AND i.expires_at - i.authorized_at <= make_interval(secs => $10::float8 / 1000)
        AND i.authorized_at <= now() + make_interval(secs => $12::float8 / 1000)
        AND now() - i.authorized_at <= make_interval(secs => ($11::float8 + $12::float8) / 1000)
        AND i.expires_at > now() - make_interval(secs => $12::float8 / 1000)
      ON CONFLICT (operation_id, claim_token) DO UPDATE SET decision_sha256 = e.decision_sha256
      RETURNING e.operation_id, e.claim_token
    )
    SELECT now() AS db_now, k.operation_id, k.claim_token, c.operation_id IS NOT NULL AS locked,
           c.current_approval_id, c.current_policy_version, r.operation_id IS NOT NULL AS recorded
    FROM claimed k
    LEFT JOIN current c ON c.operation_id = k.operation_id AND c.claim_token = k.claim_token
    LEFT JOIN recorded r ON r.operation_id = k.operation_id AND r.claim_token = k.claim_token`,

  /**
   * A dispatch batch's row locks: the rows of ($1[i], $2[i]) still executing under that claim and with evidence
   * recorded under it, locked in key order, held until the batch's outcomes commit. A revocation that updates one
   * of these rows waits for that commit. A row another session holds is skipped (never waited for, so its
   * batch-mates are not stalled by a stranger); the caller tries it again in a later batch while its claim holds.
   * A row without evidence (the evidence statement before it refused the decision or skipped the row) is not
   * locked, so its refusal is written at once; one whose evidence an earlier try recorded may be, and the caller
   * then settles it once this batch has ended. Returns one row per operation still under its claim (in this
   * statement's snapshot), with that claim, `locked` saying whether this batch holds it.
   */
  operationLockForDispatchBatch: `
    WITH claimed AS (
      SELECT l.operation_id, l.claim_token
      FROM unnest($1::uuid[], $2::uuid[]) AS i(operation_id, claim_token)
      JOIN @schema.operations l ON l.operation_id = i.operation_id AND l.claim_token = i.claim_token
      WHERE l.operation_id = ANY($1::uuid[]) AND l.status = 'executing'
    ), locked AS (
      SELECT l.operation_id
      FROM unnest($1::uuid[], $2::uuid[]) AS i(operation_id, claim_token)
      JOIN @schema.operations l ON l.operation_id = i.operation_id AND l.claim_token = i.claim_token
      WHERE l.operation_id = ANY($1::uuid[]) AND l.status = 'executing'
        AND EXISTS (
          SELECT 1 FROM @schema.authorization_evidence e
          WHERE e.operation_id = l.operation_id AND e.claim_token = l.claim_token)
      ORDER BY l.operation_id
      FOR UPDATE OF l SKIP LOCKED
    )
    SELECT k.operation_id, k.claim_token, x.operation_id IS NOT NULL AS locked
    FROM claimed k LEFT JOIN locked x ON x.operation_id = k.operation_id`,

  /**
   * The final check, a separate statement run once the batch's locks are held (so with a snapshot and a clock
   * taken after them; the caller keeps its answer for the operations it locked): still executing under this
   * claim, same approval and policy version, the recorded evidence inside its windows now ($3: maximum age +
   * skew, ms), no kill switch on the operation's tenant or tool, and no role revoked since the decision: neither
   * the role the gate recorded for the requester nor the role any approver of its approval voted with (a vote
   * whose role was never recorded matches any revocation of that approver). A row absent from the result lost
   * its claim or its evidence no longer matches. Every lookup is by key: operations and evidence by primary key,
   * the gate's record of the operation and the approval by primary key, revocations by (tenant, principal,
   * role).
   */
  operationFinalCheckBatch: `
    SELECT l.operation_id, l.claim_token,
           e.expires_at > statement_timestamp() AS fresh,
           e.authorized_at >= statement_timestamp() - make_interval(secs => $3::float8 / 1000) AS young,
           EXISTS (
             SELECT 1 FROM @schema.gate_kill_switches k
             WHERE k.tenant_id IN (l.tenant_id, '*') AND k.tool_name IN (l.tool_name, '*')) AS killed,
           EXISTS (
             SELECT 1 FROM @schema.gate_operations g
             JOIN @schema.gate_role_revocations r
               ON r.tenant_id = l.tenant_id AND r.principal_id = l.principal_id AND r.role = g.role
             WHERE g.operation_id = l.operation_id)
           OR EXISTS (
             SELECT 1 FROM @schema.gate_operations g
             JOIN @schema.gate_approvals a
               ON a.approval_id = CASE WHEN g.approval_kind = 'approval'
                                        AND l.current_approval_id ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                                       THEN l.current_approval_id::uuid END
              AND a.tenant_id = l.tenant_id
             CROSS JOIN LATERAL unnest(a.approvers, a.approver_roles) AS v(who, role)
             JOIN @schema.gate_role_revocations r
               ON r.tenant_id = l.tenant_id AND r.principal_id = v.who AND (v.role IS NULL OR r.role = v.role)
             WHERE g.operation_id = l.operation_id) AS revoked
    FROM unnest($1::uuid[], $2::uuid[]) AS i(operation_id, claim_token)
    JOIN @schema.operations l ON l.operation_id = i.operation_id AND l.claim_token = i.claim_token
    JOIN @schema.authorization_evidence e ON e.operation_id = l.operation_id AND e.claim_token = l.claim_token
    WHERE l.operation_id = ANY($1::uuid[]) AND l.status = 'executing'
      AND e.approval_id = l.current_approval_id AND e.policy_version = l.current_policy_version`,

  /**
   * Writes an outcome, fenced on executing + claim token, with its history row. $9 is what the worker knows
   * about the provider contact (`not_called` for a refusal before the send; NULL leaves the claim's
   * `maybe_called`).
   */
  operationComplete: `
    WITH ${transitionCte({
      name: 'done',
      input: '(SELECT $1::uuid AS operation_id) i',
      from: "'executing'",
      to: '$3',
      fence: 'l.claim_token = $2',
      set: 'provider_receipt = $4, result_json = $5::jsonb, review_reason = $6',
      contact: '$9::text',
      actor: '$7',
      reason: '$8',
      detail: '$5::jsonb',
    })}
    SELECT count(*)::int AS n FROM done`,

  /** The same for a batch: element i of each array is one outcome; returns the operations it changed. */
  operationCompleteBatch: `
    WITH ${transitionCte({
      name: 'done',
      input: `unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $9::text[])
        AS i(operation_id, claim_token, status, receipt, result, review, reason, contact)`,
      from: "'executing'",
      to: 'i.status',
      fence: 'l.operation_id = ANY($1::uuid[]) AND l.claim_token = i.claim_token',
      set: 'provider_receipt = i.receipt, result_json = i.result::jsonb, review_reason = i.review',
      contact: 'i.contact',
      actor: '$8',
      reason: 'i.reason',
      detail: 'i.result::jsonb',
    })}
    SELECT operation_id FROM done`,

  operationSelectClaim: `SELECT status, claim_token FROM @schema.operations WHERE operation_id = $1`,

  /** Whether a gate kill switch covers tenant $1 and tool $2 now (as the claim and the final check test it). */
  killSwitchCovers: `
    SELECT EXISTS (
      SELECT 1 FROM @schema.gate_kill_switches k
      WHERE k.tenant_id IN ($1, '*') AND k.tool_name IN ($2, '*')) AS covered`,

  /**
   * Gives a claim a worker never sent back to the queue (ledger/transitions.ts `releaseToQueueSql`): $1 id,
   * $2 claim, $3 actor, $4 reason, $5 wait (ms), $6 detail, $7 counted towards the release limit.
   */
  operationRelease: releaseToQueueSql(),

  /** Registers (or re-registers) a worker: live, holding no claims yet. */
  workerUpsert: `
    INSERT INTO @schema.workers (worker_id, pid, host, claim_tokens, claims_listed_at) VALUES ($1, $2, $3, '{}', now())
    ON CONFLICT (worker_id) DO UPDATE
    SET pid = excluded.pid, host = excluded.host, heartbeat_at = now(), stopped_at = NULL, claim_tokens = '{}', claims_listed_at = now()`,
  /** A heartbeat with the claims ($2) the worker holds at this moment: the reconciler's view of its liveness. */
  workerHeartbeat: `UPDATE @schema.workers SET heartbeat_at = now(), claim_tokens = $2::uuid[], claims_listed_at = now() WHERE worker_id = $1`,
  workerStopped: `UPDATE @schema.workers SET stopped_at = now(), heartbeat_at = now() WHERE worker_id = $1`,
} as const;
