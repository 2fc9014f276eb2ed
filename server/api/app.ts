/**
 * The HTTP API (fastify 5: it validates with ajv and logs with pino, as the rest of actionledger does). Strict
 * JSON only (duplicate keys, NUL, lone surrogates and `__proto__` refused), bodies capped before they are read
 * whole, every route's input validated by its schema (no coercion in bodies, no extra properties), every error
 * the one structured body with its status (server/api/errors.ts). Every state-changing request an
 * authenticated caller makes is audited with its principal and request id: by the gate's own decision row
 * (the request id as its trace id) when a gate route answered 200, otherwise by an `api` row.
 *
 * Malformed requests get the same body and an `x-request-id` as every other answer, including those Node's
 * HTTP parser refuses before any route sees them (duplicate or conflicting Content-Length and
 * Transfer-Encoding, a bad chunk, headers over the size limit): {@link answerClientError} writes a raw
 * HTTP/1.1 answer and closes the connection; an `Expect` other than `100-continue`, which Node would answer
 * with a bare 417, is {@link answerExpectation}'s. Bodies are UTF-8 only (another charset is
 * `unsupported_media_type`, bytes that are not UTF-8 are refused, never replaced), and JSON nests at most
 * {@link bodyDepth} deep, checked on the text before it is parsed.
 */
import { randomUUID } from 'node:crypto';
import { STATUS_CODES, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { Transform, type Readable } from 'node:stream';
import { Ajv, type ValidateFunction } from 'ajv';
import Fastify, { type FastifyError, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import { ActionLedgerError } from '../../core/errors.js';
import { parseStrictJson } from '../../core/json.js';
import { authenticateHook } from './auth.js';
import { registerTracing } from './tracing.js';
import { tracingOn } from '../../core/tracing.js';
import { DEFAULT_RETRY_AFTER_S, httpStatus, type ErrorBody } from './errors.js';
import { frameworkError } from './framework-errors.js';
import { OpenApiCollector } from './openapi.js';
import { declaredErrorsHook } from './route-errors.js';
import type { ApiDeps, Caller } from './types.js';
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
  // A request without Host is refused by wellFormedHook, in the one error body, not by Node with an empty 400.
  const server = { requireHostHeader: false };
  const app = Fastify({
    ...(options.https === undefined || options.https === null
      ? { http: server }
      : { https: { ...options.https, ...server } }),
    clientErrorHandler: answerClientError,
    bodyLimit: deps.config.api.maxBodyBytes,
    requestIdHeader: false,
    genReqId: () => randomUUID(),
    return503OnClosing: true,
    forceCloseConnections: true,
    routerOptions: { ignoreTrailingSlash: false, maxParamLength: 300 },
    // A path the router cannot decode (bad percent-encoding, a parameter over the length) is refused before
    // any hook runs: it still gets the one error body and a request id, 400 like the parser's own refusals.
    frameworkErrors: (err: Error, request: FastifyRequest, reply: FastifyReply): void => {
      const coded = frameworkError(err);
      void reply
        .code(400)
        .header('x-request-id', request.id)
        .header('cache-control', 'no-store')
        .send({ ok: false, error: coded.code, message: coded.message });
    },
  }) as unknown as FastifyInstance;
  app.server.on('checkExpectation', answerExpectation);
  const openapi = new OpenApiCollector();
  app.addHook('onRoute', openapi.onRoute);
  setValidation(app);
  setBodyParsing(app, deps);
  // Only while tracing is on: off, no hook is registered and a request costs nothing more (server/api/tracing.ts).
  if (tracingOn()) registerTracing(app, options.https !== undefined && options.https !== null);
  app.addHook('onRequest', wellFormedHook);
  app.addHook('preParsing', bodyEncodingHook);
  app.addHook('onRequest', authenticateHook(deps));
  app.addHook('onResponse', auditHook(deps));
  // The request rows still being written go in before whoever closed the app closes the pool.
  app.addHook('onClose', async () => {
    await deps.audit.settled();
  });
  app.addHook('onResponse', metricsHook(deps));
  app.addHook('onSend', declaredErrorsHook(deps.log, deps.declaredErrors ?? 'warn', deps.onUndeclaredError));
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
    {
      config: { public: true, operationId: 'getOpenApi', errors: [] },
      schema: { summary: 'This document', tags: ['system'] },
    },
    (_request, reply) => reply.send(openapi.document({ title: 'actionledger', version: '1' })),
  );
  await app.ready();
  return { app, openapi };
}

/**
 * Bodies: ajv without coercion, defaults or removal; path and query strings: coerced to their declared types.
 * Compiled once per process and schema (by its text): every app built in a process (a second server, a test's
 * fixtures) reuses them, where compiling the routes' schemas again was about 0.3 s of CPU for each.
 */
let validators: { strict: Ajv; coercing: Ajv; compiled: Map<string, ValidateFunction> } | undefined;

function validatorFor(schema: unknown, httpPart: string | undefined): ValidateFunction {
  if (validators === undefined) {
    const options = { strict: true, allErrors: false, removeAdditional: false } as const;
    const strict = new Ajv({ ...options, coerceTypes: false, useDefaults: false });
    const coercing = new Ajv({ ...options, coerceTypes: true, useDefaults: true });
    for (const ajv of [strict, coercing]) ajv.addKeyword({ keyword: 'example' });
    validators = { strict, coercing, compiled: new Map() };
  }
  const { strict, coercing, compiled } = validators;
  const body = httpPart === 'body';
  const key = `${body ? 'strict' : 'coercing'} ${JSON.stringify(schema)}`;
  let validate = compiled.get(key);
  if (validate === undefined) {
    validate = (body ? strict : coercing).compile(schema as object);
    compiled.set(key, validate);
  }
  return validate;
}

function setValidation(app: FastifyInstance): void {
  app.setValidatorCompiler(({ schema, httpPart }) => validatorFor(schema, httpPart));
  // Responses are JSON.stringify'd as they are: the response schemas document, they do not filter (fastify asks
  // for each route's serializer once, at start; a gate result's takes about 1 µs, and fast-json-stringify would
  // drop what a schema does not name).
  app.setSerializerCompiler(() => (data) => JSON.stringify(data));
}

/**
 * The deepest a JSON body may nest: 64, or more when the configured argument bound (`arguments.max_depth`) needs
 * it, so any arguments the gate takes fit in a call's body and in an MCP message (a batch, its params, the
 * arguments: four levels above them).
 */
export function bodyDepth(config: ApiDeps['config']): number {
  return Math.max(64, config.argumentBounds.maxDepth + 4);
}

/** Only `application/json`, parsed strictly; a body over the cap is refused before it is read whole. */
function setBodyParsing(app: FastifyInstance, deps: ApiDeps): void {
  const bounds = { maxBytes: deps.config.api.maxBodyBytes, maxDepth: bodyDepth(deps.config) };
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (_request, body, done) => {
    try {
      done(null, parseStrictJson(body, { bounds }));
    } catch (err) {
      done(err as Error, undefined);
    }
  });
  app.addContentTypeParser('*', (_request, _payload, done) =>
    done(new ActionLedgerError('unsupported_media_type', 'send the body as application/json'), undefined),
  );
}

/**
 * The answer to a request Node's HTTP parser refused (llhttp: a duplicate or conflicting Content-Length, both
 * Content-Length and Transfer-Encoding, a Transfer-Encoding other than chunked, a malformed chunk or request
 * line, headers over the size limit) or that did not arrive in time: the one error body with a request id of its
 * own, written raw, and the connection closed (the rest of its bytes cannot be trusted to frame a next request).
 * Nothing is written when a response on that connection has already begun; the connection is closed.
 */
export function answerClientError(err: NodeJS.ErrnoException, socket: Socket): void {
  if (err.code === 'ECONNRESET' || err.code === 'EPIPE' || socket.destroyed) return;
  const inFlight = (socket as Socket & { _httpMessage?: ServerResponse | null })._httpMessage;
  if (!socket.writable || (inFlight?.headersSent ?? false)) {
    socket.destroy();
    return;
  }
  const [status, message] =
    err.code === 'HPE_HEADER_OVERFLOW'
      ? [431, 'the request headers are over the size limit']
      : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
        ? [408, 'the request did not arrive in time']
        : [
            400,
            `the request is not well-formed HTTP/1.1 (${CLIENT_ERRORS[err.code ?? ''] ?? 'the parser refused it'})`,
          ];
  const body = JSON.stringify({
    ok: false,
    error: 'invalid_request',
    message,
    details: { problem: /^[A-Z_]{1,64}$/.test(err.code ?? '') ? err.code : 'malformed' },
  });
  const head = [
    `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? ''}`,
    'content-type: application/json; charset=utf-8',
    `content-length: ${Buffer.byteLength(body)}`,
    `x-request-id: ${randomUUID()}`,
    'cache-control: no-store',
    'connection: close',
  ].join('\r\n');
  // Closed once written; a peer that does not read is cut off after a while.
  socket.setTimeout(5_000, () => socket.destroy());
  socket.end(`${head}\r\n\r\n${body}`, () => socket.destroy());
}

/**
 * The answer to a request whose `Expect` is not `100-continue` (Node asks the server's `checkExpectation`
 * listener instead of answering a bare 417): `417` `expectation_failed` in the one error body, with a request
 * id, and the connection closed (whether the client sends the body it announced is not known). Nothing else of
 * the request is read.
 */
export function answerExpectation(_request: IncomingMessage, response: ServerResponse): void {
  const body = JSON.stringify({
    ok: false,
    error: 'expectation_failed',
    message: 'the only expectation this server meets is Expect: 100-continue',
    details: { field: 'expect' },
  });
  response
    .writeHead(417, {
      'content-type': 'application/json; charset=utf-8',
      'content-length': Buffer.byteLength(body),
      'x-request-id': randomUUID(),
      'cache-control': 'no-store',
      connection: 'close',
    })
    .end(body);
}

/** What llhttp's codes mean, for the message (the code itself is `details.problem`). */
const CLIENT_ERRORS: Record<string, string> = {
  HPE_UNEXPECTED_CONTENT_LENGTH: 'Content-Length with Transfer-Encoding, or Content-Length sent twice',
  HPE_INVALID_CONTENT_LENGTH: 'a malformed Content-Length',
  HPE_INVALID_TRANSFER_ENCODING: 'a Transfer-Encoding that does not end in chunked',
  HPE_INVALID_CHUNK_SIZE: 'a malformed chunk size',
  HPE_INVALID_METHOD: 'an unknown method',
  HPE_INVALID_URL: 'a malformed request target',
  HPE_INVALID_VERSION: 'not HTTP/1.x',
  HPE_INVALID_HEADER_TOKEN: 'a malformed header',
  HPE_INVALID_CONSTANT: 'a malformed request line',
  HPE_LF_EXPECTED: 'a line not ended by CRLF',
  HPE_CR_EXPECTED: 'a line not ended by CRLF',
  HPE_CLOSED_CONNECTION: 'data after a request that closed the connection',
};

/**
 * Every answer's `x-request-id` and `cache-control: no-store`, then the header lines a request must send exactly
 * once: Host (required in every version, HTTP/1.0 included: Node would answer a missing one with an empty 400 in
 * HTTP/1.1 and accept it in HTTP/1.0), and Content-Type at most once (Node keeps the first of several; which one
 * the body is was not said). Refused `invalid_request` 400 with the connection closed. A repeated Authorization
 * is refused by the authentication (server/api/auth.ts).
 */
function wellFormedHook(request: FastifyRequest, reply: FastifyReply, done: () => void): void {
  reply.header('x-request-id', request.id);
  reply.header('cache-control', 'no-store');
  const raw = request.raw;
  const problem = raw.headers.host === undefined ? 'the Host header is missing' : repeatedHeader(raw.rawHeaders);
  if (problem === null) {
    done();
    return;
  }
  request.refusedMalformed = true;
  void reply
    .code(400)
    .header('connection', 'close')
    .send({ ok: false, error: 'invalid_request', message: problem, details: { problem: 'malformed_headers' } });
}

/** Which of Host and Content-Type the request sent more than once (Host first), in one pass; null for neither. */
function repeatedHeader(rawHeaders: readonly string[]): string | null {
  let host = 0;
  let contentType = 0;
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i];
    // Only a name of the right length is lowered and compared (`host`: 4, `content-type`: 12).
    if (name?.length === 4 && name.toLowerCase() === 'host') host++;
    else if (name?.length === 12 && name.toLowerCase() === 'content-type') contentType++;
  }
  if (host > 1) return 'the Host header was sent more than once';
  if (contentType > 1) return 'the Content-Type header was sent more than once';
  return null;
}

/**
 * The charset parameters of a Content-Type (each unquoted, lower case): `application/json; charset="UTF-8"`
 * gives `['utf-8']`. A parameter is `; name=token` or `; name="quoted string"`.
 */
export function charsetsOf(contentType: string): string[] {
  const out: string[] = [];
  const param = /;\s*([^\s=;]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;]*)/g;
  for (const m of contentType.matchAll(param)) {
    if (m[1]?.toLowerCase() !== 'charset') continue;
    let value = (m[2] ?? '').trim();
    if (value.length >= 2 && value.startsWith('"') && value.endsWith('"'))
      value = value.slice(1, -1).replace(/\\(.)/g, '$1');
    out.push(value.toLowerCase());
  }
  return out;
}

/**
 * Bodies are UTF-8: a Content-Type naming another charset is refused `unsupported_media_type` before the body
 * is read; a form body's bytes are checked as they arrive and refused `invalid_request` at the first that is not
 * UTF-8 (a JSON body is checked by its parser, `invalid_json`), so no parser ever replaces them with U+FFFD.
 * Covers every body on the app: the API, `/mcp`, the console's forms and the Slack endpoint.
 */
function bodyEncodingHook(
  request: FastifyRequest,
  _reply: FastifyReply,
  payload: Readable,
  done: (err: Error | null, payload?: Readable) => void,
): void {
  const type = request.headers['content-type'];
  if (type === undefined) {
    done(null, payload);
    return;
  }
  // A Content-Type without parameters (`application/json`, as clients send it) names no charset.
  if (type.includes(';') && charsetsOf(type).some((c) => c !== 'utf-8' && c !== 'utf8')) {
    done(
      new ActionLedgerError('unsupported_media_type', 'only UTF-8 is accepted: send charset=utf-8 or no charset', {
        details: { field: 'content-type' },
      }),
    );
    return;
  }
  if ((type.split(';')[0] ?? '').trim().toLowerCase() !== 'application/x-www-form-urlencoded') {
    done(null, payload);
    return;
  }
  const decoder = new TextDecoder('utf-8', { fatal: true });
  const notUtf8 = () => new ActionLedgerError('invalid_request', 'the body is not valid UTF-8');
  const checked = new Transform({
    transform(chunk: Buffer, _encoding, next) {
      try {
        decoder.decode(chunk, { stream: true });
        next(null, chunk);
      } catch {
        next(notUtf8());
      }
    },
    flush(next) {
      try {
        decoder.decode();
        next();
      } catch {
        next(notUtf8());
      }
    },
  });
  // Not pipeline(): it would destroy the request, and with it the socket the refusal is written to. The rest of
  // a refused body is read and dropped, so the connection can carry the answer.
  payload.on('error', (err) => checked.destroy(err));
  checked.on('error', () => {
    payload.unpipe(checked);
    payload.resume();
  });
  done(null, payload.pipe(checked));
}

function sendError(deps: ApiDeps, request: FastifyRequest, reply: FastifyReply, raw: FastifyError): FastifyReply {
  const err = frameworkError(raw);
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

/**
 * Audits every state-changing request of an authenticated caller: its principal, request id and status. A request
 * with nothing to audit (a read, no caller, a gate route's 200 that the gate audited) returns at once, without a
 * promise.
 */
function auditHook(deps: ApiDeps) {
  return (request: FastifyRequest, reply: FastifyReply, done: (err?: Error) => void): void => {
    if (
      request.method === 'GET' ||
      request.method === 'HEAD' ||
      request.caller === undefined ||
      (request.routeOptions.config.gateAudited === true && reply.statusCode === 200)
    ) {
      done();
      return;
    }
    auditRequest(deps, request, request.caller, reply.statusCode).then(() => done(), done);
  };
}

function auditRequest(deps: ApiDeps, request: FastifyRequest, caller: Caller, status: number): Promise<boolean> {
  return deps.audit.grouped({
    action: 'api',
    outcome: String(status),
    context: { tenant_id: caller.tenant_id, principal_id: caller.principal_id, trace_id: request.id },
    detail: {
      request_id: request.id,
      method: request.method,
      route: request.routeOptions.url ?? null,
      token_id: caller.token_id,
    },
  });
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
