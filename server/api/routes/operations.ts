/**
 * Operations in the ledger: a direct reservation by a trusted service (capability `reserve`), one operation
 * with its history (capability `read`, or the operation's own principal), and the tenant's operations, newest
 * first, keyset-paged (capability `read`). Every read is scoped to the caller's tenant in SQL: another
 * tenant's operation is 404 with exactly the body an id never issued gets.
 */
import type { FastifyInstance } from 'fastify';
import { ActionLedgerError } from '../../../core/errors.js';
import { identifier } from '../../../core/identifier.js';
import { OPERATION_STATUSES, type TrustedContext } from '../../../core/types.js';
import { DirectReservations, OPERATION_PAGE, TenantLedgerView } from '../../../ledger/index.js';
import { callerOf, holds, requireCapability } from '../auth.js';
import type { ApiApp, ApiDeps, SchemaTypes } from '../types.js';

const text = { type: 'string', minLength: 1, maxLength: 256 } as const;

const idParam = {
  type: 'object',
  required: ['id'],
  additionalProperties: false,
  properties: { id: { type: 'string', description: 'the operation id' } },
} as const;

export const reserveBody = {
  type: 'object',
  additionalProperties: false,
  required: ['tool', 'arguments', 'task_id', 'workflow_step_id', 'approval_id', 'policy_version'],
  properties: {
    tool: { ...text, description: 'a tool with a provider route for your tenant' },
    arguments: { type: 'object', description: 'the tool’s arguments (one JSON object)' },
    task_id: text,
    workflow_step_id: { ...text, description: 'one operation per (principal, task, step)' },
    approval_id: { ...text, description: 'the approval (in your own system) that authorizes this step' },
    policy_version: { ...text, description: 'the policy version that approval was made under' },
    user: {
      type: 'object',
      additionalProperties: false,
      required: ['principal_id'],
      description: 'the end user the operation is for (capability act_for_users); default: yourself',
      properties: { principal_id: text },
    },
  },
} as const;

const reservedResponse = {
  type: 'object',
  required: ['ok', 'operation_id', 'effect_key', 'created', 'status'],
  properties: {
    ok: { const: true },
    operation_id: { type: 'string', format: 'uuid' },
    effect_key: { type: 'string' },
    created: { type: 'boolean', description: 'false: this step was reserved before, with these arguments' },
    status: { type: 'string', enum: [...OPERATION_STATUSES] },
  },
} as const;

const summary = {
  type: 'object',
  properties: {
    operation_id: { type: 'string', format: 'uuid' },
    tenant_id: { type: 'string' },
    principal_id: { type: 'string' },
    task_id: { type: 'string' },
    workflow_step_id: { type: 'string' },
    tool_name: { type: 'string' },
    provider_id: { type: 'string' },
    status: { type: 'string', enum: [...OPERATION_STATUSES] },
    attempt: { type: 'integer' },
    current_approval_id: { type: 'string' },
    current_policy_version: { type: 'string' },
    review_reason: { type: ['string', 'null'] },
    created_at: { type: 'string', format: 'date-time' },
    updated_at: { type: 'string', format: 'date-time' },
  },
} as const;

const historyRow = {
  type: 'object',
  properties: {
    id: { type: 'string' },
    from_status: { type: ['string', 'null'] },
    to_status: { type: 'string' },
    at: { type: 'string', format: 'date-time' },
    actor: { type: 'string' },
    reason: { type: 'string' },
    detail: {},
  },
} as const;

export const operationListQuery = {
  type: 'object',
  additionalProperties: false,
  properties: {
    status: { type: 'string', enum: [...OPERATION_STATUSES] },
    tool: text,
    task_id: text,
    principal_id: text,
    limit: {
      type: 'integer',
      minimum: OPERATION_PAGE.min,
      maximum: OPERATION_PAGE.max,
      default: OPERATION_PAGE.default,
      description: 'page size',
    },
    cursor: { type: 'string', minLength: 1, maxLength: 200, description: 'the next_cursor of the previous page' },
  },
} as const;

/** The one answer for every operation the caller may not see: unknown, malformed, another tenant's, not its own. */
const noSuchOperation = () => new ActionLedgerError('not_found', 'no such operation');

/** A filter's value, NFC like the identifiers it is compared with; absent stays absent. */
function optionalIdentifier(field: string, value: string | undefined): string | undefined {
  return value === undefined ? undefined : identifier(field, value);
}

export function registerOperationRoutes(untyped: FastifyInstance, deps: ApiDeps): void {
  const app = untyped.withTypeProvider<SchemaTypes>();
  registerReserve(app, deps, new DirectReservations(deps.pool, deps.config.schemaQuoted, deps.ledger));
  const view = new TenantLedgerView(deps.pool, deps.config.schemaQuoted);
  registerShow(app, deps, view);
  registerList(app, view);
}

function registerReserve(app: ApiApp, deps: ApiDeps, direct: DirectReservations): void {
  app.post(
    '/v1/operations',
    {
      config: {
        capability: 'reserve',
        operationId: 'reserveOperation',
        errors: [
          'invalid_context',
          'invalid_arguments',
          'operation_conflict',
          'route_not_approved',
          'tenant_wrong_cluster',
        ],
      },
      schema: {
        summary: 'Reserve an operation straight in the ledger (a trusted service; no gate checks)',
        description: [
          'The trusted-service path, as `actionledger reserve`: no role, cap, rate or approval check of the gate runs (an agent’s call goes through POST /v1/calls). The operation is your own principal’s in your token’s tenant, or with `user` (capability act_for_users) that user’s.',
          'Dispatch: the built-in authorization service allows a direct reservation only when the configuration’s gate.direct_reservations is allow. When it is deny (the default) the reservation is still accepted and answered here, and the authorization service refuses it at dispatch (it never reaches the provider).',
          'The same step with the same body again is the same operation (`created: false`); other arguments for the step are 409 operation_conflict, and so is a step the gate reserved.',
        ].join('\n\n'),
        tags: ['operations'],
        body: reserveBody,
        response: { 200: reservedResponse },
      },
    },
    async (request) => {
      const caller = callerOf(request);
      const body = request.body;
      if (body.user !== undefined) requireCapability(deps, caller, 'act_for_users');
      const context: TrustedContext = {
        tenant_id: caller.tenant_id,
        principal_id:
          body.user === undefined ? caller.principal_id : identifier('user.principal_id', body.user.principal_id),
        task_id: identifier('task_id', body.task_id),
        workflow_step_id: identifier('workflow_step_id', body.workflow_step_id),
        approval_id: identifier('approval_id', body.approval_id),
        policy_version: identifier('policy_version', body.policy_version),
      };
      const r = await direct.reserve(context, body.tool, body.arguments, { actor: `api:${caller.principal_id}` });
      return { ok: true, operation_id: r.operation_id, effect_key: r.effect_key, created: r.created, status: r.status };
    },
  );
}

function registerShow(app: ApiApp, deps: ApiDeps, view: TenantLedgerView): void {
  app.get(
    '/v1/operations/:id',
    {
      config: { operationId: 'getOperation', errors: ['not_found'] },
      schema: {
        summary: 'One operation of your tenant with its state history, oldest first',
        description:
          'Capability read, or the operation’s own principal. Any other operation (unknown, another tenant’s, not yours without read, or an id that is not one) is 404 not_found with the same body.',
        tags: ['operations'],
        params: idParam,
        response: {
          200: {
            type: 'object',
            required: ['ok', 'operation', 'history'],
            properties: {
              ok: { const: true },
              operation: { type: 'object', additionalProperties: true },
              history: { type: 'array', items: historyRow },
            },
          },
        },
      },
    },
    async (request) => {
      const caller = callerOf(request);
      const found = await view.show(caller.tenant_id, request.params.id).catch((err: unknown) => {
        throw err instanceof ActionLedgerError && err.code === 'not_found' ? noSuchOperation() : err;
      });
      if (!holds(deps, caller, 'read') && found.operation.principal_id !== caller.principal_id) throw noSuchOperation();
      return { ok: true, ...found };
    },
  );
}

function registerList(app: ApiApp, view: TenantLedgerView): void {
  app.get(
    '/v1/operations',
    {
      config: { capability: 'read', operationId: 'listOperations', errors: ['invalid_context'] },
      schema: {
        summary: 'Your tenant’s operations, newest first, a page at a time',
        description:
          'Filters combine (all must hold). Pass `next_cursor` back as `cursor` for the next page; it is null on the last. A cursor not given by this route is 422 invalid_request. An operation reserved after a page passed its place is not on the later pages.',
        tags: ['operations'],
        querystring: operationListQuery,
        response: {
          200: {
            type: 'object',
            required: ['ok', 'operations', 'next_cursor'],
            properties: {
              ok: { const: true },
              operations: { type: 'array', items: summary },
              next_cursor: { type: ['string', 'null'] },
            },
          },
        },
      },
    },
    async (request) => {
      const caller = callerOf(request);
      const q = request.query;
      const page = await view.list(
        caller.tenant_id,
        {
          status: q.status,
          tool: optionalIdentifier('tool', q.tool),
          task_id: optionalIdentifier('task_id', q.task_id),
          principal_id: optionalIdentifier('principal_id', q.principal_id),
        },
        { limit: q.limit, cursor: q.cursor },
      );
      return { ok: true, ...page };
    },
  );
}
