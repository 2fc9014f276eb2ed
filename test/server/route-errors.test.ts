/**
 * The error codes each route declares, and the statuses the OpenAPI document derives from them
 * (server/api/route-errors.ts, server/api/errors.ts `httpStatus`):
 *
 * - the whole code -> status table, written out here code by code, so a status that moves is a visible change;
 * - the codes every authenticated, public and JSON-body route can answer, written out too;
 * - every documented operation declares its codes, and its error responses are exactly the statuses of those
 *   codes and of its kind's (plus any its own response schema describes), each listing its codes;
 * - the `onSend` check on a small app of its own: an undeclared code, or a declared one with another status, is
 *   reported, and answered 500 when enforced; a declared one passes untouched;
 * - through the real API (whose test fixture enforces the declarations, so every API test checks them): the
 *   documented refusal of a representative route set answers a code that route declares, with its status.
 */
import t from 'tap';
import Fastify from 'fastify';
import { ERROR_CODES, type ErrorCode } from '../../core/errors.js';
import { createLogger } from '../../core/log.js';
import { httpStatus } from '../../server/api/errors.js';
import {
  AUTHENTICATED_CODES,
  BODY_CODES,
  PUBLIC_CODES,
  declaredErrorsHook,
  type UndeclaredError,
} from '../../server/api/route-errors.js';
import { apiFixture } from '../helpers/api.js';

/** Every code and the HTTP status it answers with. */
const STATUS: Record<ErrorCode, number> = {
  config_invalid: 501,
  secret_missing: 503,
  schema_name_invalid: 503,
  profile_invalid: 503,
  tls_verification_disabled: 503,
  migration_history_mismatch: 503,
  schema_not_migrated: 503,
  port_in_use: 503,
  already_running: 503,
  embedded_database_failed: 503,
  database_unavailable: 503,
  storage_full: 503,
  statement_timeout: 503,
  database_overloaded: 503,
  database_conflict: 503,
  database_read_only: 503,
  database_error: 500,
  illegal_transition: 500,
  audit_unavailable: 503,
  invalid_context: 422,
  invalid_arguments: 422,
  invalid_json: 400,
  unauthenticated: 401,
  csrf_token_invalid: 403,
  oidc_sign_in_failed: 401,
  oidc_not_mapped: 403,
  body_too_large: 413,
  unsupported_media_type: 415,
  expectation_failed: 417,
  route_not_approved: 422,
  operation_conflict: 409,
  not_found: 404,
  invalid_state_transition: 409,
  invalid_review: 409,
  retry_not_safe: 409,
  review_policy_refused: 422,
  compensation_unmapped: 422,
  unknown_tool: 422,
  unknown_tenant: 422,
  tenant_wrong_cluster: 421,
  permission_denied: 403,
  tool_disabled: 422,
  rate_limited: 429,
  invalid_request: 422,
  limit_exceeded: 422,
  proposal_not_found: 404,
  proposal_same_turn_confirm: 422,
  proposal_expired: 409,
  params_mismatch: 422,
  confirmation_declined: 422,
  approval_hash_mismatch: 409,
  approval_expired: 409,
  self_approval_forbidden: 403,
  hidden_characters: 422,
  reapproval_required: 409,
  approval_required: 202,
  confirmation_required: 202,
  route_changed: 500,
  args_hash_mismatch: 500,
  authorization_denied: 500,
  authorization_invalid: 500,
  authorization_unavailable: 500,
  authorization_stale: 500,
  role_revoked: 500,
  claim_lost: 500,
  worker_lost: 500,
  credential_missing: 500,
  ungated_external_write: 500,
  provider_unreachable: 500,
  provider_outcome_unknown: 500,
  provider_rejected: 500,
  provider_no_receipt: 500,
  internal: 500,
};

/** The failures any authenticated route can meet: the database's, and anything unexpected. */
const FAILURES: ErrorCode[] = [
  'database_unavailable',
  'storage_full',
  'statement_timeout',
  'database_overloaded',
  'database_conflict',
  'database_read_only',
  'database_error',
  'illegal_transition',
  'audit_unavailable',
  'internal',
];
const AUTHENTICATED: ErrorCode[] = ['unauthenticated', 'permission_denied', 'invalid_request', 'rate_limited'];
const BODY: ErrorCode[] = ['invalid_json', 'body_too_large', 'unsupported_media_type'];
const PUBLIC: ErrorCode[] = ['internal'];

type Response = { description: string; content?: Record<string, { schema: Record<string, unknown> }> };
type Operation = { responses: Record<string, Response> };

t.test('the code -> status table, every code', (t) => {
  t.same(Object.keys(STATUS).sort(), Object.keys(ERROR_CODES).sort(), 'every code is in the table here');
  for (const code of Object.keys(ERROR_CODES) as ErrorCode[]) t.equal(httpStatus(code), STATUS[code], code);
  t.end();
});

t.test('the codes of each kind of route', (t) => {
  t.same([...AUTHENTICATED_CODES].sort(), [...AUTHENTICATED, ...FAILURES].sort(), 'authenticated routes');
  t.same([...BODY_CODES].sort(), [...BODY].sort(), 'routes with a JSON body schema');
  t.same([...PUBLIC_CODES], PUBLIC, 'public routes');
  t.end();
});

t.test("every operation's error statuses are those of its declared codes and its kind's", async (t) => {
  const f = await apiFixture(t);
  const doc = (await f.call('GET', '/v1/openapi.json')).body as { paths: Record<string, Record<string, Operation>> };
  const declared = f.api.openapi.declared();
  t.ok(declared.length >= 25, `${declared.length} operations`);
  for (const route of declared) {
    const [method = '', path = ''] = route.operation.split(' ');
    const op = doc.paths[path]?.[method.toLowerCase()];
    if (op === undefined) {
      t.fail(`${route.operation} is documented`);
      continue;
    }
    t.ok(route.errors !== undefined, `${route.operation} declares its codes (even none)`);
    const codes = new Set([...(route.public ? PUBLIC : [...AUTHENTICATED, ...FAILURES]), ...(route.body ? BODY : [])]);
    for (const c of route.errors ?? []) codes.add(c);
    const expected = new Map<number, ErrorCode[]>();
    for (const c of codes) expected.set(STATUS[c], [...(expected.get(STATUS[c]) ?? []), c]);
    const documented = Object.keys(op.responses)
      .map(Number)
      .filter((s) => s >= 400);
    const own = documented.filter(
      (s) => !(op.responses[String(s)]?.content?.['application/json']?.schema.allOf !== undefined),
    );
    t.same(
      documented.sort(),
      [...new Set([...expected.keys(), ...own])].sort(),
      `${route.operation}: its error statuses come from its codes`,
    );
    for (const [status, list] of expected) {
      const response = op.responses[String(status)];
      const schema = response?.content?.['application/json']?.schema as
        { allOf?: [unknown, { properties: { error: { enum: string[] } } }] } | undefined;
      if (schema?.allOf === undefined) continue; // the route's own response schema for this status
      t.same([...schema.allOf[1].properties.error.enum].sort(), list.sort(), `${route.operation} ${status}: its codes`);
    }
  }
});

t.test('an error answer its route does not declare is caught', async (t) => {
  const log = createLogger({ level: 'silent', name: 'route-errors-test' });
  const build = async (mode: 'warn' | 'enforce') => {
    const seen: UndeclaredError[] = [];
    const app = Fastify();
    app.addHook(
      'onSend',
      declaredErrorsHook(log, mode, (u) => seen.push(u)),
    );
    const refuse = (error: string) => ({ ok: false, error, message: 'refused' });
    app.get('/declared', { config: { errors: ['not_found'] } }, (_r, reply) =>
      reply.code(404).send(refuse('not_found')),
    );
    app.get('/undeclared', { config: { errors: ['not_found'] } }, (_r, reply) =>
      reply.code(409).send(refuse('operation_conflict')),
    );
    app.get('/wrong-status', { config: { errors: ['not_found'] } }, (_r, reply) =>
      reply.code(400).send(refuse('not_found')),
    );
    app.get('/common', { config: { errors: [] } }, (_r, reply) => reply.code(429).send(refuse('rate_limited')));
    const probe = { type: 'object', properties: { ok: { type: 'boolean' }, error: { type: 'string' } } };
    app.get('/probe', { config: { public: true, errors: [] }, schema: { response: { 503: probe } } }, (_r, reply) =>
      reply.code(503).send({ ok: false, error: 'stopping' }),
    );
    await app.ready();
    t.teardown(() => app.close());
    return { app, seen };
  };

  const enforced = await build('enforce');
  const get = (url: string) => enforced.app.inject({ method: 'GET', url });
  t.equal((await get('/declared')).statusCode, 404, 'a declared code with its status goes out as it is');
  t.equal((await get('/common')).statusCode, 429, 'so does a code every authenticated route can answer');
  t.equal((await get('/probe')).statusCode, 503, 'and a status the route’s own response schema describes');
  t.same(enforced.seen, [], 'none of those is reported');
  const undeclared = await get('/undeclared');
  t.equal(undeclared.statusCode, 500, 'an undeclared code is answered 500 when enforced');
  t.match(undeclared.json(), { error: 'internal', message: /operation_conflict/ });
  const wrong = await get('/wrong-status');
  t.equal(wrong.statusCode, 500, 'so is a declared code with a status other than the table’s');
  t.same(
    enforced.seen.map((u) => [u.route, u.code, u.status, u.problem]),
    [
      ['/undeclared', 'operation_conflict', 409, 'undeclared_code'],
      ['/wrong-status', 'not_found', 400, 'wrong_status'],
    ],
  );

  const warned = await build('warn');
  const as = await warned.app.inject({ method: 'GET', url: '/undeclared' });
  t.equal(as.statusCode, 409, 'only warned: the answer goes out as it is');
  t.equal(warned.seen.length, 1, 'and is reported');
});

t.test("documented refusals answer codes their routes declare, with the table's status", async (t) => {
  const f = await apiFixture(t);
  const op = await f.token('op-1', ['operator'], { kind: 'person' });
  const sup = await f.token('sup-1', ['supervisor'], { kind: 'person' });
  const svc = await f.token('svc-1', ['service']);
  const agent = await f.token('agent-9', ['agent']);
  const unknown = '00000000-0000-4000-8000-000000000000';
  const reserve = (args: Record<string, unknown>) => ({
    token: svc,
    body: {
      tool: 'transfer_funds',
      arguments: args,
      task_id: 'task-x',
      workflow_step_id: 'step-x',
      approval_id: 'ap-1',
      policy_version: 'p-1',
    },
  });
  const hash = 'a'.repeat(64);
  const identity = { task_id: 'task-x', workflow_step_id: 'step-x' };
  const cases: [string, string, string, Parameters<typeof f.call>[2]][] = [
    ['GET', `/v1/operations/${unknown}`, 'not_found', { token: op }],
    ['POST', '/v1/operations', 'operation_conflict', reserve({ to_account: 'ACC0000000002', amount: 26 })],
    ['GET', '/v1/approvals?tool=no_such_tool', 'unknown_tool', { token: sup }],
    ['GET', `/v1/approvals/${unknown}`, 'not_found', { token: sup }],
    ['POST', `/v1/approvals/${unknown}/approve`, 'not_found', { token: sup, body: { envelope_sha256: hash } }],
    ['POST', `/v1/approvals/${unknown}/reject`, 'not_found', { token: sup, body: { reason: 'no' } }],
    ['POST', `/v1/proposals/${unknown}/cancel`, 'proposal_not_found', { token: agent, body: identity }],
    ['POST', `/v1/operations/${unknown}/review/retry`, 'not_found', { token: op, body: { reason: 'why' } }],
    ['PUT', '/v1/kill-switches/no_such_tool', 'unknown_tool', { token: op, body: { reason: 'stop' } }],
    ['DELETE', '/v1/kill-switches/issue_refund', 'not_found', { token: op }],
    ['GET', '/v1/operations?task_id=%20x', 'invalid_context', { token: op }],
    [
      'POST',
      '/v1/calls',
      'invalid_json',
      { token: agent, raw: '{"a":1,"a":2}', headers: { 'content-type': 'application/json' } },
    ],
  ];
  t.equal((await f.call('POST', '/v1/operations', reserve({ to_account: 'ACC0000000002', amount: 25 }))).status, 200);
  const declared = new Map(f.api.openapi.declared().map((d) => [d.operation, d]));
  for (const [method, url, code, options] of cases) {
    const r = await f.call(method, url, options);
    const path = (url.split('?')[0] ?? '')
      .replace(/[0-9a-f]{8}-[0-9a-f-]{27}/, '{id}')
      .replace(/\/kill-switches\/[^/]+/, '/kill-switches/{tool}');
    const route = declared.get(`${method} ${path}`);
    const codes = new Set([
      ...(route?.errors ?? []),
      ...(route?.public === true ? PUBLIC : [...AUTHENTICATED, ...FAILURES]),
      ...(route?.body === true ? BODY : []),
    ]);
    t.same([r.status, r.body.error], [STATUS[code as ErrorCode], code], `${method} ${url}: ${code}`);
    t.ok(codes.has(code as ErrorCode), `${method} ${path} declares ${code}`);
  }
  t.same(f.undeclared, [], 'no route answered a code it does not declare');
});
