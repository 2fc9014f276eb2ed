/**
 * Approvals, for the people who decide them: list the caller's tenant's approvals, show one exact envelope
 * and its sha256, approve it with the hash that was shown, or reject it with a reason. Who may decide is the
 * gate's rule (the tool's approver roles, not revoked, never the requester, never twice); these routes only
 * name the reviewer (the caller, in its tenant, with its role) and turn the gate's refusals into statuses.
 * A caller holding `read` sees every approval of its tenant; a caller holding only approver roles sees the
 * approvals of the tools it may decide. Anything else, another tenant's approval included, is `not_found`.
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { ActionLedgerError, ERROR_CODES } from '../../../core/errors.js';
import { identifier } from '../../../core/identifier.js';
import { APPROVAL_STATUSES, listApprovals, type GateResult } from '../../../gate/index.js';
import { callerOf, holds, reviewerOf } from '../auth.js';
import type { ApiApp, ApiDeps, Caller, SchemaTypes } from '../types.js';

const NOT_FOUND = 'no such approval';

const idParam = {
  type: 'object',
  required: ['id'],
  additionalProperties: false,
  properties: { id: { type: 'string', minLength: 1, maxLength: 300, description: 'the approval id' } },
} as const;

const roleField = {
  type: 'string',
  minLength: 1,
  maxLength: 256,
  description: 'the approver role you act with; needed only when you hold several roles here',
} as const;

/** The body of an approval (exported with the other request schemas for the test that pins their types). */
export const approveBody = {
  type: 'object',
  additionalProperties: false,
  required: ['envelope_sha256'],
  properties: {
    envelope_sha256: { type: 'string', pattern: '^[0-9a-f]{64}$' },
    role: roleField,
    acknowledge_hidden_characters: {
      type: 'boolean',
      description:
        'true when the envelope holds characters a reader would not see as written (default-ignorable, bidi controls, format characters, combining overlays: `hidden_characters`, each listed with its code and JSON pointer in the refusal) and you approve it having read them by their codes',
    },
  },
} as const;

const rejectBody = {
  type: 'object',
  additionalProperties: false,
  required: ['reason'],
  properties: { reason: { type: 'string', minLength: 1, maxLength: 1000 }, role: roleField },
} as const;

export const approvalListQuery = {
  type: 'object',
  additionalProperties: false,
  properties: {
    status: { type: 'string', enum: [...APPROVAL_STATUSES, 'all'], default: 'pending' },
    tool: { type: 'string', minLength: 1, maxLength: 256 },
    limit: { type: 'integer', minimum: 1, maximum: 200, default: 50 },
    cursor: { type: 'string', minLength: 1, maxLength: 200, description: 'next_cursor of the page before' },
  },
} as const;

const summary = {
  type: 'object',
  required: ['approval_id', 'status', 'tool_name', 'requester_id', 'envelope_sha256', 'created_at', 'expires_at'],
  properties: {
    approval_id: { type: 'string' },
    status: { type: 'string', enum: APPROVAL_STATUSES },
    tool_name: { type: 'string' },
    requester_id: { type: 'string' },
    requester_role: { type: 'string' },
    effect: { type: 'string', description: 'the effect in words, as the envelope states it' },
    envelope_sha256: { type: 'string' },
    required_approvals: { type: 'integer' },
    approvers: { type: 'array', items: { type: 'string' } },
    reason: { type: ['string', 'null'] },
    operation_id: { type: ['string', 'null'] },
    created_at: { type: 'string', format: 'date-time' },
    expires_at: { type: 'string', format: 'date-time' },
    past_ttl: { type: 'boolean', description: 'past its TTL: it can no longer be approved' },
  },
} as const;

/** One reason the caller cannot approve now (gate/approval-blockers.ts). */
const blocker = {
  type: 'object',
  required: ['code', 'message', 'details'],
  properties: {
    code: {
      type: 'string',
      enum: Object.keys(ERROR_CODES),
      description:
        'invalid_state_transition, approval_expired, tool_disabled, config_invalid or reapproval_required (the approval itself); self_approval_forbidden (details.reason requester or already_approved); permission_denied (no approver role, details.roles and approver_roles); approval_hash_mismatch',
    },
    message: { type: 'string' },
    details: { type: 'object', additionalProperties: true },
  },
} as const;

const gateResult = {
  type: 'object',
  required: ['ok', 'status', 'message'],
  properties: {
    ok: { const: true },
    status: { type: 'string', enum: ['approved', 'pending_approvals', 'reserved', 'rejected'] },
    operation_id: { type: 'string' },
    effect_key: { type: 'string' },
    created: { type: 'boolean' },
    operation_status: { type: 'string' },
    request_id: { type: 'string', description: 'the approval id' },
    message: { type: 'string' },
  },
} as const;

/** The tools whose approvals the caller may decide in its tenant (one of its roles is an approver role). */
function decidable(deps: ApiDeps, caller: Caller): string[] {
  return [...deps.config.gate.tools.values()]
    .filter((t) => caller.roles.some((r) => t.approverRoles.has(r)))
    .map((t) => t.name);
}

/** The tools whose approvals the caller may see: null for every tool (`read`). Throws `permission_denied`. */
function visibleTools(deps: ApiDeps, caller: Caller): string[] | null {
  if (holds(deps, caller, 'read')) return null;
  const tools = decidable(deps, caller);
  if (tools.length === 0)
    throw new ActionLedgerError('permission_denied', 'none of your roles may read or decide approvals', {
      details: { capability: 'read' },
    });
  return tools;
}

/** The caller as the reviewer of a decision. Throws `permission_denied` when none of its roles decides any approval. */
function decider(deps: ApiDeps, request: FastifyRequest, role: string | undefined) {
  if (decidable(deps, callerOf(request)).length === 0)
    throw new ActionLedgerError('permission_denied', 'none of your roles may decide approvals', {
      details: { reason: 'no_approver_role' },
    });
  return reviewerOf(request, role);
}

/** A decision's answer: the gate's result when it allowed, else its refusal as the coded error. */
function answer(r: GateResult) {
  if (r.ok) return r;
  const details = { ...r.details, ...(r.request_id === undefined ? {} : { request_id: r.request_id }) };
  throw new ActionLedgerError(r.error, r.message, Object.keys(details).length === 0 ? {} : { details });
}

export function registerApprovalRoutes(untyped: FastifyInstance, deps: ApiDeps): void {
  const app = untyped.withTypeProvider<SchemaTypes>();
  registerList(app, deps);
  registerShow(app, deps);
  registerDecisions(app, deps);
}

function registerShow(app: ApiApp, deps: ApiDeps): void {
  app.get(
    '/v1/approvals/:id',
    {
      config: { operationId: 'getApproval', errors: ['not_found'] },
      schema: {
        summary: 'One approval: the exact envelope to decide on and its sha256 (send it back to approve)',
        tags: ['approvals'],
        params: idParam,
        response: {
          200: {
            type: 'object',
            required: ['ok', 'approval_id', 'status', 'envelope', 'envelope_sha256', 'approvers', 'blockers'],
            properties: {
              ok: { const: true },
              approval_id: { type: 'string' },
              status: { type: 'string', enum: APPROVAL_STATUSES },
              envelope: { type: 'object', additionalProperties: true },
              envelope_sha256: { type: 'string' },
              approvers: { type: 'array', items: { type: 'string' } },
              reason: { type: ['string', 'null'] },
              operation_id: { type: ['string', 'null'] },
              blockers: {
                type: 'array',
                items: blocker,
                description:
                  'why you cannot approve it now, each the code approving would be refused with (empty: you may). Hidden characters are not a blocker: approving them takes acknowledge_hidden_characters',
              },
            },
          },
        },
      },
    },
    async (request) => {
      const caller = callerOf(request);
      const tools = visibleTools(deps, caller);
      const view = await deps.gate.approvals.show(request.params.id, caller);
      if (tools !== null && !tools.includes(view.envelope.tool as string))
        throw new ActionLedgerError('not_found', NOT_FOUND);
      return { ok: true, ...view, blockers: await deps.gate.approvals.blockers(view.approval_id, caller) };
    },
  );
}

function registerDecisions(app: ApiApp, deps: ApiDeps): void {
  app.post(
    '/v1/approvals/:id/approve',
    {
      config: {
        operationId: 'approveApproval',
        errors: [
          'not_found',
          'invalid_context',
          'approval_hash_mismatch',
          'self_approval_forbidden',
          'hidden_characters',
          'approval_expired',
          'invalid_state_transition',
          'config_invalid',
          // the last approval needed executes it: today's state again
          'reapproval_required',
          'tool_disabled',
          'operation_conflict',
        ],
      },
      schema: {
        summary: 'Approve with the envelope hash you were shown; the last approver needed reserves the operation',
        tags: ['approvals'],
        params: idParam,
        body: approveBody,
        response: { 200: gateResult },
      },
    },
    async (request) => {
      const reviewer = decider(deps, request, request.body.role);
      return answer(
        await deps.gate.approve(request.params.id, request.body.envelope_sha256, reviewer, {
          acknowledgeHiddenCharacters: request.body.acknowledge_hidden_characters === true,
        }),
      );
    },
  );
  app.post(
    '/v1/approvals/:id/reject',
    {
      config: {
        operationId: 'rejectApproval',
        errors: ['not_found', 'invalid_context', 'approval_expired', 'invalid_state_transition'],
      },
      schema: {
        summary: 'Reject with a reason; final',
        tags: ['approvals'],
        params: idParam,
        body: rejectBody,
        response: { 200: gateResult },
      },
    },
    async (request) => {
      const reviewer = decider(deps, request, request.body.role);
      return answer(await deps.gate.reject(request.params.id, reviewer, request.body.reason));
    },
  );
}

function registerList(app: ApiApp, deps: ApiDeps): void {
  app.get(
    '/v1/approvals',
    {
      config: { operationId: 'listApprovals', errors: ['invalid_context', 'unknown_tool'] },
      schema: {
        summary: 'Approvals of your tenant, oldest first, in pages (pending ones unless told otherwise)',
        tags: ['approvals'],
        querystring: approvalListQuery,
        response: {
          200: {
            type: 'object',
            required: ['ok', 'approvals', 'next_cursor'],
            properties: {
              ok: { const: true },
              approvals: { type: 'array', items: summary },
              next_cursor: { type: ['string', 'null'], description: 'null on the last page' },
            },
          },
        },
      },
    },
    async (request) => {
      const caller = callerOf(request);
      const q = request.query;
      let tools = visibleTools(deps, caller);
      if (q.tool !== undefined) {
        const tool = identifier('tool', q.tool);
        if (deps.gate.tool(tool) === undefined)
          throw new ActionLedgerError('unknown_tool', `no tool ${JSON.stringify(tool)} is configured`, {
            details: { tool },
          });
        tools = tools === null || tools.includes(tool) ? [tool] : [];
      }
      const page = await listApprovals(deps.pool, deps.config.schemaQuoted, {
        tenant_id: caller.tenant_id,
        ...(q.status === 'all' ? {} : { status: q.status }),
        tools,
        limit: q.limit,
        ...(q.cursor === undefined ? {} : { cursor: q.cursor }),
      });
      return { ok: true, ...page };
    },
  );
}
