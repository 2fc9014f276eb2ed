/**
 * What waits for a person, and what a person does about it: the operations of the caller's tenant in review
 * (with whether a retry would be safe), and the review actions (retry, resolve as succeeded or failed,
 * compensate) through the reconciler's `Review`, which locks, checks and moves each operation in one
 * transaction and audits it. The actor is the caller's principal and the request id is the audit row's trace
 * id; an operation of another tenant is refused before anything is read under a lock, as a missing one.
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { ActionLedgerError, type ErrorCode } from '../../../core/errors.js';
import { identifier } from '../../../core/identifier.js';
import { listInReview, type Review, type ReviewResult } from '../../../reconciler/index.js';
import { callerOf, holds } from '../auth.js';
import type { ApiApp, ApiDeps, FromRouteSchema, SchemaTypes } from '../types.js';

const idParam = {
  type: 'object',
  required: ['id'],
  additionalProperties: false,
  properties: { id: { type: 'string', minLength: 1, maxLength: 300, description: 'the operation id' } },
} as const;

const reason = {
  type: 'string',
  minLength: 1,
  maxLength: 2000,
  pattern: '^[^\\u0000-\\u001f\\u007f]*[^\\s\\u0000-\\u001f\\u007f][^\\u0000-\\u001f\\u007f]*$',
  description: 'why, for a later reader: not only spaces, no control characters',
} as const;

const RECEIPT = {
  type: 'string',
  minLength: 1,
  maxLength: 256,
  pattern: '^[\\x21-\\x7e]+$',
  description: "the provider's receipt you found (printable ASCII, no spaces)",
} as const;

const result = {
  type: 'object',
  required: ['ok', 'operation_id', 'from', 'to'],
  properties: {
    ok: { const: true },
    operation_id: { type: 'string' },
    from: { type: 'string' },
    to: { type: 'string' },
    attempt: { type: 'integer', description: 'the new dispatch attempt (retry)' },
    compensation: { type: 'string', enum: ['minted', 'escalated'] },
  },
} as const;

const inReview = {
  type: 'object',
  required: ['operation_id', 'tool_name', 'review_reason', 'provider_contact', 'retry_safe', 'entered_review_at'],
  properties: {
    operation_id: { type: 'string' },
    tenant_id: { type: 'string' },
    tool_name: { type: 'string' },
    review_reason: { type: 'string' },
    provider_contact: { type: 'string' },
    retry_safe: { type: 'boolean', description: 'the recorded provider contact proves a retry cannot apply it twice' },
    entered_review_at: { type: 'string', format: 'date-time' },
    age_s: { type: 'number' },
    attempt: { type: 'integer' },
    reconcile_attempts: { type: 'integer' },
  },
} as const;

/** What a retry may say it saw: the attempt and review reason the listing showed (refused if either moved on). */
const EXPECT = {
  type: 'object',
  additionalProperties: false,
  required: ['attempt', 'review_reason'],
  properties: {
    attempt: { type: 'integer', minimum: 1 },
    review_reason: { type: 'string', minLength: 1, maxLength: 2000 },
  },
  description: 'the attempt and review reason you saw in the list; the retry is refused if either changed since',
} as const;

interface ActionInput {
  actor: string;
  reason: string;
  tenant: string;
  requestId: string;
  receipt?: string;
  expect?: { attempt: number; reviewReason: string };
}

type Action = (review: Review, id: string, input: ActionInput) => Promise<ReviewResult>;

const reasonOnly = {
  type: 'object',
  additionalProperties: false,
  required: ['reason'],
  properties: { reason },
} as const;

const withReceipt = {
  type: 'object',
  additionalProperties: false,
  required: ['reason', 'receipt'],
  properties: { reason, receipt: RECEIPT },
} as const;

/** The body of a retry (exported for the test that pins the request types derived from the schemas). */
export const retryBody = {
  type: 'object',
  additionalProperties: false,
  required: ['reason'],
  properties: { reason, expect: EXPECT },
} as const;

type ActionBody = typeof reasonOnly | typeof withReceipt | typeof retryBody;

/** One review action's route: the body's reason (and receipt or expectation), the caller as actor, in its tenant. */
function action(
  app: ApiApp,
  deps: ApiDeps,
  spec: {
    path: string;
    operationId: string;
    summary: string;
    body: ActionBody;
    /** The refusals of this action besides `not_found`, `invalid_state_transition` and `invalid_review`. */
    errors?: readonly ErrorCode[];
    run: Action;
  },
): void {
  app.post(
    `/v1/operations/:id/review/${spec.path}`,
    {
      config: {
        capability: 'review',
        operationId: spec.operationId,
        errors: ['not_found', 'invalid_state_transition', 'invalid_review', ...(spec.errors ?? [])],
      },
      schema: { summary: spec.summary, tags: ['review'], params: idParam, body: spec.body, response: { 200: result } },
    },
    async (request) => {
      const review = deps.review;
      if (review === undefined) throw new ActionLedgerError('internal', 'review actions are not configured here');
      return spec.run(review, request.params.id, {
        ...actor(request),
        reason: request.body.reason,
        ...extras(request.body),
      });
    },
  );
}

function actor(request: FastifyRequest): { actor: string; tenant: string; requestId: string } {
  const caller = callerOf(request);
  return { actor: caller.principal_id, tenant: caller.tenant_id, requestId: request.id };
}

function extras(body: FromRouteSchema<ActionBody>): Pick<ActionInput, 'receipt' | 'expect'> {
  return {
    ...('receipt' in body ? { receipt: body.receipt } : {}),
    ...('expect' in body && body.expect !== undefined
      ? { expect: { attempt: body.expect.attempt, reviewReason: body.expect.review_reason } }
      : {}),
  };
}

export function registerReviewRoutes(untyped: FastifyInstance, deps: ApiDeps): void {
  const app = untyped.withTypeProvider<SchemaTypes>();
  registerList(app, deps);
  action(app, deps, {
    path: 'retry',
    operationId: 'retryOperation',
    body: retryBody,
    errors: ['retry_not_safe'],
    summary: 'A new attempt with the same effect key, only when the provider is known to have no effect',
    run: (r, id, input) => r.retry(id, input),
  });
  action(app, deps, {
    path: 'resolve-succeeded',
    operationId: 'resolveOperationSucceeded',
    summary: 'Record that the effect happened, with the receipt you found at the provider',
    body: withReceipt,
    run: (r, id, input) => r.resolveSucceeded(id, { ...input, receipt: input.receipt ?? '' }),
  });
  action(app, deps, {
    path: 'resolve-failed',
    operationId: 'resolveOperationFailed',
    summary: 'Record that the effect did not happen; earlier steps of the task are compensated',
    body: reasonOnly,
    run: (r, id, input) => r.resolveFailed(id, input),
  });
  action(app, deps, {
    path: 'compensate',
    operationId: 'compensateOperation',
    summary: 'Undo a succeeded (or reviewed) operation with a compensation operation',
    body: reasonOnly,
    run: (r, id, input) => r.compensate(id, input),
  });
}

function registerList(app: ApiApp, deps: ApiDeps): void {
  app.get(
    '/v1/review',
    {
      config: { operationId: 'listReview', errors: ['invalid_context'] },
      schema: {
        summary: 'Operations of your tenant in review, oldest entry first (needs read or review)',
        tags: ['review'],
        querystring: {
          type: 'object',
          additionalProperties: false,
          properties: {
            reason: {
              type: 'string',
              minLength: 1,
              maxLength: 256,
              pattern: '^[^\\u0000]*$',
              description: 'a review reason, or a prefix of reasons ending with :',
            },
            tool: { type: 'string', minLength: 1, maxLength: 256 },
            older_than_s: { type: 'number', minimum: 0, maximum: 31_536_000 },
            limit: { type: 'integer', minimum: 1, maximum: 500, default: 100 },
          },
        },
        response: {
          200: {
            type: 'object',
            required: ['ok', 'operations', 'total', 'truncated'],
            properties: {
              ok: { const: true },
              operations: { type: 'array', items: inReview },
              total: { type: 'integer', description: 'how many matched, the limit aside' },
              truncated: { type: 'boolean' },
            },
          },
        },
      },
    },
    async (request) => {
      const caller = callerOf(request);
      if (!holds(deps, caller, 'read') && !holds(deps, caller, 'review'))
        throw new ActionLedgerError('permission_denied', 'none of your roles may read or review', {
          details: { capability: 'read' },
        });
      const q = request.query;
      const listing = await listInReview(deps.config, deps.pool, {
        tenant: caller.tenant_id,
        limit: q.limit,
        ...(q.reason === undefined ? {} : { reason: q.reason }),
        ...(q.tool === undefined ? {} : { tool: identifier('tool', q.tool) }),
        ...(q.older_than_s === undefined ? {} : { olderThanS: q.older_than_s }),
      });
      return { ok: true, ...listing };
    },
  );
}
