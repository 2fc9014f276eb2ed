/**
 * The HTTP API (fastify 5: it validates with ajv and logs with pino, as the rest of actionledger does). Strict
 * JSON only (duplicate keys, NUL, lone surrogates and `__proto__` refused), bodies capped before they are read
 * whole, every route's input validated by its schema (no coercion in bodies, no extra properties), every error
 * the one structured body with its status (server/api/errors.ts). Every state-changing request an
 * authenticated caller makes is audited with its principal and request id: by the gate's own decision row
 * (the request id as its trace id) when a gate route answered 200, otherwise by an `api` row.
 */
import { randomUUID } from 'node:crypto';
import { Ajv } from 'ajv';
import Fastify, { type FastifyError, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import { ActionLedgerError, asActionLedgerError, type ErrorCode } from '../../core/errors.js';
import { parseStrictJson } from '../../core/json.js';
import { authenticateHook } from './auth.js';
import { DEFAULT_RETRY_AFTER_S, httpStatus, type ErrorBody } from './errors.js';
import { OpenApiCollector } from './openapi.js';
import type { ApiDeps } from './types.js';
import { registerSystemRoutes } from './routes/system.js';
import { registerKillSwitchRoutes } from './routes/kill-switches.js';
import { registerApprovalRoutes } from './routes/approvals.js';
import { registerReviewRoutes } from './routes/review.js';
import { registerAuditRoutes } from './routes/audit.js';
import { registerCallRoutes } from './routes/calls.js';
import { registerProposalRoutes } from './routes/proposals.js';
import { registerOperationRoutes } from './routes/operations.js';
import { registerMcpRoutes } from '../mcp/http.js';
import { registerConsole } from '../console/plugin.js';
import { registerSlackRoutes } from './routes/slack.js';

/** The route groups, in the order they are registered (each adds its routes to the OpenAPI document). */
const ROUTE_GROUPS: readonly ((app: FastifyInstance, deps: ApiDeps) => void)[] = [
  registerSystemRoutes,
  registerCallRoutes,
  registerProposalRoutes,
  registerOperationRoutes,
  registerApprovalRoutes,
  registerReviewRoutes,
  registerKillSwitchRoutes,
  registerAuditRoutes,
  registerMcpRoutes,
  registerSlackRoutes,
];

export interface Api {
  app: FastifyInstance;
  openapi: OpenApiCollector;
}

/** Builds the app (not listening): the routes, the hooks, the error handling. */
export async function buildApi(deps: ApiDeps, options: { https?: Record<string, unknown> | null } = {}): Promise<Api> {
  const app = Fastify({
    ...(options.https === undefined || options.https === null ? {} : { https: options.https }),
    bodyLimit: deps.config.api.maxBodyBytes,
    requestIdHeader: false,
    genReqId: () => randomUUID(),
    return503OnClosing: true,
    forceCloseConnections: true,
    routerOptions: { ignoreTrailingSlash: false, maxParamLength: 300 },
    // A path the router cannot decode (bad percent-encoding, a parameter over the length) is refused before
    // any hook runs: it still gets the one error body and a request id.
    frameworkErrors: (_err: Error, request: FastifyRequest, reply: FastifyReply): void => {
      void reply
        .code(400)
        .header('x-request-id', request.id)
        .header('cache-control', 'no-store')
        .send({ ok: false, error: 'invalid_request', message: 'the request path is malformed' });
    },
  }) as unknown as FastifyInstance;
  const openapi = new OpenApiCollector();
  app.addHook('onRoute', openapi.onRoute);
  setValidation(app);
  setBodyParsing(app, deps);
  app.addHook('onRequest', (request, reply, done) => {
    reply.header('x-request-id', request.id);
    reply.header('cache-control', 'no-store');
    done();
  });
  app.addHook('onRequest', authenticateHook(deps));
  app.addHook('onResponse', auditHook(deps));
  // The request rows still being written go in before whoever closed the app closes the pool.
  app.addHook('onClose', async () => {
    await deps.audit.settled();
  });
  app.addHook('onResponse', metricsHook(deps));
  app.setErrorHandler((err: FastifyError, request, reply) => sendError(deps, request, reply, err));
  app.setNotFoundHandler((request, reply) =>
    reply.code(404).send({
      ok: false,
      error: 'not_found',
      message: `no route ${request.method} ${(request.url.split('?')[0] ?? '').slice(0, 200)}`,
    }),
  );
  for (const register of ROUTE_GROUPS) register(app, deps);
  registerConsole(app, deps);
  app.get(
    '/v1/openapi.json',
    { config: { public: true, operationId: 'getOpenApi' }, schema: { summary: 'This document', tags: ['system'] } },
    (_request, reply) => reply.send(openapi.document({ title: 'actionledger', version: '1' })),
  );
  await app.ready();
  return { app, openapi };
}

/** Bodies: ajv without coercion, defaults or removal; path and query strings: coerced to their declared types. */
function setValidation(app: FastifyInstance): void {
  const strict = new Ajv({
    strict: true,
    allErrors: false,
    coerceTypes: false,
    useDefaults: false,
    removeAdditional: false,
  });
  const coercing = new Ajv({
    strict: true,
    allErrors: false,
    coerceTypes: true,
    useDefaults: true,
    removeAdditional: false,
  });
  for (const ajv of [strict, coercing]) ajv.addKeyword({ keyword: 'example' });
  app.setValidatorCompiler(({ schema, httpPart }) =>
    httpPart === 'body' ? strict.compile(schema) : coercing.compile(schema),
  );
  // Responses are JSON.stringify'd as they are: the response schemas document, they do not filter.
  app.setSerializerCompiler(() => (data) => JSON.stringify(data));
}

/** Only `application/json`, parsed strictly; a body over the cap is refused before it is read whole. */
function setBodyParsing(app: FastifyInstance, deps: ApiDeps): void {
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (_request, body, done) => {
    try {
      done(null, parseStrictJson(body, { bounds: { maxBytes: deps.config.api.maxBodyBytes, maxDepth: 64 } }));
    } catch (err) {
      done(err as Error, undefined);
    }
  });
  app.addContentTypeParser('*', (_request, _payload, done) =>
    done(new ActionLedgerError('unsupported_media_type', 'send the body as application/json'), undefined),
  );
}

/** fastify's own errors, as codes. */
function codeOf(err: FastifyError): ActionLedgerError {
  if (err instanceof ActionLedgerError) return err;
  if (err.validation !== undefined) {
    const first = err.validation[0];
    const where = err.validationContext ?? 'body';
    const field = first === undefined ? where : fieldOf(where, first.instancePath, first.params);
    return new ActionLedgerError('invalid_request', `${field} ${first?.message ?? 'is invalid'}`, {
      details: { field, problem: first?.keyword ?? 'invalid' },
    });
  }
  const codes: Record<string, [ErrorCode, string]> = {
    FST_ERR_CTP_BODY_TOO_LARGE: ['body_too_large', 'the body is over the cap'],
    FST_ERR_CTP_INVALID_MEDIA_TYPE: ['unsupported_media_type', 'send the body as application/json'],
    FST_ERR_CTP_INVALID_CONTENT_LENGTH: ['invalid_request', 'the content-length does not match the body'],
    FST_ERR_CTP_EMPTY_JSON_BODY: ['invalid_json', 'the body is empty'],
  };
  const known = err.code === undefined ? undefined : codes[err.code];
  if (known !== undefined) return new ActionLedgerError(known[0], known[1]);
  if (err.statusCode === 413) return new ActionLedgerError('body_too_large', 'the body is over the cap');
  if (err.statusCode === 415)
    return new ActionLedgerError('unsupported_media_type', 'send the body as application/json');
  if (err.statusCode !== undefined && err.statusCode >= 400 && err.statusCode < 500)
    return new ActionLedgerError('invalid_request', 'the request is malformed');
  return asActionLedgerError(err);
}

function fieldOf(where: string, instancePath: string, params: Record<string, unknown>): string {
  const extra =
    typeof params.additionalProperty === 'string'
      ? `/${params.additionalProperty}`
      : typeof params.missingProperty === 'string'
        ? `/${params.missingProperty}`
        : '';
  return `${where}${instancePath}${extra}`.replaceAll('/', '.');
}

function sendError(deps: ApiDeps, request: FastifyRequest, reply: FastifyReply, raw: FastifyError): FastifyReply {
  const err = codeOf(raw);
  const status = httpStatus(err.code);
  if (status >= 500)
    deps.log.error(
      { err: raw, code: err.code, request_id: request.id, route: request.routeOptions.url, details: err.details },
      'API request failed',
    );
  // A write refused by the database flips readiness now; the next successful probe flips it back.
  deps.writes?.report(err);
  const body: ErrorBody = { ok: false, error: err.code, message: status === 500 ? 'internal error' : err.message };
  if (err.details !== undefined && status !== 500) body.details = err.details;
  const retry = err.details?.retry_after_s;
  if (typeof retry === 'number') body.retry_after_s = retry;
  else if (status === 503) {
    // Nothing was written and it is worth repeating: about when the write probe looks again.
    body.retry_after_s = deps.writes?.retryAfterS ?? DEFAULT_RETRY_AFTER_S;
    reply.header('retry-after', String(body.retry_after_s));
  }
  return reply.code(status).send(body);
}

/** Audits every state-changing request of an authenticated caller: its principal, request id and status. */
function auditHook(deps: ApiDeps) {
  return async (request: FastifyRequest, reply: FastifyReply): Promise<void> => {
    if (request.method === 'GET' || request.method === 'HEAD' || request.caller === undefined) return;
    if (request.routeOptions.config.gateAudited === true && reply.statusCode === 200) return;
    await deps.audit.grouped({
      action: 'api',
      outcome: String(reply.statusCode),
      context: { tenant_id: request.caller.tenant_id, principal_id: request.caller.principal_id, trace_id: request.id },
      detail: {
        request_id: request.id,
        method: request.method,
        route: request.routeOptions.url ?? null,
        token_id: request.caller.token_id,
      },
    });
  };
}

/** Counts each answer by route pattern (unmatched paths as one label, so a scan cannot grow the series) and status. */
function metricsHook(deps: ApiDeps) {
  return (request: FastifyRequest, reply: FastifyReply, done: () => void): void => {
    const metrics = deps.metrics;
    if (metrics !== undefined) {
      const route = request.routeOptions.url ?? 'unmatched';
      metrics.apiRequests.inc({ route, method: request.method, status: String(reply.statusCode) });
      metrics.apiSeconds.observe({ route, method: request.method }, reply.elapsedTime / 1000);
    }
    done();
  };
}
