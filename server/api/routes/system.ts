/**
 * Probes, metrics and status: `/healthz` (the process is up and its database is not known to be down),
 * `/readyz` (the database answers, holds every migration and takes writes; not stopping), `/metrics`, and
 * `/v1/status` (who the caller is, in which tenant, with which roles and capabilities).
 *
 * `/healthz` is liveness and stays 200 while the database refuses writes: restarting the process frees no disk
 * and promotes no primary, and a restart loop would only add a cold start to the outage. `/readyz` is 503 then
 * (`storage_full`, `database_read_only`, `database_unavailable`, from the write probe, server/write-probe.ts),
 * so a load balancer sends callers elsewhere, and it is 200 again by itself once a probe's write succeeds.
 */
import type { FastifyInstance } from 'fastify';
import { API_CAPABILITIES } from '../../../config/index.js';
import { asActionLedgerError } from '../../../core/errors.js';
import { OPENMETRICS_CONTENT_TYPE } from '../../../core/metrics.js';
import { checkMigrated, readMigrations } from '../../../db/index.js';
import { callerOf, holds } from '../auth.js';
import type { ApiDeps } from '../types.js';

const probe = {
  type: 'object',
  required: ['ok'],
  properties: {
    ok: { type: 'boolean' },
    error: { type: 'string', description: 'why not: a stable code (docs/errors.md)' },
    message: { type: 'string' },
    details: {
      type: 'object',
      description: 'for a database that refuses writes: since when, and the SQLSTATE when it gave one',
      properties: { since: { type: 'string', format: 'date-time' }, sqlstate: { type: 'string' } },
    },
  },
} as const;

export function registerSystemRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const migrations = readMigrations();
  const own = () => deps.health?.() ?? { error: null, stopping: false };
  app.get(
    '/healthz',
    {
      config: { public: true, operationId: 'getHealth', errors: [] },
      schema: { summary: 'The process is up', tags: ['system'], response: { 200: probe, 503: probe } },
    },
    async (_request, reply) => {
      const state = own();
      return state.error === null ? { ok: true } : reply.code(503).send({ ok: false, error: state.error });
    },
  );
  app.get(
    '/readyz',
    {
      config: { public: true, operationId: 'getReady', errors: [] },
      schema: {
        summary: 'The database answers, its schema is current and it takes writes; not stopping',
        tags: ['system'],
        response: { 200: probe, 503: probe },
      },
    },
    async (_request, reply) => {
      const state = own();
      if (state.error !== null) return reply.code(503).send({ ok: false, error: state.error });
      if (state.stopping) return reply.code(503).send({ ok: false, error: 'stopping' });
      try {
        const client = await deps.pool.connect();
        try {
          await checkMigrated(client, deps.config.schemaQuoted, migrations);
        } finally {
          client.release();
        }
      } catch (err) {
        return reply.code(503).send({ ok: false, error: asActionLedgerError(err).code });
      }
      const writes = deps.writes?.state();
      if (writes?.writable === false && writes.reason !== null)
        return reply.code(503).send({
          ok: false,
          error: writes.reason,
          message: `the database refuses writes (${writes.reason}); ready again once a write succeeds`,
          details: {
            since: writes.since.toISOString(),
            ...(writes.sqlstate === null ? {} : { sqlstate: writes.sqlstate }),
          },
        });
      return { ok: true };
    },
  );
  registerMetrics(app, deps);
  registerStatus(app, deps);
}

function registerMetrics(app: FastifyInstance, deps: ApiDeps): void {
  app.get(
    '/metrics',
    {
      config: { public: true, operationId: 'getMetrics', errors: [] },
      schema: { summary: 'Prometheus exposition', tags: ['system'] },
    },
    async (request, reply) => {
      await (deps.beforeScrape ?? (() => Promise.resolve()))().catch((err: unknown) =>
        deps.log.warn({ err }, 'scrape-time gauges failed'),
      );
      // OpenMetrics when the scraper prefers it (Prometheus lists it first by default, exemplars on or off), else
      // the text format; the same samples either way, only OpenMetrics carrying the histograms' exemplars (trace ids).
      const openMetrics = acceptsOpenMetrics(request.headers.accept);
      const exposition =
        deps.exposition ??
        (async ({ openMetrics }: { openMetrics: boolean }) =>
          openMetrics && deps.metrics !== undefined
            ? { contentType: OPENMETRICS_CONTENT_TYPE, body: await deps.metrics.openMetrics() }
            : {
                contentType: deps.metrics?.registry.contentType ?? 'text/plain',
                body: (await deps.metrics?.exposition()) ?? '',
              });
      const { contentType, body } = await exposition({ openMetrics });
      return reply
        .type(contentType)
        .serializer((s: unknown) => String(s))
        .send(body);
    },
  );
}

/**
 * Whether an Accept header prefers OpenMetrics text: listed with a quality above 0 and no lower than the text
 * format's (`text/plain`, `text/*` or any type, whichever is listed with the highest quality); a tie goes to
 * OpenMetrics, asked for by name. Other parameters (the version) are ignored.
 */
export function acceptsOpenMetrics(accept: string | undefined): boolean {
  if (accept === undefined) return false;
  let open = -1;
  let text = -1;
  for (const range of accept.split(',')) {
    const [type, ...params] = range.split(';').map((p) => p.trim().toLowerCase());
    const q = params.find((p) => p.startsWith('q='));
    const quality = q === undefined ? 1 : Number(q.slice(2).trim());
    if (!Number.isFinite(quality)) continue;
    if (type === 'application/openmetrics-text') open = Math.max(open, quality);
    else if (type === 'text/plain' || type === 'text/*' || type === '*/*') text = Math.max(text, quality);
  }
  return open > 0 && open >= text;
}

const statusResponse = {
  type: 'object',
  required: ['ok', 'principal_id', 'tenant_id', 'roles', 'capabilities', 'policy_version'],
  properties: {
    ok: { const: true },
    principal_id: { type: 'string' },
    kind: { type: 'string', enum: ['service', 'person'] },
    tenant_id: { type: 'string' },
    roles: { type: 'array', items: { type: 'string' } },
    capabilities: { type: 'array', items: { type: 'string', enum: [...API_CAPABILITIES] } },
    policy_version: { type: 'string' },
    token_id: { type: 'string' },
  },
} as const;

function registerStatus(app: FastifyInstance, deps: ApiDeps): void {
  app.get(
    '/v1/status',
    {
      config: { operationId: 'getStatus', errors: [] },
      schema: {
        summary: 'Who you are here: principal, tenant, roles and what they may do',
        tags: ['system'],
        response: { 200: statusResponse },
      },
    },
    (request, reply) => {
      const caller = callerOf(request);
      return reply.send({
        ok: true,
        principal_id: caller.principal_id,
        kind: caller.kind,
        tenant_id: caller.tenant_id,
        roles: caller.roles,
        capabilities: API_CAPABILITIES.filter((c) => holds(deps, caller, c)),
        policy_version: deps.config.gate.policyVersion,
        token_id: caller.token_id,
      });
    },
  );
}
