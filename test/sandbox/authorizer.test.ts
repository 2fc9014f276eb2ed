import { request as httpsRequest } from 'node:https';
import t, { type Test } from 'tap';
import { postJson, type HttpOutcome, type HttpResponse } from '../../transport/http-client.js';
import { SandboxAuthorizer } from '../../sandbox/authorizer.js';
import { BINDING_FIELDS, type AuthorizationRequest } from '../../protocol/authorization.js';
import { startAuthorizer, testAgent, testPki } from '../helpers/sandbox.js';

const request: AuthorizationRequest = {
  operation_id: 'op-1',
  effect_key: 'ek-1',
  principal_id: 'principal-1',
  task_id: 'task-1',
  workflow_step_id: 'step-1',
  tool_name: 'issue_refund',
  tenant_id: 'tenant-a',
  provider_id: 'billing-test',
  args_sha256: 'a'.repeat(64),
  approval_id: 'approval-1',
  policy_version: 'policy-1',
};

const call = (body: unknown = request, extra: Partial<{ timeoutMs: number; maxBytes: number }> = {}) => ({
  body: typeof body === 'string' ? body : JSON.stringify(body),
  timeoutMs: 2_000,
  maxBytes: 16 * 1024,
  ...extra,
});

function response(t: Test, out: HttpOutcome): HttpResponse {
  t.equal(out.kind, 'response', `a response (${out.kind}/${'code' in out ? out.code : ''})`);
  if (out.kind !== 'response') throw new Error(`expected a response, got ${out.kind}/${out.code}`);
  return out;
}

function timestamps(res: HttpResponse): { authorizedAt: number; expiresAt: number } {
  const json = res.json ?? {};
  for (const f of ['authorized_at', 'expires_at']) {
    if (typeof json[f] !== 'string' || !/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/.test(json[f])) {
      throw new Error(`${f} is not an ISO 8601 UTC string`);
    }
  }
  return { authorizedAt: Date.parse(json.authorized_at as string), expiresAt: Date.parse(json.expires_at as string) };
}

/** The raw answer text, read with node:https (no strict parsing in the way). */
async function rawAnswer(authorizer: SandboxAuthorizer): Promise<string> {
  const p = await testPki();
  return new Promise((resolve, reject) => {
    const req = httpsRequest(
      authorizer.authorizeUrl,
      {
        method: 'POST',
        ca: p.ca.cert,
        cert: p.client.cert,
        key: p.client.key,
        headers: { 'content-type': 'application/json' },
      },
      (res) => {
        let text = '';
        res
          .setEncoding('utf8')
          .on('data', (c: string) => (text += c))
          .on('end', () => resolve(text));
      },
    );
    req.on('error', reject);
    req.end(JSON.stringify(request));
  });
}

t.test('allow by default: every field echoed, ISO 8601 UTC times, 60 s TTL; requests recorded', async (t) => {
  const authorizer = await startAuthorizer(t);
  const agent = await testAgent(t);
  const before = Date.now();
  const res = response(t, await postJson(agent, authorizer.authorizeUrl, call()));
  t.equal(res.status, 200);
  t.match(res.json, { ...request, decision: 'allow' });
  t.same(Object.keys(res.json ?? {}).sort(), [...BINDING_FIELDS, 'decision', 'authorized_at', 'expires_at'].sort());
  const { authorizedAt, expiresAt } = timestamps(res);
  t.ok(authorizedAt >= before - 1_000 && authorizedAt <= Date.now() + 1_000, 'authorized now');
  t.equal(expiresAt - authorizedAt, 60_000);
  const [seen] = authorizer.requests();
  t.same(seen?.request, request);
  t.equal(seen?.clientCommonName, 'test-dispatcher');
});

t.test('the decide callback sets the decision; ttlMs the lifetime', async (t) => {
  const authorizer = await startAuthorizer(t, {
    decide: (r) => (r.tenant_id === 'tenant-a' ? 'deny' : 'allow'),
    ttlMs: 5_000,
  });
  const agent = await testAgent(t);
  t.match(response(t, await postJson(agent, authorizer.authorizeUrl, call())).json, { decision: 'deny' });
  const other = response(
    t,
    await postJson(agent, authorizer.authorizeUrl, call({ ...request, tenant_id: 'tenant-b' })),
  );
  t.match(other.json, { decision: 'allow', tenant_id: 'tenant-b' });
  const { authorizedAt, expiresAt } = timestamps(other);
  t.equal(expiresAt - authorizedAt, 5_000);
});

t.test('requests without exactly the binding fields are 400 and recorded as invalid', async (t) => {
  const authorizer = await startAuthorizer(t);
  const agent = await testAgent(t);
  const { args_sha256: _dropped, ...missing } = request;
  const bodies = [
    missing,
    { ...request, extra: 'x' },
    { ...request, approval_id: 7 },
    { ...request, task_id: '' },
    `{"operation_id":"a",${JSON.stringify(request).slice(1)}`,
    [request],
  ];
  for (const body of bodies) {
    t.match(response(t, await postJson(agent, authorizer.authorizeUrl, call(body))), {
      status: 400,
      json: { error: 'invalid_request' },
    });
  }
  t.equal(authorizer.requests().length, bodies.length);
  t.ok(authorizer.requests().every((r) => r.request === null));
});

t.test('answer faults each corrupt exactly one thing', async (t) => {
  const authorizer = await startAuthorizer(t);
  const agent = await testAgent(t);
  const next = async (): Promise<HttpResponse> => response(t, await postJson(agent, authorizer.authorizeUrl, call()));

  authorizer.inject({ kind: 'deny' });
  t.match((await next()).json, { ...request, decision: 'deny' });
  authorizer.inject({ kind: 'missingField' });
  t.notOk('args_sha256' in ((await next()).json ?? {}), 'missingField drops args_sha256');
  authorizer.inject({ kind: 'missingField', field: 'expires_at' });
  t.notOk('expires_at' in ((await next()).json ?? {}));
  authorizer.inject({ kind: 'extraField' });
  t.match((await next()).json, { ...request, decision: 'allow', scope: 'all' });
  authorizer.inject({ kind: 'mismatchedBinding', field: 'tenant_id' });
  t.match((await next()).json, { tenant_id: 'tenant-a-other', decision: 'allow' });

  const now = Date.now();
  authorizer.inject({ kind: 'stale' });
  let ts = timestamps(await next());
  t.ok(ts.authorizedAt < now - 3_000_000 && ts.expiresAt > now, 'stale: old authorized_at, still unexpired');
  authorizer.inject({ kind: 'expired' });
  ts = timestamps(await next());
  t.ok(ts.expiresAt < Date.now() && ts.authorizedAt < ts.expiresAt, 'expired');
  authorizer.inject({ kind: 'ttlTooLong' });
  ts = timestamps(await next());
  t.equal(ts.expiresAt - ts.authorizedAt, 86_400_000, 'ttlTooLong');
  authorizer.inject({ kind: 'clockSkew', skewMs: 600_000 });
  ts = timestamps(await next());
  t.ok(ts.authorizedAt > Date.now() + 500_000, 'clockSkew shifts the clock');

  authorizer.inject({ kind: 'status' });
  t.match(await next(), { status: 500, json: { error: 'injected' } });
  t.match((await next()).json, { decision: 'allow' }, 'each fault applied once');
});

t.test('wire-level faults: duplicate keys, oversized, slow', async (t) => {
  const authorizer = await startAuthorizer(t);
  const agent = await testAgent(t);
  authorizer.inject({ kind: 'duplicateKey' });
  t.match(await postJson(agent, authorizer.authorizeUrl, call()), { kind: 'unknown', code: 'malformed_json' });
  authorizer.inject({ kind: 'duplicateKey' });
  const text = await rawAnswer(authorizer);
  t.equal((JSON.parse(text) as { decision: string }).decision, 'allow', 'a lenient parser would read allow');
  t.match(text, /^\{"decision":"deny",/);

  authorizer.inject({ kind: 'oversized', bytes: 100_000 });
  t.match(await postJson(agent, authorizer.authorizeUrl, call()), { kind: 'unknown', code: 'oversized' });

  authorizer.inject({ kind: 'slow', delayMs: 400 });
  t.match(await postJson(agent, authorizer.authorizeUrl, call(request, { timeoutMs: 100 })), {
    kind: 'unknown',
    code: 'timeout',
  });
  authorizer.inject({ kind: 'slow', delayMs: 50 });
  t.match(await postJson(agent, authorizer.authorizeUrl, call()), { kind: 'response', json: { decision: 'allow' } });
});

t.test('faults by predicate and count; clearFaults; stop before start is safe', async (t) => {
  const authorizer = await startAuthorizer(t);
  const agent = await testAgent(t);
  authorizer.inject({ kind: 'deny' }, { when: (r) => r.operation_id === 'op-2', times: Infinity });
  t.match(response(t, await postJson(agent, authorizer.authorizeUrl, call())).json, { decision: 'allow' });
  for (let i = 0; i < 2; i++) {
    t.match(
      response(t, await postJson(agent, authorizer.authorizeUrl, call({ ...request, operation_id: 'op-2' }))).json,
      { decision: 'deny' },
    );
  }
  authorizer.clearFaults();
  t.match(
    response(t, await postJson(agent, authorizer.authorizeUrl, call({ ...request, operation_id: 'op-2' }))).json,
    { decision: 'allow' },
  );

  const p = await testPki();
  const idle = new SandboxAuthorizer({ tls: { ...p.server, ca: p.ca.cert } });
  await idle.stop();
  await idle.stop();
  t.pass('stop before start and twice');
});

t.test('a client without a certificate never reaches the authorizer', async (t) => {
  const authorizer = await startAuthorizer(t);
  const agent = await testAgent(t, { cert: undefined, key: undefined });
  t.match(await postJson(agent, authorizer.authorizeUrl, call()), { kind: 'not_sent', code: 'tls' });
  t.equal(authorizer.requests().length, 0);
});
