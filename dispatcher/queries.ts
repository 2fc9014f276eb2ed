/**
 * The dispatcher's SQL. Every write is fenced on the state and claim token it expects; `@schema.` is bound
 * once at start (core/db.ts).
 */
export const dispatcherQueries = {
  /**
   * Claims up to $1 waiting operations for worker $2 in one statement: lock outbox and ledger rows (skipping
   * rows another worker holds), delete the outbox rows, mark the operations `executing` with a fresh claim
   * token, and append the history. Operations of a tenant or tool under a gate kill switch stay pending, their
   * outbox rows untouched, until the switch is lifted.
   */
  outboxClaimBatch: `
    WITH picked AS (
      SELECT o.operation_id, o.attempt
      FROM @schema.outbox o
      JOIN @schema.operations l ON l.operation_id = o.operation_id
      WHERE o.available_at <= now() AND l.status = 'pending'
        AND NOT EXISTS (
          SELECT 1 FROM @schema.gate_kill_switches k
          WHERE k.tenant_id IN (l.tenant_id, '*') AND k.tool_name IN (l.tool_name, '*'))
      ORDER BY o.available_at
      LIMIT $1
      FOR UPDATE OF o, l SKIP LOCKED
    ), taken AS (
      DELETE FROM @schema.outbox o USING picked p
      WHERE o.operation_id = p.operation_id AND o.attempt = p.attempt
      RETURNING o.operation_id, o.attempt
    ), claimed AS (
      UPDATE @schema.operations l
      SET status = 'executing', claim_token = gen_random_uuid(), claimed_by = $2, claimed_at = now(),
          attempt = t.attempt, updated_at = now()
      FROM taken t
      WHERE l.operation_id = t.operation_id AND l.status = 'pending'
      RETURNING l.operation_id, l.effect_key, l.principal_id, l.task_id, l.workflow_step_id, l.tool_name,
                l.tenant_id, l.provider_id, l.provider_endpoint, l.idempotency_header, l.canonical_args_sha256,
                l.arguments_json, l.current_approval_id, l.current_policy_version, l.claim_token, l.attempt
    ), history AS (
      INSERT INTO @schema.operation_history (operation_id, from_status, to_status, actor, reason, detail)
      SELECT operation_id, 'pending', 'executing', $2, 'claimed', jsonb_build_object('attempt', attempt, 'claim_token', claim_token)
      FROM claimed
    )
    SELECT * FROM claimed`,

  /** Locks the claimed row and reads the database clock: the evidence is judged by now() of PostgreSQL. */
  operationLockClaimed: `
    SELECT now() AS db_now, current_approval_id, current_policy_version
    FROM @schema.operations
    WHERE operation_id = $1 AND status = 'executing' AND claim_token = $2
    FOR UPDATE`,

  evidenceInsert: `
    INSERT INTO @schema.authorization_evidence (
      operation_id, attempt, claim_token, approval_id, policy_version, args_sha256, decision_sha256, authorized_at, expires_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
    ON CONFLICT (operation_id, claim_token) DO NOTHING`,

  /**
   * The final check, under the row lock held until the outcome commits: still executing under this claim,
   * same approval and policy version, and the recorded evidence still inside its windows by the database
   * clock. A revocation that updates the row waits for this transaction; one that committed first fails it.
   */
  operationLockForDispatch: `
    SELECT e.expires_at > now() AS fresh,
           e.authorized_at >= now() - make_interval(secs => $3::float8 / 1000) AS young
    FROM @schema.operations l
    JOIN @schema.authorization_evidence e ON e.operation_id = l.operation_id AND e.claim_token = l.claim_token
    WHERE l.operation_id = $1 AND l.status = 'executing' AND l.claim_token = $2
      AND e.approval_id = l.current_approval_id AND e.policy_version = l.current_policy_version
    FOR UPDATE OF l`,

  /** Writes an outcome, fenced on executing + claim token, with its history row. */
  operationComplete: `
    WITH done AS (
      UPDATE @schema.operations
      SET status = $3, provider_receipt = $4, result_json = $5::jsonb, review_reason = $6, updated_at = now()
      WHERE operation_id = $1 AND status = 'executing' AND claim_token = $2
      RETURNING operation_id
    ), history AS (
      INSERT INTO @schema.operation_history (operation_id, from_status, to_status, actor, reason, detail)
      SELECT operation_id, 'executing', $3, $7, $8, $5::jsonb FROM done
    )
    SELECT count(*)::int AS n FROM done`,

  operationSelectClaim: `SELECT status, claim_token FROM @schema.operations WHERE operation_id = $1`,

  workerUpsert: `
    INSERT INTO @schema.workers (worker_id, pid, host) VALUES ($1, $2, $3)
    ON CONFLICT (worker_id) DO UPDATE SET heartbeat_at = now(), stopped_at = NULL`,
  workerHeartbeat: `UPDATE @schema.workers SET heartbeat_at = now() WHERE worker_id = $1`,
  workerStopped: `UPDATE @schema.workers SET stopped_at = now(), heartbeat_at = now() WHERE worker_id = $1`,
} as const;
