/**
 * Who is calling, for every route that is not public: the bearer token is looked up (and this request counted
 * in the fleet-wide window) on each request, so a revoked token or role is refused by the next one. Nothing of it
 * is cached: the one statement that reads the token and its roles also counts the request, so a cache would save
 * no round trip and would break that promise. The trusted context of a call is built here from the caller, never
 * from the body: the tenant is always the token's, and only a caller whose role is granted `act_for_users` may
 * name the end user it acts for.
 */
import type { TLSSocket } from 'node:tls';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { ApiCapability } from '../../config/index.js';
import { ActionLedgerError } from '../../core/errors.js';
import { identifier } from '../../core/identifier.js';
import type { GateContext, Reviewer } from '../../gate/index.js';
import { certificateFingerprint } from '../../principals/index.js';
import type { ApiDeps, Caller } from './types.js';

/** The `onRequest` hook: authenticates, counts, and checks the route's capability. */
export function authenticateHook(deps: ApiDeps) {
  return async (request: FastifyRequest, reply: FastifyReply): Promise<void> => {
    const config = request.routeOptions.config;
    if (config.public === true || config.console !== undefined) return;
    const caller = await credentialOf(deps, request, reply);
    request.caller = caller;
    const over = overWindow(deps, caller);
    if (over !== null) {
      reply.header('retry-after', String(caller.window_left_s));
      throw over;
    }
    if (config.capability !== undefined) requireCapability(deps, caller, config.capability);
  };
}

/** The `rate_limited` refusal of a caller whose window holds more requests than the limit; null within it. */
export function overWindow(
  deps: Pick<ApiDeps, 'config'>,
  counted: { requests: number; window_left_s: number },
): ActionLedgerError | null {
  const limit = deps.config.api.rateLimit;
  if (counted.requests <= limit.requests) return null;
  return new ActionLedgerError(
    'rate_limited',
    `more than ${limit.requests} requests in ${limit.windowS} s; retry in ${counted.window_left_s} s`,
    { details: { retry_after_s: counted.window_left_s } },
  );
}

/**
 * The caller of a request authenticated once more, by the same credential (token or certificate), with the
 * look-up counted in its window: for a request that waits on something (an MCP elicitation) and must not act
 * on what was true when it arrived. Throws `unauthenticated`.
 */
export function authenticateAgain(deps: ApiDeps, request: FastifyRequest): Promise<Caller> {
  return credentialOf(deps, request, undefined);
}

/**
 * The caller of a request: by its bearer token, or, with none and a listener that asks for client
 * certificates, by the verified certificate's mapping. Throws `unauthenticated`, also for a request that sends
 * the Authorization header more than once.
 */
async function credentialOf(deps: ApiDeps, request: FastifyRequest, reply: FastifyReply | undefined): Promise<Caller> {
  // Node keeps the first of several Authorization lines: which credential was meant is not said, so neither is used.
  if (headerLines(request.raw.rawHeaders, 'authorization') > 1) {
    reply?.header('www-authenticate', 'Bearer');
    throw new ActionLedgerError('unauthenticated', 'repeated Authorization header: send one credential', {
      details: { reason: 'repeated' },
    });
  }
  const header = request.headers.authorization;
  if (header === undefined) {
    const socket = request.raw.socket as Partial<TLSSocket>;
    if (deps.config.http.tls?.clientCaFile != null && socket.authorized === true && socket.getPeerCertificate) {
      const fingerprint = socket.getPeerCertificate().fingerprint256;
      if (typeof fingerprint === 'string' && fingerprint !== '')
        return deps.principals.certificates.authenticate(certificateFingerprint(fingerprint));
    }
  }
  const match = typeof header === 'string' ? /^Bearer ([^\s]+)$/i.exec(header) : null;
  if (match === null) {
    reply?.header('www-authenticate', 'Bearer');
    throw new ActionLedgerError('unauthenticated', 'send Authorization: Bearer <token>', {
      details: { reason: 'missing' },
    });
  }
  try {
    return await deps.principals.authenticate(match[1] ?? '');
  } catch (err) {
    reply?.header('www-authenticate', 'Bearer error="invalid_token"');
    throw err;
  }
}

/** How many header lines named `name` (lower case) the request sent. */
export function headerLines(rawHeaders: readonly string[], name: string): number {
  let n = 0;
  for (let i = 0; i < rawHeaders.length; i += 2) if (rawHeaders[i]?.toLowerCase() === name) n++;
  return n;
}

/** Whether one of the caller's roles is granted the capability. */
export function holds(deps: ApiDeps, caller: Caller, capability: ApiCapability): boolean {
  const granted = deps.config.api.permissions[capability];
  return caller.roles.some((r) => granted.has(r));
}

/** Throws `permission_denied` unless one of the caller's roles is granted the capability. */
export function requireCapability(deps: ApiDeps, caller: Caller, capability: ApiCapability): void {
  if (!holds(deps, caller, capability))
    throw new ActionLedgerError('permission_denied', `none of your roles may ${capability.replaceAll('_', ' ')}`, {
      details: { capability },
    });
}

/** The caller of a route that is not public (the hook has run). */
export function callerOf(request: FastifyRequest): Caller {
  if (request.caller === undefined) throw new ActionLedgerError('internal', 'route has no authenticated caller');
  return request.caller;
}

/**
 * The role the caller acts with: the one named (it must hold it in the token's tenant), or the only one it
 * holds. Throws `permission_denied` for a role not held, `invalid_request` when it holds several and named none.
 */
export function actingRole(caller: Caller, named: string | undefined): string {
  if (named !== undefined) {
    const role = identifier('role', named);
    if (!caller.roles.includes(role))
      throw new ActionLedgerError('permission_denied', `you do not hold the role ${JSON.stringify(role)} here`, {
        details: { role },
      });
    return role;
  }
  if (caller.roles.length === 1) return caller.roles[0] as string;
  // Every role taken away (a token outlives its principal's roles): nothing may be done with it.
  if (caller.roles.length === 0)
    throw new ActionLedgerError('permission_denied', 'you hold no role in this tenant', { details: { held: [] } });
  throw new ActionLedgerError('invalid_request', 'you hold several roles here: name one in `role`', {
    details: { field: 'role', held: caller.roles },
  });
}

/** The end user a trusted service acts for (`act_for_users`). */
export interface ActingFor {
  principal_id: string;
  role: string;
  account_id: string;
  conversation_id: string;
  turn_id: string;
}

/** The workflow fields of a call's body: the operation's identity and the conversation it happens in. */
export interface CallIdentity {
  task_id: string;
  workflow_step_id: string;
  plan_version?: string | undefined;
  conversation_id?: string | undefined;
  turn_id?: string | undefined;
  role?: string | undefined;
  user?: ActingFor | undefined;
}

/**
 * The trusted context of a gate call or proposal action. The tenant is the token's. With `user`, the caller
 * must hold a role granted `act_for_users`, and the context is the user's (in the caller's tenant). Without
 * it, the caller acts as itself: its principal, its role (`actingRole`), its id as the account; the
 * conversation defaults to the task and the turn to the request. The request id is the trace id.
 */
export function gateContext(deps: ApiDeps, request: FastifyRequest, body: CallIdentity): GateContext {
  const caller = callerOf(request);
  // Built by assignment in the order of the checks, not as `{ ...base, principal_id, ... }`: on Node 20 each
  // property an object literal names after a spread costs a runtime call (measured: 10 µs for this context).
  const context = {
    tenant_id: caller.tenant_id,
    trace_id: request.id,
    task_id: identifier('task_id', body.task_id),
    workflow_step_id: identifier('workflow_step_id', body.workflow_step_id),
  } as GateContext;
  if (body.plan_version !== undefined) context.plan_version = identifier('plan_version', body.plan_version);
  if (body.user !== undefined) {
    requireCapability(deps, caller, 'act_for_users');
    const u = body.user;
    context.principal_id = identifier('user.principal_id', u.principal_id);
    context.role = identifier('user.role', u.role);
    context.account_id = identifier('user.account_id', u.account_id);
    context.conversation_id = identifier('user.conversation_id', u.conversation_id);
    context.turn_id = identifier('user.turn_id', u.turn_id);
    return context;
  }
  context.principal_id = caller.principal_id;
  context.role = actingRole(caller, body.role);
  context.account_id = caller.principal_id;
  context.conversation_id = identifier('conversation_id', body.conversation_id ?? body.task_id);
  context.turn_id = identifier('turn_id', body.turn_id ?? request.id);
  return context;
}

/** The reviewer of an approval: the caller, in its tenant, with the role it names or its only one. */
export function reviewerOf(request: FastifyRequest, role: string | undefined): Reviewer {
  const caller = callerOf(request);
  return { tenant_id: caller.tenant_id, principal_id: caller.principal_id, role: actingRole(caller, role) };
}

/** JSON Schema of the fields {@link gateContext} reads, for a route's body. */
export const callIdentitySchema = {
  task_id: { type: 'string', minLength: 1, maxLength: 256 },
  workflow_step_id: { type: 'string', minLength: 1, maxLength: 256 },
  plan_version: { type: 'string', minLength: 1, maxLength: 256 },
  conversation_id: { type: 'string', minLength: 1, maxLength: 256 },
  turn_id: { type: 'string', minLength: 1, maxLength: 256 },
  role: { type: 'string', minLength: 1, maxLength: 256 },
  user: {
    type: 'object',
    additionalProperties: false,
    required: ['principal_id', 'role', 'account_id', 'conversation_id', 'turn_id'],
    properties: {
      principal_id: { type: 'string', minLength: 1, maxLength: 256 },
      role: { type: 'string', minLength: 1, maxLength: 256 },
      account_id: { type: 'string', minLength: 1, maxLength: 256 },
      conversation_id: { type: 'string', minLength: 1, maxLength: 256 },
      turn_id: { type: 'string', minLength: 1, maxLength: 256 },
    },
  },
} as const;
