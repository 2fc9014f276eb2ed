/**
 * A proposal's life after `POST /v1/calls` answered `confirmation_required`: confirm it with its one-time
 * token (in a later user turn than the call), execute it (the reservation, from the stored arguments), or
 * cancel it. Only the proposal's own principal may (its tenant and principal; a caller granted act_for_users
 * acts as the user it names). Each answers 200 with the gate's result, refusals included, except that a
 * proposal that is not the caller's (unknown, another tenant's, another principal's, or an id that is not one)
 * is 404 `proposal_not_found`: the same status and body whichever it is.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { ActionLedgerError } from '../../../core/errors.js';
import type { GateContext, GateResult } from '../../../gate/index.js';
import { callIdentitySchema, gateContext, type CallIdentity } from '../auth.js';
import { gateDecision } from '../errors.js';
import type { ApiApp, ApiDeps, SchemaTypes } from '../types.js';
import { gateResultSchema, IDENTITY_NOTE, IDENTITY_REQUIRED } from './calls.js';

const idParam = {
  type: 'object',
  required: ['id'],
  additionalProperties: false,
  properties: { id: { type: 'string', description: 'the request_id of the confirmation_required answer' } },
} as const;

const notFound = {
  description:
    'no such proposal of yours (unknown, another tenant’s, another principal’s, or not an id): always this body',
  type: 'object',
  required: ['ok', 'error', 'message'],
  properties: { ok: { const: false }, error: { const: 'proposal_not_found' }, message: { type: 'string' } },
} as const;

const responses = { 200: gateResultSchema, 404: notFound };

/** Who may act on a proposal, for the routes' descriptions. */
const OWNER_NOTE =
  'Only the proposal’s own principal may confirm, execute or cancel it: the principal whose call proposed it, in its tenant (a caller granted act_for_users acts as the user it names, so it reaches that user’s proposals only). Anyone else, in the tenant or not, gets 404 proposal_not_found, the answer to an unknown id.';

/**
 * The gate's result, 200; `proposal_not_found` is 404 with the same body; a failure that is no decision (the
 * database refused the write) is the HTTP error of its code, 503 with Retry-After.
 */
function answer(reply: FastifyReply, r: GateResult): FastifyReply {
  return reply.code(!r.ok && r.error === 'proposal_not_found' ? 404 : 200).send(gateDecision(r));
}

/**
 * The context of a proposal action: the caller must act with a role some tool lists (an auditor or a reader,
 * with no tool role at all, is 403 before the gate is asked). The gate then lets only the proposal's own
 * principal confirm, execute or cancel it; anyone else is the unknown id's 404.
 */
function proposalContext(deps: ApiDeps, request: FastifyRequest, body: CallIdentity): GateContext {
  const context = gateContext(deps, request, body);
  if (![...deps.config.gate.tools.values()].some((t) => t.roles.has(context.role)))
    throw new ActionLedgerError('permission_denied', `the role ${JSON.stringify(context.role)} may call no tool`, {
      details: { role: context.role },
    });
  return context;
}

const confirmBody = {
  type: 'object',
  additionalProperties: false,
  required: ['confirm_token', ...IDENTITY_REQUIRED],
  properties: {
    confirm_token: { type: 'string', minLength: 1, maxLength: 256 },
    ...callIdentitySchema,
  },
} as const;

const executeBody = {
  type: 'object',
  additionalProperties: false,
  required: [...IDENTITY_REQUIRED],
  properties: {
    arguments: { description: 'optional: must be the proposed arguments (compared by hash)' },
    ...callIdentitySchema,
  },
} as const;

const cancelBody = {
  type: 'object',
  additionalProperties: false,
  required: [...IDENTITY_REQUIRED],
  properties: { ...callIdentitySchema },
} as const;

export function registerProposalRoutes(untyped: FastifyInstance, deps: ApiDeps): void {
  const app = untyped.withTypeProvider<SchemaTypes>();
  registerConfirm(app, deps);
  registerExecuteAndCancel(app, deps);
}

function registerConfirm(app: ApiApp, deps: ApiDeps): void {
  app.post(
    '/v1/proposals/confirm',
    {
      config: { operationId: 'confirmProposal', errors: ['proposal_not_found', 'invalid_context'], gateAudited: true },
      schema: {
        summary: 'Confirm a proposal with its one-time token, in a later user turn than the call',
        description: [
          'Runs Gate.confirm. The turn is what makes this a confirmation: name the user turn it comes in (`turn_id`, or the user’s `turn_id`), a later one than the call’s; the same turn is refused proposal_same_turn_confirm. A token counts once (a second confirm is invalid_state_transition). A confirmation reserves nothing: execute does.',
          OWNER_NOTE,
          IDENTITY_NOTE,
        ].join('\n\n'),
        tags: ['proposals'],
        body: confirmBody,
        response: responses,
      },
    },
    async (request, reply) => {
      const body = request.body;
      // Defaulted to this request's id, the turn would always be a later one: the rule would hold nothing.
      if (body.user === undefined && body.turn_id === undefined)
        throw new ActionLedgerError(
          'invalid_request',
          'name the user turn this confirmation comes in: turn_id (a later turn than the call’s)',
          { details: { field: 'body.turn_id', problem: 'required' } },
        );
      return answer(reply, await deps.gate.confirm(body.confirm_token, proposalContext(deps, request, body)));
    },
  );
}

function registerExecuteAndCancel(app: ApiApp, deps: ApiDeps): void {
  app.post(
    '/v1/proposals/:id/execute',
    {
      config: {
        operationId: 'executeProposal',
        errors: ['proposal_not_found', 'invalid_context', 'config_invalid'],
        gateAudited: true,
      },
      schema: {
        summary: 'Execute a confirmed proposal: the reservation, from the arguments stored when it was proposed',
        description: [
          'Runs Gate.executeProposal. Idempotent: an executed proposal answers with its operation again. `arguments`, when given, are only compared with the proposed ones (params_mismatch, nothing reserved); the payload is always the stored one. The proposer’s role and the kill switches are checked again now.',
          OWNER_NOTE,
          IDENTITY_NOTE,
        ].join('\n\n'),
        tags: ['proposals'],
        params: idParam,
        body: executeBody,
        response: responses,
      },
    },
    async (request, reply) => {
      const body = request.body;
      const context = proposalContext(deps, request, body);
      const options = body.arguments === undefined ? {} : { args: body.arguments };
      return answer(reply, await deps.gate.executeProposal(request.params.id, context, options));
    },
  );

  app.post(
    '/v1/proposals/:id/cancel',
    {
      config: { operationId: 'cancelProposal', errors: ['proposal_not_found', 'invalid_context'], gateAudited: true },
      schema: {
        summary: 'Cancel a proposal that is proposed or confirmed (its holds on the caps are released)',
        description: ['Runs Gate.cancelProposal.', OWNER_NOTE, IDENTITY_NOTE].join('\n\n'),
        tags: ['proposals'],
        params: idParam,
        body: cancelBody,
        response: responses,
      },
    },
    async (request, reply) =>
      answer(reply, await deps.gate.cancelProposal(request.params.id, proposalContext(deps, request, request.body))),
  );
}
