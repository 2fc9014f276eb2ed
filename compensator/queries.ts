/** The compensator's SQL; `@schema.` is bound once at start (core/db.ts). */
export const compensatorQueries = {
  /** Originals still `compensating` whose compensation has reached an end or a review. */
  endedCompensations: `
    SELECT c.original_operation_id, c.compensation_operation_id, k.status, k.provider_receipt
    FROM @schema.compensations c
    JOIN @schema.operations o ON o.operation_id = c.original_operation_id
    JOIN @schema.operations k ON k.operation_id = c.compensation_operation_id
    WHERE o.status = 'compensating' AND k.status IN ('succeeded', 'failed', 'unknown', 'needs_review')`,

  /** compensating -> compensated | needs_review, fenced, with its history row. */
  finish: `
    WITH done AS (
      UPDATE @schema.operations SET status = $2, review_reason = $3, updated_at = now()
      WHERE operation_id = $1 AND status = 'compensating'
      RETURNING operation_id
    ), history AS (
      INSERT INTO @schema.operation_history (operation_id, from_status, to_status, actor, reason, detail)
      SELECT operation_id, 'compensating', $2, $4, $5, $6::jsonb FROM done
    )
    SELECT count(*)::int AS n FROM done`,

  /** Tasks with a failed step (not itself a compensation) and a succeeded one that may need undoing. */
  tasksWithFailedStep: `
    SELECT DISTINCT f.principal_id, f.task_id
    FROM @schema.operations f
    WHERE f.status = 'failed'
      AND NOT EXISTS (SELECT 1 FROM @schema.compensations c WHERE c.compensation_operation_id = f.operation_id)
      AND EXISTS (
        SELECT 1 FROM @schema.operations s
        WHERE s.principal_id = f.principal_id AND s.task_id = f.task_id AND s.status = 'succeeded'
          AND NOT EXISTS (SELECT 1 FROM @schema.compensations c WHERE c.compensation_operation_id = s.operation_id))`,

  /** A task's own steps, compensations excluded. */
  taskSteps: `
    SELECT o.operation_id, o.workflow_step_id, o.status
    FROM @schema.operations o
    WHERE o.principal_id = $1 AND o.task_id = $2
      AND NOT EXISTS (SELECT 1 FROM @schema.compensations c WHERE c.compensation_operation_id = o.operation_id)`,

  lockOriginal: `
    SELECT operation_id, effect_key, status, principal_id, task_id, workflow_step_id, tool_name, tenant_id,
           provider_receipt, arguments_json, current_policy_version
    FROM @schema.operations WHERE operation_id = $1 FOR UPDATE`,

  compensationOf: `SELECT compensation_operation_id FROM @schema.compensations WHERE original_operation_id = $1`,

  compensationInsert: `
    INSERT INTO @schema.compensations (original_operation_id, compensation_operation_id, requested_by, reason)
    VALUES ($1, $2, $3, $4)`,

  /** $1 id, $2 from, $3 to, $4 review reason, $5 actor, $6 reason, $7 detail. */
  move: `
    WITH done AS (
      UPDATE @schema.operations SET status = $3, review_reason = $4, updated_at = now()
      WHERE operation_id = $1 AND status = $2
      RETURNING operation_id
    ), history AS (
      INSERT INTO @schema.operation_history (operation_id, from_status, to_status, actor, reason, detail)
      SELECT operation_id, $2, $3, $5, $6, $7::jsonb FROM done
    )
    SELECT count(*)::int AS n FROM done`,
} as const;
