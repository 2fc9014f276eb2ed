/**
 * The compensator's SQL; every transition is the ledger's fenced transition (ledger/transitions.ts), with its
 * history row in the same statement. `@schema.` is bound once at start (db/db.ts).
 */
import { transitionCte } from '../ledger/index.js';

export const compensatorQueries = {
  /**
   * Originals whose compensation moved on: still `compensating` with a compensation that ended or went to
   * review or unknown; or in review because of their compensation (`compensation_unknown`,
   * `compensation_needs_review`), whose compensation has since succeeded (by readback or a reviewed retry).
   * Found through `attention` (its partial index), not by reading every operation each pass.
   */
  endedCompensations: `
    SELECT c.original_operation_id, c.compensation_operation_id, o.status AS original_status, o.review_reason AS original_review_reason,
           k.status, k.provider_receipt
    FROM @schema.compensations c
    JOIN @schema.operations o ON o.operation_id = c.original_operation_id
    JOIN @schema.operations k ON k.operation_id = c.compensation_operation_id
    WHERE o.attention IN ('compensating', 'needs_review')
      AND ((o.status = 'compensating' AND k.status IN ('succeeded', 'failed', 'unknown', 'needs_review'))
        OR (o.status = 'needs_review' AND o.review_reason IN ('compensation_unknown', 'compensation_needs_review') AND k.status = 'succeeded'))`,

  /** compensating -> compensated | needs_review, fenced, with its history row. */
  finish: `
    WITH ${transitionCte({
      name: 'done',
      input: '(SELECT $1::uuid AS operation_id) i',
      from: "'compensating'",
      to: '$2::text',
      fence: 'TRUE',
      set: 'review_reason = $3',
      actor: '$4',
      reason: '$5',
      detail: '$6::jsonb',
    })}
    SELECT count(*)::int AS n FROM done`,

  /**
   * An original in review for its compensation's uncertain outcome, whose compensation has now succeeded: the
   * first of its two legal steps, needs_review -> compensating, fenced on the reason read; `finish` (in the
   * same transaction) then moves it on to compensated.
   */
  finishFromReview: `
    WITH ${transitionCte({
      name: 'done',
      input: '(SELECT $1::uuid AS operation_id) i',
      from: "'needs_review'",
      to: "'compensating'",
      fence: 'l.review_reason = $2',
      set: 'review_reason = NULL',
      actor: '$3',
      reason: "'compensation_resolved'",
      detail: '$4::jsonb',
    })}
    SELECT count(*)::int AS n FROM done`,

  isCompensation: `SELECT 1 FROM @schema.compensations WHERE compensation_operation_id = $1`,

  /** Tasks with a failed step (not itself a compensation) and a succeeded one that may need undoing. */
  tasksWithFailedStep: `
    SELECT DISTINCT f.tenant_id, f.principal_id, f.task_id
    FROM @schema.operations f
    WHERE f.attention = 'failed' AND f.status = 'failed'
      AND NOT EXISTS (SELECT 1 FROM @schema.compensations c WHERE c.compensation_operation_id = f.operation_id)
      AND EXISTS (
        SELECT 1 FROM @schema.operations s
        WHERE s.tenant_id = f.tenant_id AND s.principal_id = f.principal_id AND s.task_id = f.task_id
          AND s.status = 'succeeded'
          AND NOT EXISTS (SELECT 1 FROM @schema.compensations c WHERE c.compensation_operation_id = s.operation_id))`,

  /** A task's own steps (a task belongs to one tenant and principal), compensations excluded. */
  taskSteps: `
    SELECT o.operation_id, o.workflow_step_id, o.status
    FROM @schema.operations o
    WHERE o.tenant_id = $1 AND o.principal_id = $2 AND o.task_id = $3
      AND NOT EXISTS (SELECT 1 FROM @schema.compensations c WHERE c.compensation_operation_id = o.operation_id)`,

  lockOriginal: `
    SELECT operation_id, effect_key, status, principal_id, task_id, workflow_step_id, tool_name, tenant_id,
           provider_receipt, arguments_json, current_policy_version, attempt, review_reason, trace_context
    FROM @schema.operations WHERE operation_id = $1 FOR UPDATE`,

  compensationOf: `SELECT compensation_operation_id FROM @schema.compensations WHERE original_operation_id = $1`,

  compensationInsert: `
    INSERT INTO @schema.compensations (original_operation_id, compensation_operation_id, requested_by, reason)
    VALUES ($1, $2, $3, $4)`,

  /** $1 id, $2 from (read under the row lock), $3 to, $4 review reason, $5 actor, $6 reason, $7 detail. */
  move: `
    WITH ${transitionCte({
      name: 'done',
      input: '(SELECT $1::uuid AS operation_id) i',
      from: '$2::text',
      to: '$3::text',
      fence: 'TRUE',
      set: 'review_reason = $4',
      actor: '$5',
      reason: '$6',
      detail: '$7::jsonb',
    })}
    SELECT count(*)::int AS n FROM done`,
} as const;
