/**
 * The error codes each route can answer. A route declares its own (`config.errors`, by code, never by status);
 * the codes every route of its kind can meet are added here, once: an authenticated route's (who is calling,
 * whether they may, the caller's own mistakes, the rate, and the failures that say nothing about the request),
 * and a JSON body's. The OpenAPI document's error statuses are these codes' statuses through the one table
 * (server/api/errors.ts `httpStatus`), and {@link declaredErrorsHook} checks every error the app answers
 * against them, so a route that starts answering a code it does not declare is noticed, not documented wrong.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import { ERROR_CODES, type ErrorCode } from '../../core/errors.js';
import type { Logger } from '../../core/log.js';
import { httpStatus } from './errors.js';

/** Failures that say nothing about the request (the database refused or is away; anything unexpected). */
export const FAILURE_CODES: readonly ErrorCode[] = (Object.keys(ERROR_CODES) as ErrorCode[]).filter(
  (c) => ERROR_CODES[c] === 'retryable' || ERROR_CODES[c] === 'internal',
);

/** What every authenticated route can answer besides its own codes. */
export const AUTHENTICATED_CODES: readonly ErrorCode[] = [
  'unauthenticated',
  'permission_denied',
  'invalid_request',
  'rate_limited',
  ...FAILURE_CODES,
];

/** What every public route (probes, metrics, this document, Slack's signed requests) can answer besides its own. */
export const PUBLIC_CODES: readonly ErrorCode[] = ['internal'];

/** What every route with a JSON body schema can answer: the body is not strict JSON, too large, or not JSON at all. */
export const BODY_CODES: readonly ErrorCode[] = ['invalid_json', 'body_too_large', 'unsupported_media_type'];

/** The parts of a route its codes are read from: its settings and whether its schema has a body. */
export interface RouteErrorSource {
  config?: { public?: boolean; errors?: readonly ErrorCode[] } | undefined;
  schema?: { body?: unknown } | undefined;
}

/** Every code the route can answer: its own, and those of its kind. Sorted, each once. */
export function routeErrorCodes(route: RouteErrorSource): ErrorCode[] {
  const codes = new Set<ErrorCode>([
    ...(route.config?.public === true ? PUBLIC_CODES : AUTHENTICATED_CODES),
    ...(route.schema?.body === undefined ? [] : BODY_CODES),
    ...(route.config?.errors ?? []),
  ]);
  return [...codes].sort();
}

/** The codes grouped by the status each answers with (`httpStatus`), statuses ascending. */
export function codesByStatus(codes: readonly ErrorCode[]): Map<number, ErrorCode[]> {
  const out = new Map<number, ErrorCode[]>();
  for (const code of codes) {
    const status = httpStatus(code);
    out.set(status, [...(out.get(status) ?? []), code]);
  }
  return new Map([...out].sort(([a], [b]) => a - b));
}

/** An error answer its route did not declare: the code, or a status other than the code's. */
export interface UndeclaredError {
  method: string;
  route: string;
  status: number;
  code: string;
  problem: 'undeclared_code' | 'wrong_status';
}

/**
 * How the app treats an undeclared error answer: `warn` logs it (the answer goes out as it is); `enforce` (the
 * tests) also replaces it with a 500 `internal` naming the route, the code and the status, so no test that meets
 * one can pass.
 */
export type DeclaredErrorsMode = 'warn' | 'enforce';

/**
 * The `onSend` hook that checks every error answer (status 400 and above, the one error body) of a route the
 * document lists against the route's codes: the code must be one of them and the status its status in the table.
 * An answer the route's own response schema describes for that status (a probe's 503) is the route's to shape.
 * Not checked: the console's HTML pages, paths no route matched, and the malformed requests refused before any
 * route could see them (a repeated Host or Content-Type, marked by the hook that refuses them).
 */
export function declaredErrorsHook(
  log: Logger,
  mode: DeclaredErrorsMode,
  report?: (undeclared: UndeclaredError) => void,
) {
  return (request: FastifyRequest, reply: FastifyReply, payload: unknown, done: (err: null, p: unknown) => void) => {
    const found = reply.statusCode >= 400 ? undeclaredIn(request, reply.statusCode, payload) : null;
    if (found === null) {
      done(null, payload);
      return;
    }
    report?.(found);
    log.warn(found, 'a route answered an error it does not declare');
    if (mode === 'warn') {
      done(null, payload);
      return;
    }
    const message = `${found.method} ${found.route} answered ${found.code} with ${found.status}: ${found.problem}`;
    void reply.code(500);
    done(null, JSON.stringify({ ok: false, error: 'internal', message, details: { ...found } }));
  };
}

function undeclaredIn(request: FastifyRequest, status: number, payload: unknown): UndeclaredError | null {
  const route = request.routeOptions;
  if (route.url === undefined || route.config.console !== undefined || request.refusedMalformed === true) return null;
  if (typeof payload !== 'string') return null;
  let code: unknown;
  try {
    code = (JSON.parse(payload) as { error?: unknown }).error;
  } catch {
    return null;
  }
  if (typeof code !== 'string') return null;
  const where = { method: request.method, route: route.url, status, code };
  const own = ownResponse(route.schema, status);
  if (own !== undefined) return own === null || own.includes(code) ? null : { ...where, problem: 'undeclared_code' };
  const codes: readonly string[] = routeErrorCodes({ config: route.config, schema: route.schema });
  if (!codes.includes(code)) return { ...where, problem: 'undeclared_code' };
  if (httpStatus(code as ErrorCode) !== status) return { ...where, problem: 'wrong_status' };
  return null;
}

/**
 * The route's own response schema for the status: undefined when it has none, else the codes it pins its `error`
 * to (`const` or `enum`), or null when it pins none (a probe's body: any code it reports).
 */
function ownResponse(schema: unknown, status: number): readonly string[] | null | undefined {
  const response = (schema as { response?: Record<string, unknown> } | undefined)?.response?.[String(status)];
  if (response === undefined) return undefined;
  const error = (response as { properties?: { error?: { const?: string; enum?: readonly string[] } } }).properties
    ?.error;
  if (error?.const !== undefined) return [error.const];
  return error?.enum ?? null;
}
