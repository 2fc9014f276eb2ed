/**
 * Kill switches of the caller's tenant (capability `kill_switch`): list, engage (one tool or `*`), lift. A
 * switch in another tenant is neither listed nor reachable; a `*` tenant switch is the operator's, from the
 * command line.
 */
import type { FastifyInstance } from 'fastify';
import { ActionLedgerError } from '../../../core/errors.js';
import { identifier } from '../../../core/identifier.js';
import { callerOf } from '../auth.js';
import type { ApiDeps, SchemaTypes } from '../types.js';

const switchRow = {
  type: 'object',
  required: ['tenant_id', 'tool_name', 'engaged_at', 'engaged_by', 'reason'],
  properties: {
    tenant_id: { type: 'string' },
    tool_name: { type: 'string', description: 'a configured tool, or * for every tool of the tenant' },
    engaged_at: { type: 'string', format: 'date-time' },
    engaged_by: { type: 'string' },
    reason: { type: 'string' },
  },
} as const;

const toolParam = {
  type: 'object',
  required: ['tool'],
  additionalProperties: false,
  properties: { tool: { type: 'string', minLength: 1, maxLength: 256, description: 'a configured tool, or *' } },
} as const;

const engageBody = {
  type: 'object',
  additionalProperties: false,
  required: ['reason'],
  // Operators read it in lists and alerts: no control, format or bidi-control character may reorder or hide it.
  properties: { reason: { type: 'string', minLength: 1, maxLength: 1000, pattern: '^[^\\p{Cc}\\p{Cf}]+$' } },
} as const;

const engagedResponse = {
  type: 'object',
  required: ['ok', 'tenant_id', 'tool', 'pending_held', 'executing', 'still_in_flight'],
  properties: {
    ok: { const: true },
    tenant_id: { type: 'string' },
    tool: { type: 'string' },
    pending_held: { type: 'integer' },
    executing: { type: 'integer' },
    still_in_flight: { type: 'integer' },
    wait_failed: { type: 'string' },
  },
} as const;

/**
 * The gate's refusal of a switch target lists every configured tenant and tool (for the operator's command
 * line); over the API that would tell a caller which other tenants exist: the code stays, the list goes.
 */
function withoutConfiguredNames(err: unknown): never {
  if (err instanceof ActionLedgerError && err.code === 'unknown_tenant')
    throw new ActionLedgerError('unknown_tenant', 'no tool is routed for your tenant');
  if (err instanceof ActionLedgerError && err.code === 'unknown_tool')
    throw new ActionLedgerError('unknown_tool', 'there is no such tool for your tenant (or * for every tool)');
  throw err;
}

export function registerKillSwitchRoutes(untyped: FastifyInstance, deps: ApiDeps): void {
  const app = untyped.withTypeProvider<SchemaTypes>();
  app.get(
    '/v1/kill-switches',
    {
      config: { capability: 'kill_switch', operationId: 'listKillSwitches', errors: [] },
      schema: {
        summary: 'The kill switches engaged in your tenant (including those covering every tenant)',
        tags: ['kill switches'],
        response: {
          200: {
            type: 'object',
            required: ['ok', 'kill_switches'],
            properties: { ok: { const: true }, kill_switches: { type: 'array', items: switchRow } },
          },
        },
      },
    },
    async (request) => {
      const tenant = callerOf(request).tenant_id;
      const all = await deps.gate.killSwitches();
      return { ok: true, kill_switches: all.filter((s) => s.tenant_id === tenant || s.tenant_id === '*') };
    },
  );
  app.put(
    '/v1/kill-switches/:tool',
    {
      config: {
        capability: 'kill_switch',
        operationId: 'engageKillSwitch',
        errors: ['invalid_context', 'unknown_tool', 'unknown_tenant'],
      },
      schema: {
        summary: 'Engage a kill switch for one tool (or * for all) in your tenant',
        description:
          'Committed with its audit row first; then waits for the covered operations already at the provider to have their outcomes.',
        tags: ['kill switches'],
        params: toolParam,
        body: engageBody,
        response: { 200: engagedResponse },
      },
    },
    async (request) => {
      const caller = callerOf(request);
      const tool = request.params.tool === '*' ? '*' : identifier('tool', request.params.tool);
      const waited = await deps.gate
        .engageKillSwitch(caller.tenant_id, tool, caller.principal_id, request.body.reason)
        .catch(withoutConfiguredNames);
      return { ok: true, tenant_id: caller.tenant_id, tool, ...waited };
    },
  );
  app.delete(
    '/v1/kill-switches/:tool',
    {
      config: { capability: 'kill_switch', operationId: 'liftKillSwitch', errors: ['invalid_context', 'not_found'] },
      schema: {
        summary: 'Lift the kill switch of one tool (or *) in your tenant; held operations are dispatched again',
        tags: ['kill switches'],
        params: toolParam,
        response: {
          200: {
            type: 'object',
            required: ['ok', 'tenant_id', 'tool'],
            properties: { ok: { const: true }, tenant_id: { type: 'string' }, tool: { type: 'string' } },
          },
        },
      },
    },
    async (request) => {
      const caller = callerOf(request);
      const tool = request.params.tool === '*' ? '*' : identifier('tool', request.params.tool);
      if (!(await deps.gate.liftKillSwitch(caller.tenant_id, tool, caller.principal_id)))
        throw new ActionLedgerError('not_found', `no kill switch is engaged for ${tool} in your tenant`);
      return { ok: true, tenant_id: caller.tenant_id, tool };
    },
  );
}
