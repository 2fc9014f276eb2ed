/**
 * The compensator: undoes the succeeded earlier steps of a task whose later step definitively failed, and
 * what a reviewer asks to compensate.
 *
 * A task's operations (same principal and task id, compensations excluded) are ordered by workflow step id
 * in natural order ("step-2" before "step-10"). When a step is `failed`, the succeeded steps before it are
 * compensated newest first, one at a time: the next is minted only when the previous one's compensation has
 * succeeded. Each compensation is a separate operation reserved through the ledger (its own id, identity
 * `compensation:<original id>` and HMAC effect key) with the tool and arguments the registry's compensation
 * mapping declares, so it passes the same fresh authorization and dispatch path as any other.
 *
 *   original succeeded | needs_review --mint--> compensating --compensation succeeded--> compensated
 *                                                compensating --compensation failed / unknown / needs_review--> needs_review
 *   needs_review (compensation_unknown | compensation_needs_review) --its compensation later succeeded--> compensated
 *   no mapping, a mapping without a value, a refused reservation --> compensating --> needs_review
 *                                                (compensation_refused:<code>)
 */
import type { Config } from '../config/index.js';
import { bindQueries, withTransaction, type Pool, type PoolClient } from '../db/index.js';
import { ActionLedgerError, isActionLedgerError } from '../core/errors.js';
import type { JsonValue } from '../core/json.js';
import type { Logger } from '../core/log.js';
import type { Ledger } from '../ledger/index.js';
import { compensationArguments } from './mapping.js';
import { compensatorQueries } from './queries.js';
import { linkedSpan, SpanKind, withSpan } from '../core/tracing.js';

export interface CompensationSummary {
  minted: number;
  completed: number;
  escalated: number;
}

export interface CompensatorOptions {
  config: Config;
  pool: Pool;
  ledger: Ledger;
  log: Logger;
  /** Who the history rows name for automatic compensations. */
  actor: string;
  onEvent?: (event: 'minted' | 'completed' | 'escalated') => void;
}

type OriginalRow = {
  operation_id: string;
  /** The trace the original was reserved under: the compensation's span links to it. */
  trace_context?: string | null;
  effect_key: string;
  status: string;
  principal_id: string;
  task_id: string;
  workflow_step_id: string;
  tool_name: string;
  tenant_id: string;
  provider_receipt: string | null;
  arguments_json: JsonValue;
  current_policy_version: string;
  attempt: number;
  review_reason: string | null;
};

type StepRow = { operation_id: string; workflow_step_id: string; status: string };

/** Natural order of step ids: digit runs compare as numbers ("2" < "10"), the rest as text. */
export function compareSteps(a: string, b: string): number {
  return a.localeCompare(b, 'en', { numeric: true, sensitivity: 'variant' }) || (a < b ? -1 : a > b ? 1 : 0);
}

export class Compensator {
  readonly #o: CompensatorOptions;
  readonly #q: Readonly<typeof compensatorQueries>;

  constructor(options: CompensatorOptions) {
    this.#o = options;
    this.#q = bindQueries(compensatorQueries, options.config.schemaQuoted);
  }

  /** Finishes compensations whose operation ended, then starts the next ones; one call per pass. */
  async pass(): Promise<CompensationSummary> {
    const summary: CompensationSummary = { minted: 0, completed: 0, escalated: 0 };
    const { rows: ended } = await this.#o.pool.query<{
      original_operation_id: string;
      compensation_operation_id: string;
      original_status: string;
      original_review_reason: string | null;
      status: string;
      provider_receipt: string | null;
    }>(this.#q.endedCompensations);
    for (const e of ended) {
      const to = e.status === 'succeeded' ? 'compensated' : 'needs_review';
      const review = to === 'needs_review' ? `compensation_${e.status}` : null;
      const detail = JSON.stringify({
        compensation_operation_id: e.compensation_operation_id,
        compensation_status: e.status,
        compensation_receipt: e.provider_receipt,
      });
      const n = await withTransaction(this.#o.pool, async (c) => {
        // From review: needs_review -> compensating first, so each of the two moves is a legal one.
        if (e.original_status === 'needs_review') {
          const { rows } = await c.query<{ n: number }>(this.#q.finishFromReview, [
            e.original_operation_id,
            e.original_review_reason,
            this.#o.actor,
            detail,
          ]);
          if (rows[0]?.n !== 1) return 0;
        }
        const { rows } = await c.query<{ n: number }>(this.#q.finish, [
          e.original_operation_id,
          to,
          review,
          this.#o.actor,
          to === 'compensated' ? 'compensation_succeeded' : `compensation_${e.status}`,
          detail,
        ]);
        return rows[0]?.n ?? 0;
      });
      if (n !== 1) continue;
      if (to === 'compensated') summary.completed++;
      else summary.escalated++;
      this.#emit(to === 'compensated' ? 'completed' : 'escalated');
      this.#o.log.info(
        { operation_id: e.original_operation_id, compensation_operation_id: e.compensation_operation_id, to },
        'compensation ended',
      );
    }

    const { rows: tasks } = await this.#o.pool.query<{ tenant_id: string; principal_id: string; task_id: string }>(
      this.#q.tasksWithFailedStep,
    );
    for (const t of tasks) {
      const { rows: steps } = await this.#o.pool.query<StepRow>(this.#q.taskSteps, [
        t.tenant_id,
        t.principal_id,
        t.task_id,
      ]);
      const next = nextToCompensate(steps);
      if (next === null) continue;
      const r = await this.compensate(next.target, this.#o.actor, `step_failed:${next.failedStep}`, ['succeeded']);
      if (r === 'minted') summary.minted++;
      else if (r === 'escalated') summary.escalated++;
    }
    return summary;
  }

  /**
   * Starts the compensation of one operation (from `succeeded`, or `needs_review` when a reviewer asks).
   * Returns 'minted', 'escalated' (no usable mapping: the original is in needs_review), or 'unchanged' when the
   * operation is not in an allowed state any more. Throws `not_found`, `invalid_state_transition` only when
   * `strict` (the review path). `check`, when given, runs under the row lock before anything changes and
   * refuses by throwing (a reviewer's expectation of the attempt and review reason).
   */
  async compensate(
    operationId: string,
    actor: string,
    reason: string,
    from: readonly string[] = ['succeeded', 'needs_review'],
    strict = false,
    check?: (op: { status: string; attempt: number; review_reason: string | null }) => void,
  ): Promise<'minted' | 'escalated' | 'unchanged'> {
    const outcome = await withTransaction(this.#o.pool, async (c) => {
      const { rows } = await c.query<OriginalRow>(this.#q.lockOriginal, [operationId]);
      const op = rows[0];
      if (op === undefined) {
        if (strict) throw new ActionLedgerError('not_found', 'no such operation');
        return 'unchanged' as const;
      }
      const { rows: isCompensation } = await c.query(this.#q.isCompensation, [operationId]);
      if (isCompensation.length > 0) {
        // A compensation is not itself compensated: its original would be stranded in `compensating`.
        if (strict)
          throw new ActionLedgerError(
            'invalid_state_transition',
            'this operation is a compensation; resolve or retry it, it is not compensated itself',
            { details: { status: op.status } },
          );
        return 'unchanged' as const;
      }
      const { rows: already } = await c.query(this.#q.compensationOf, [operationId]);
      if (!from.includes(op.status) || already.length > 0) {
        if (strict) {
          throw new ActionLedgerError(
            'invalid_state_transition',
            `cannot compensate an operation in ${op.status}${already.length > 0 ? ' that already has a compensation' : ''}`,
            {
              details: { status: op.status },
            },
          );
        }
        return 'unchanged' as const;
      }
      check?.(op);
      // The compensation's own span (its reservation, and so its dispatch, continue it), linked to the original's.
      const span = linkedSpan('compensate', SpanKind.INTERNAL, [op.trace_context], () => ({
        'actionledger.operation_id': op.operation_id,
        'actionledger.tool': op.tool_name,
        'actionledger.tenant': op.tenant_id,
      }));
      try {
        return await withSpan(span, () => this.#mint(c, op, actor, reason));
      } finally {
        span?.end();
      }
    });
    this.#emit(outcome === 'minted' ? 'minted' : outcome === 'escalated' ? 'escalated' : undefined);
    return outcome;
  }

  async #mint(c: PoolClient, op: OriginalRow, actor: string, reason: string): Promise<'minted' | 'escalated'> {
    await this.#move(c, op.operation_id, op.status, 'compensating', null, actor, reason, {});
    const route = this.#o.config.tools.get(op.tool_name);
    let problem: { code: string; message: string; details?: unknown } | null = null;
    let compensationId: string | null = null;
    if (route?.compensation == null) {
      problem = { code: 'compensation_unmapped', message: `tool ${op.tool_name} declares no compensation` };
    } else {
      await c.query('SAVEPOINT mint');
      try {
        const args = compensationArguments(route.compensation, op);
        const res = await this.#o.ledger.reserve(
          {
            tenant_id: op.tenant_id,
            principal_id: op.principal_id,
            task_id: op.task_id,
            workflow_step_id: `compensation:${op.operation_id}`,
            approval_id: `compensation:${op.operation_id}`,
            policy_version: op.current_policy_version,
          },
          route.compensation.tool,
          args,
          { client: c, actor },
        );
        await c.query(this.#q.compensationInsert, [op.operation_id, res.operation_id, actor, reason]);
        await c.query('RELEASE SAVEPOINT mint');
        compensationId = res.operation_id;
      } catch (err) {
        if (!isActionLedgerError(err)) throw err;
        await c.query('ROLLBACK TO SAVEPOINT mint');
        problem = { code: err.code, message: err.message, details: err.details };
      }
    }
    if (problem !== null) {
      await this.#move(
        c,
        op.operation_id,
        'compensating',
        'needs_review',
        `compensation_refused:${problem.code}`,
        this.#o.actor,
        `compensation_refused:${problem.code}`,
        problem as unknown as Record<string, JsonValue>,
      );
      this.#o.log.warn(
        { operation_id: op.operation_id, tool: op.tool_name, code: problem.code },
        'no compensation could be minted; sent to review',
      );
      return 'escalated';
    }
    this.#o.log.info(
      { operation_id: op.operation_id, compensation_operation_id: compensationId, tool: route?.compensation?.tool },
      'compensation minted',
    );
    return 'minted';
  }

  async #move(
    c: PoolClient,
    id: string,
    from: string,
    to: string,
    review: string | null,
    actor: string,
    reason: string,
    detail: Record<string, JsonValue>,
  ): Promise<void> {
    const { rows } = await c.query<{ n: number }>(this.#q.move, [
      id,
      from,
      to,
      review,
      actor,
      reason,
      JSON.stringify(detail),
    ]);
    if (rows[0]?.n !== 1) throw new Error(`operation ${id} left ${from} under its row lock`);
  }

  #emit(event: 'minted' | 'completed' | 'escalated' | undefined): void {
    if (event !== undefined) this.#o.onEvent?.(event);
  }
}

/**
 * Which operation of a task to compensate next, newest first: the latest succeeded step before the earliest
 * failed one, provided every step between them is already compensated or failed (so one undo finishes before
 * the next begins, and a step someone must look at stops the chain).
 */
export function nextToCompensate(steps: StepRow[]): { target: string; failedStep: string } | null {
  const sorted = [...steps].sort((a, b) => compareSteps(a.workflow_step_id, b.workflow_step_id));
  const failedAt = sorted.findIndex((s) => s.status === 'failed');
  if (failedAt <= 0) return null;
  for (let i = failedAt - 1; i >= 0; i--) {
    const s = sorted[i] as StepRow;
    if (s.status === 'compensated' || s.status === 'failed') continue;
    if (s.status === 'succeeded')
      return { target: s.operation_id, failedStep: (sorted[failedAt] as StepRow).workflow_step_id };
    return null;
  }
  return null;
}
