/**
 * `POST /v1/calls`: one tool call through the gate's whole pipeline, as the agent runtime makes it. The
 * trusted context is built from the caller's token (server/api/auth.ts `gateContext`), never from the
 * arguments: the tenant is the token's, the principal the caller's own, or with `user` (capability
 * `act_for_users`) the end user's it acts for. The answer is the gate's result as it is, status 200 for every
 * one of them, refusals and holds included: they are what the model reads and answers from. The caller's own
 * mistakes are HTTP errors (no token, a role it does not hold, `user` without `act_for_users`, a body that does
 * not match the schema), and so is a failure that is no decision about the call: a database that refuses the
 * write is 503 with its code (`storage_full`, `database_read_only`, ...) and Retry-After.
 */
import type { FastifyInstance } from 'fastify';
import { ERROR_CODES } from '../../../core/errors.js';
import { OPERATION_STATUSES } from '../../../core/types.js';
import { callIdentitySchema, gateContext } from '../auth.js';
import { gateDecision } from '../errors.js';
import type { ApiDeps, SchemaTypes } from '../types.js';

/** The gate's answer (gate/types.ts `GateResult`): `ok: true` with a status, or a refusal or hold with its code. */
export const gateResultSchema = {
  description: "the gate's answer: ok true with a status, or ok false with the refusal (or hold) the model reads",
  type: 'object',
  required: ['ok', 'message'],
  properties: {
    ok: { type: 'boolean' },
    status: {
      type: 'string',
      enum: ['reserved', 'approved', 'confirmed', 'cancelled', 'rejected', 'pending_approvals'],
      description: 'with ok true: reserved (in the ledger), confirmed (a proposal awaiting execute), ...',
    },
    operation_id: { type: 'string', format: 'uuid' },
    effect_key: { type: 'string' },
    created: { type: 'boolean', description: 'false when this step was already reserved: the same operation' },
    operation_status: { type: 'string', enum: [...OPERATION_STATUSES] },
    error: { type: 'string', enum: Object.keys(ERROR_CODES), description: 'with ok false: the refusal or hold' },
    message: { type: 'string' },
    details: { type: 'object', additionalProperties: true },
    retry_after_s: { type: 'integer' },
    request_id: {
      type: 'string',
      description: 'the proposal or approval id (confirmation_required, approval_required)',
    },
    confirm_token: {
      type: 'string',
      description:
        'with confirmation_required, returned this once: confirm with it in a later turn, as the same principal',
    },
    envelope_sha256: { type: 'string', description: 'with approval_required: the hash an approver confirms' },
    expires_at: { type: 'string', format: 'date-time' },
  },
} as const;

/** The identity fields a gate call's or proposal action's body must hold (the rest are optional). */
export const IDENTITY_REQUIRED = ['task_id', 'workflow_step_id'] as const;

/** How the trusted context is built from the token and the identity fields (for the routes' descriptions). */
export const IDENTITY_NOTE =
  'The tenant is always your token’s. Without `user` you act as yourself: your principal and account, the role you name in `role` (one you hold here; optional when you hold one), the conversation `conversation_id` (default: the task) and the turn `turn_id` (default: this request). With `user` (capability act_for_users) the context is that end user’s, in your tenant; `role`, `conversation_id` and `turn_id` are then the user’s own fields.';

/** The body of a tool call. */
export const callBody = {
  type: 'object',
  additionalProperties: false,
  required: ['tool', 'arguments', ...IDENTITY_REQUIRED],
  properties: {
    tool: { type: 'string', minLength: 1, maxLength: 256, description: 'one of the configured gate tools' },
    arguments: {
      description:
        'the tool’s arguments as the model wrote them; anything the tool’s schema does not accept is the gate’s invalid_arguments refusal (200)',
    },
    ttl_s: {
      type: 'integer',
      minimum: 1,
      maximum: 86400,
      description: 'for a proposal: a shorter confirmation window than configured (never longer)',
    },
    ...callIdentitySchema,
  },
} as const;

export function registerCallRoutes(untyped: FastifyInstance, deps: ApiDeps): void {
  const app = untyped.withTypeProvider<SchemaTypes>();
  app.post(
    '/v1/calls',
    {
      config: { operationId: 'callTool', errors: ['invalid_context', 'config_invalid'], gateAudited: true },
      schema: {
        summary: 'Call a tool through the gate: reserved, refused, or held for a confirmation or an approval',
        description: [
          'Runs the gate’s pipeline (role, kill switch, rate, arguments, business checks, caps) and answers 200 with its result, refusals and holds included: `ok: false` with `error` is what the model reads (permission_denied for a role the tool does not list, confirmation_required with a one-time `confirm_token`, approval_required with the approval id in `request_id`, ...).',
          'A failure that is no decision about the call is an HTTP error with the error body: 503 (with Retry-After) while the database refuses the write (storage_full, database_read_only, database_unavailable, audit_unavailable, ...), 500 internal.',
          'The same workflow step called again with the same arguments is the same operation (`created: false`), however many calls race.',
          IDENTITY_NOTE,
        ].join('\n\n'),
        tags: ['calls'],
        body: callBody,
        response: { 200: gateResultSchema },
      },
    },
    async (request) => {
      const body = request.body;
      const context = gateContext(deps, request, body);
      const result = await deps.gate.call(
        context,
        body.tool,
        body.arguments,
        body.ttl_s === undefined ? {} : { ttl_s: body.ttl_s },
      );
      // A tool name the configuration does not know is one label, so hostile names cannot grow the series.
      const tool = deps.gate.tool(body.tool) === undefined ? 'unknown' : body.tool;
      deps.metrics?.gateCalls.inc({ tool, outcome: result.ok ? 'allowed' : result.error });
      return gateDecision(result);
    },
  );
}
