/**
 * The authorization decision's wire format (protocol/authorization.ts), which the dispatcher, the built-in
 * authorization service and the sandbox authorizer all use: its field lists are pinned here word for word, so a
 * change to the contract cannot pass unseen because every side moved with it.
 */
import t from 'tap';
import { ActionLedgerError } from '../../core/errors.js';
import type { JsonObject } from '../../core/json.js';
import {
  AUTHORIZE_PATH,
  BINDING_FIELDS,
  DECISION_FIELDS,
  authorizationRequest,
  checkDecision,
  decisionBody,
  parseAuthorizationRequest,
  type AuthorizationRequest,
} from '../../protocol/authorization.js';
import type { DispatchProfile } from '../../protocol/profile.js';

const profile = {
  maximumAuthorizationAgeMs: 30_000,
  maximumAuthorizationTtlMs: 120_000,
  maximumClockSkewMs: 5_000,
} as DispatchProfile;

const row = {
  operation_id: '0b0f6c1e-8a51-4a53-9d7e-5f1c2b3a4d5e',
  effect_key: 'v1.k1.abc',
  principal_id: 'agent-7',
  task_id: 'refund-42',
  workflow_step_id: '1',
  tool_name: 'issue_refund',
  tenant_id: 'tenant-a',
  provider_id: 'payments',
  canonical_args_sha256: 'ab'.repeat(32),
  current_approval_id: '-',
  current_policy_version: 'policy-1',
};

function code(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    return err instanceof ActionLedgerError ? err.code : `not coded: ${String(err)}`;
  }
  return 'accepted';
}

t.test('the contract: the path, the binding fields and the decision fields, word for word and in order', (t) => {
  t.equal(AUTHORIZE_PATH, '/v1/authorize');
  t.same(
    [...BINDING_FIELDS],
    [
      'operation_id',
      'effect_key',
      'principal_id',
      'task_id',
      'workflow_step_id',
      'tool_name',
      'tenant_id',
      'provider_id',
      'args_sha256',
      'approval_id',
      'policy_version',
    ],
  );
  t.same([...DECISION_FIELDS], ['decision', 'authorized_at', 'expires_at']);
  t.end();
});

t.test('a request is built from the ledger columns, the arguments hash and approval under their wire names', (t) => {
  const request = authorizationRequest(row);
  t.same(Object.keys(request), [...BINDING_FIELDS]);
  t.equal(request.args_sha256, row.canonical_args_sha256);
  t.equal(request.approval_id, '-');
  t.equal(request.policy_version, 'policy-1');
  t.end();
});

t.test('a received request must have exactly the binding fields, each a non-empty string', (t) => {
  const request = authorizationRequest(row) as unknown as JsonObject;
  t.same(parseAuthorizationRequest({ ...request }), request);
  const without = { ...request };
  delete without.task_id;
  t.equal(parseAuthorizationRequest(without), null, 'a field missing');
  t.equal(parseAuthorizationRequest({ ...request, scope: 'all' }), null, 'a field added');
  t.equal(parseAuthorizationRequest({ ...without, scope: 'x' }), null, 'one swapped for another');
  t.equal(parseAuthorizationRequest({ ...request, tenant_id: '' }), null, 'an empty field');
  t.equal(parseAuthorizationRequest({ ...request, attempt: 1 }), null, 'a number');
  t.equal(parseAuthorizationRequest({ ...request, approval_id: null }), null, 'null');
  t.end();
});

t.test('an answer is accepted only as an allow echoing every binding, inside the windows', (t) => {
  const request: AuthorizationRequest = authorizationRequest(row);
  const now = Date.parse('2026-12-05T08:00:00.000Z');
  const answer = (over: Record<string, unknown> = {}, at = now, until = now + 60_000): JsonObject => ({
    ...decisionBody(request, 'allow', at, until),
    ...over,
  });
  const check = (body: JsonObject): string => code(() => checkDecision(body, request, profile, new Date(now)));

  const ok = checkDecision(answer(), request, profile, new Date(now));
  t.equal(ok.authorizedAt.toISOString(), '2026-12-05T08:00:00.000Z');
  t.equal(ok.expiresAt.getTime() - ok.authorizedAt.getTime(), 60_000);
  t.match(ok.decisionSha256, /^[0-9a-f]{64}$/);

  t.equal(check(answer({ decision: 'deny' })), 'authorization_denied');
  t.equal(check(answer({ decision: 'maybe' })), 'authorization_invalid');
  t.equal(check(answer({ scope: 'all' })), 'authorization_invalid', 'an extra field');
  const missing = answer();
  delete missing.expires_at;
  t.equal(check(missing), 'authorization_invalid', 'a missing field');
  for (const field of BINDING_FIELDS)
    t.equal(check(answer({ [field]: `${request[field]}-other` })), 'authorization_invalid', `${field} not echoed`);
  t.equal(check(answer({ authorized_at: '2026-12-05 08:00:00' })), 'authorization_invalid', 'not ISO UTC');
  t.equal(check(answer({}, now - 40_000, now + 10_000)), 'authorization_stale', 'older than the age allows');
  t.equal(check(answer({}, now - 20_000, now - 6_000)), 'authorization_stale', 'expired beyond the skew');
  t.equal(check(answer({}, now, now + 121_000)), 'authorization_stale', 'a TTL over the maximum');
  t.equal(check(answer({}, now + 6_000, now + 60_000)), 'authorization_stale', 'dated in the future');
  t.equal(check(answer({}, now, now)), 'authorization_invalid', 'expires as it is authorized');
  t.end();
});
