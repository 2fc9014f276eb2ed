/**
 * The API's front door over real HTTP and a real PostgreSQL: credentials (missing, malformed, unknown,
 * expired, revoked: each refused on the very next request), roles and capabilities, the fleet-wide request
 * limit, hostile bodies, the structured error body, and the kill-switch routes' tenant isolation.
 */
import t from 'tap';
import { apiFixture } from '../helpers/api.js';
import { auditRows, count } from '../helpers/gate.js';

t.test('probes are public; everything under /v1 but the OpenAPI document needs a token', async (t) => {
  const f = await apiFixture(t);
  t.equal((await f.call('GET', '/healthz')).status, 200);
  t.same((await f.call('GET', '/readyz')).body, { ok: true }, 'readyz: database answers, schema current');
  t.equal((await f.call('GET', '/v1/openapi.json')).status, 200);
  const none = await f.call('GET', '/v1/status');
  t.equal(none.status, 401);
  t.match(none.body, { ok: false, error: 'unauthenticated', details: { reason: 'missing' } });
  t.equal(none.headers.get('www-authenticate'), 'Bearer');
  t.ok(none.headers.get('x-request-id'), 'every answer carries its request id');
  for (const [token, reason] of [
    ['nonsense', 'malformed'],
    [`alt_${'A'.repeat(43)}`, 'unknown'],
  ] as const) {
    const r = await f.call('GET', '/v1/status', { token });
    t.equal(r.status, 401);
    t.match(r.body, { error: 'unauthenticated', details: { reason } }, reason);
  }
  const scheme = await f.call('GET', '/v1/status', { headers: { authorization: 'Basic Zm9vOmJhcg==' } });
  t.equal(scheme.status, 401, 'another scheme is no credential');
  await f.call('GET', '/v1/no/such/path/8f3a');
  const metrics = (await f.call('GET', '/metrics')).text;
  t.match(metrics, /actionledger_api_requests_total\{route="\/v1\/status",method="GET",status="401"\} 4/);
  // Without a credential an unknown path is 401 like any other: a scan learns nothing of the routes.
  t.match(metrics, /actionledger_api_requests_total\{route="unmatched",method="GET",status="401"\} 1/);
  t.notMatch(metrics, /8f3a/, 'a raw path never becomes a label');
  t.match(metrics, /actionledger_api_request_seconds_count\{route="\/v1\/status",method="GET"\} 4/);
});

t.test('the status route tells the caller who it is; the tenant is the token’s', async (t) => {
  const f = await apiFixture(t);
  const token = await f.token('ops-1', ['operator'], { kind: 'person' });
  const r = await f.call('GET', '/v1/status', { token });
  t.equal(r.status, 200);
  t.match(r.body, {
    ok: true,
    principal_id: 'ops-1',
    kind: 'person',
    tenant_id: 'tenant-a',
    roles: ['operator'],
    capabilities: ['read', 'review', 'kill_switch', 'audit'],
  });
  const rows = await f.pool.query<{ last_used_at: Date | null }>('SELECT last_used_at FROM actionledger.api_tokens');
  t.ok(rows.rows[0]?.last_used_at instanceof Date, 'last use recorded');
});

t.test('a revoked token, a revoked role and an expired token are refused on the next request', async (t) => {
  const f = await apiFixture(t);
  const token = await f.token('ops-1', ['operator']);
  t.equal((await f.call('GET', '/v1/kill-switches', { token })).status, 200);

  await f.store.revoke('ops-1', 'tenant-a', 'operator', 'security-team');
  const afterRole = await f.call('GET', '/v1/kill-switches', { token });
  t.equal(afterRole.status, 403, 'the role is gone at once');
  t.match(afterRole.body, { error: 'permission_denied', details: { capability: 'kill_switch' } });

  const [{ token_id: id } = { token_id: '' }] = await f.store.listTokens({ principal_id: 'ops-1' });
  t.equal(await f.store.revokeToken(id, 'security-team'), true);
  t.equal(await f.store.revokeToken(id, 'security-team'), false, 'revoking twice changes nothing');
  const afterToken = await f.call('GET', '/v1/status', { token });
  t.equal(afterToken.status, 401);
  t.match(afterToken.body, { details: { reason: 'revoked' } });

  const short = await f.token('svc-1', ['service'], { ttlDays: 1 / 86400 });
  await new Promise((r) => setTimeout(r, 1500));
  const expired = await f.call('GET', '/v1/status', { token: short });
  t.equal(expired.status, 401);
  t.match(expired.body, { details: { reason: 'expired' } });

  const audit = await auditRows(f.pool, "action IN ('role', 'token')");
  t.match(
    audit.map((a) => `${String(a.action)}:${String(a.outcome)}`),
    [
      'role:granted',
      'token:created',
      'role:revoked',
      'token:revoked',
      'token:revoked',
      'role:granted',
      'token:created',
    ],
    'every change is audited',
  );
  t.equal(await count(f.pool, 'actionledger.api_tokens WHERE token_sha256 LIKE $1', ['alt_%']), 0, 'only hashes');
});

t.test('a token is only made for a principal holding a role in that tenant, for a bounded life', async (t) => {
  const f = await apiFixture(t);
  await f.store.add('p-1', 'person', 'P One', 'test');
  await t.rejects(f.store.createToken('p-1', 'tenant-a', 'x', 1, 'test'), { code: 'permission_denied' });
  await t.rejects(f.store.createToken('nobody', 'tenant-a', 'x', 1, 'test'), { code: 'not_found' });
  await f.store.grant('p-1', 'tenant-a', 'operator', 'test');
  await t.rejects(f.store.createToken('p-1', 'tenant-a', 'x', 366, 'test'), { code: 'invalid_request' });
  await t.rejects(f.store.createToken('p-1', 'tenant-a', 'x', 0, 'test'), { code: 'invalid_request' });
  await t.rejects(f.store.add('p\u200b1', 'person', 'x', 'test'), { code: 'invalid_context' }, 'zero-width');
  await t.rejects(f.store.grant('p-1', 'tenant-a', '  ', 'test'), { code: 'invalid_context' }, 'only whitespace');
  t.equal(await count(f.pool, 'actionledger.api_tokens'), 0, 'nothing half-written');
});

t.test('requests over the limit are 429 with Retry-After, counted in PostgreSQL', async (t) => {
  const f = await apiFixture(t, { api: { rate_limit: { requests: 3, window_s: 60 } } });
  const token = await f.token('svc-1', ['service']);
  const statuses: number[] = [];
  for (let i = 0; i < 5; i++) statuses.push((await f.call('GET', '/v1/status', { token })).status);
  t.same(statuses, [200, 200, 200, 429, 429]);
  const r = await f.call('GET', '/v1/status', { token });
  t.match(r.body, { ok: false, error: 'rate_limited', retry_after_s: Number });
  const after = Number(r.headers.get('retry-after'));
  t.ok(after >= 1 && after <= 60, `Retry-After ${after}`);
  const other = await f.token('svc-2', ['service']);
  t.equal((await f.call('GET', '/v1/status', { token: other })).status, 200, 'the window is per principal');
  const { rows } = await f.pool.query<{ requests: number }>(
    "SELECT requests FROM actionledger.api_rate_windows WHERE principal_id = 'svc-1'",
  );
  t.equal(rows[0]?.requests, 6, 'the fleet-wide count is the table');
  await f.pool.query(
    "INSERT INTO actionledger.api_rate_windows VALUES ('tenant-a', 'svc-1', now() - interval '1 hour', 9)",
  );
  t.equal(await f.store.pruneRateWindows(), 1, 'an ended window is pruned');
  t.equal(await count(f.pool, 'actionledger.api_rate_windows'), 2, 'the live windows stay');
});

t.test('hostile bodies get the structured error and change nothing', async (t) => {
  const f = await apiFixture(t, { api: { max_body_bytes: 1024 } });
  const token = await f.token('ops-1', ['operator']);
  const put = (raw: string | Buffer, type = 'application/json') =>
    f.call('PUT', '/v1/kill-switches/issue_refund', { token, raw, headers: { 'content-type': type } });
  const cases: [string | Buffer, number, string, string?][] = [
    ['{"reason":"a","reason":"b"}', 400, 'invalid_json'],
    ['{"reason":"a\\u0000"}', 400, 'invalid_json'],
    ['{"reason":"\\ud800"}', 400, 'invalid_json'],
    ['{"reason":"a"', 400, 'invalid_json'],
    ['{"__proto__":{"x":1},"reason":"a"}', 400, 'invalid_json'],
    [JSON.stringify({ reason: 'x'.repeat(2000) }), 413, 'body_too_large'],
    ['reason=a', 415, 'unsupported_media_type', 'application/x-www-form-urlencoded'],
    ['{"reason":"a","extra":1}', 422, 'invalid_request'],
    ['{"reason":5}', 422, 'invalid_request'],
    ['{}', 422, 'invalid_request'],
    ['{"reason":"done \\u202egnihton"}', 422, 'invalid_request'],
    ['{"reason":"a\\u0007b"}', 422, 'invalid_request'],
    [Buffer.from([0x7b, 0xff, 0x7d]), 400, 'invalid_json'],
  ];
  for (const [raw, status, error, type] of cases) {
    const r = await put(raw, type);
    t.equal(r.status, status, `${String(raw).slice(0, 40)} -> ${status}`);
    t.match(r.body, { ok: false, error, message: String }, error);
    t.notMatch(r.text, /at .*\.js|SELECT|INSERT|stack/i, 'no stack or SQL');
  }
  const extra = await put('{"reason":"a","extra":1}');
  t.match(extra.body, { details: { field: 'body.extra' } }, 'the field is named');
  t.equal(await count(f.pool, 'actionledger.gate_kill_switches'), 0, 'no switch engaged by any of them');
  t.equal((await f.call('GET', '/v1/no-such-route', { token })).status, 404);
});

t.test('kill switches: capability, tenant isolation, engage and lift, audited with the request id', async (t) => {
  const f = await apiFixture(t);
  const ops = await f.token('ops-1', ['operator']);
  const opsB = await f.token('ops-b', ['operator'], { tenant: 'tenant-b' });
  const agent = await f.token('agent-1', ['agent']);
  const denied = await f.call('PUT', '/v1/kills-switches/issue_refund', { token: agent, body: { reason: 'x' } });
  t.equal(denied.status, 404, 'a misspelt route is 404');
  const forbidden = await f.call('PUT', '/v1/kill-switches/issue_refund', { token: agent, body: { reason: 'x' } });
  t.equal(forbidden.status, 403);
  const engaged = await f.call('PUT', '/v1/kill-switches/issue_refund', { token: ops, body: { reason: 'incident 7' } });
  t.equal(engaged.status, 200);
  t.match(engaged.body, { ok: true, tenant_id: 'tenant-a', tool: 'issue_refund', pending_held: 0, executing: 0 });
  const unknownTool = await f.call('PUT', '/v1/kill-switches/no_such_tool', { token: ops, body: { reason: 'x' } });
  t.match(unknownTool, { status: 422, body: { error: 'unknown_tool' } });

  const listA = await f.call('GET', '/v1/kill-switches', { token: ops });
  t.match(listA.body, { kill_switches: [{ tenant_id: 'tenant-a', tool_name: 'issue_refund', reason: 'incident 7' }] });
  const listB = await f.call('GET', '/v1/kill-switches', { token: opsB });
  t.same(listB.body.kill_switches, [], "another tenant's switch is not listed");
  const liftB = await f.call('DELETE', '/v1/kill-switches/issue_refund', { token: opsB });
  t.equal(liftB.status, 404, "another tenant's switch cannot be lifted");
  t.equal(await count(f.pool, 'actionledger.gate_kill_switches'), 1);
  const lift = await f.call('DELETE', '/v1/kill-switches/issue_refund', { token: ops });
  t.equal(lift.status, 200);
  t.equal(await count(f.pool, 'actionledger.gate_kill_switches'), 0);

  // The api audit rows are written after the answer (grouped): wait for the three, up to 5 s.
  let rows = await auditRows(f.pool, "action = 'api' AND principal_id = 'ops-1'");
  for (const deadline = Date.now() + 5_000; rows.length < 3 && Date.now() < deadline;) {
    await new Promise((r) => setTimeout(r, 20));
    rows = await auditRows(f.pool, "action = 'api' AND principal_id = 'ops-1'");
  }
  t.same(
    rows.map((r) => [(r.detail as { method: string }).method, r.outcome]),
    [
      ['PUT', '200'],
      ['PUT', '422'],
      ['DELETE', '200'],
    ],
  );
  t.equal((rows[0]?.detail as { request_id: string }).request_id, engaged.headers.get('x-request-id'));
  const switchRow = await auditRows(f.pool, "action = 'kill_switch' AND outcome = 'engaged'");
  t.match(switchRow, [{ tenant_id: 'tenant-a', principal_id: 'ops-1', tool_name: 'issue_refund' }]);
});
