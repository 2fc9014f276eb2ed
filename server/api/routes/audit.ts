/**
 * The audit log of the caller's tenant (capability `audit`): every gate decision, approval, review action and
 * API request recorded there, newest first, filtered, in pages that list each row once. Rows of another
 * tenant, and rows that belong to no tenant, are never shown.
 */
import type { FastifyInstance } from 'fastify';
import { ISO_TIME_PATTERN, listAudit } from '../../../gate/index.js';
import { callerOf } from '../auth.js';
import type { ApiDeps, SchemaTypes } from '../types.js';

/** A filter's text: PostgreSQL cannot take NUL in a text parameter (it would be a 500), so it is refused here. */
const text = { type: 'string', minLength: 1, maxLength: 256, pattern: '^[^\\u0000]*$' } as const;

const row = {
  type: 'object',
  required: ['id', 'at', 'action', 'outcome', 'tenant_id', 'detail'],
  properties: {
    id: { type: 'string', description: 'the row id (ids only grow)' },
    at: { type: 'string', format: 'date-time' },
    action: { type: 'string' },
    outcome: { type: 'string' },
    tenant_id: { type: 'string' },
    principal_id: { type: ['string', 'null'] },
    role: { type: ['string', 'null'] },
    account_id: { type: ['string', 'null'] },
    conversation_id: { type: ['string', 'null'] },
    turn_id: { type: ['string', 'null'] },
    trace_id: { type: ['string', 'null'], description: 'the request id, for rows an API request wrote' },
    tool_name: { type: ['string', 'null'] },
    subject_id: { type: ['string', 'null'] },
    arguments: { description: 'redacted as the tool is configured' },
    detail: { type: 'object', additionalProperties: true },
    duration_ms: { type: ['number', 'null'] },
  },
} as const;

export function registerAuditRoutes(untyped: FastifyInstance, deps: ApiDeps): void {
  const app = untyped.withTypeProvider<SchemaTypes>();
  app.get(
    '/v1/audit',
    {
      config: { capability: 'audit', operationId: 'listAudit', errors: [] },
      schema: {
        summary: 'The audit log of your tenant, newest first, in pages',
        tags: ['audit'],
        querystring: {
          type: 'object',
          additionalProperties: false,
          properties: {
            action: text,
            outcome: text,
            tool: text,
            principal_id: text,
            subject_id: text,
            since: {
              type: 'string',
              pattern: ISO_TIME_PATTERN,
              description: 'only rows at or after this ISO 8601 time (with its offset)',
              example: '2026-01-31T09:00:00Z',
            },
            limit: { type: 'integer', minimum: 1, maximum: 500, default: 100 },
            cursor: { type: 'string', minLength: 1, maxLength: 100, description: 'next_cursor of the page before' },
          },
        },
        response: {
          200: {
            type: 'object',
            required: ['ok', 'rows', 'next_cursor'],
            properties: {
              ok: { const: true },
              rows: { type: 'array', items: row },
              next_cursor: { type: ['string', 'null'], description: 'null on the last page' },
            },
          },
        },
      },
    },
    async (request) => {
      const { limit, ...filters } = request.query;
      const page = await listAudit(deps.pool, deps.config.schemaQuoted, {
        ...filters,
        tenant_id: callerOf(request).tenant_id,
        limit,
      });
      return { ok: true, ...page };
    },
  );
}
