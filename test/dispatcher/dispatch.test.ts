import t from 'tap';
import { canonicalJson } from '../../core/json.js';
import { ctx, dispatchEnv, PROVIDER_TOKEN, settled } from '../helpers/fleet.js';

const args = { order_id: 'ord-1', amount: 1250, currency: 'EUR' };

t.test('happy path: the provider receives exactly the stored arguments and the effect key', async (t) => {
  const e = await dispatchEnv(t);
  await e.dispatcher();
  const r = await e.ledger.reserve(ctx('s1'), 'issue_refund', { currency: 'EUR', amount: 1250.0, order_id: 'ord-1' });
  const done = await settled(e.pool, r.operation_id);
  t.equal(done.status, 'succeeded');
  t.match(done.provider_receipt, /\S+/);
  const reqs = e.provider.requests().filter((q) => q.key === r.effect_key);
  t.equal(reqs.length, 1, 'one request');
  t.equal(reqs[0]?.body, canonicalJson(args), 'the stored canonical arguments');
  t.equal(reqs[0]?.headers['idempotency-key'], r.effect_key);
  t.equal(reqs[0]?.headers.authorization, `Bearer ${PROVIDER_TOKEN}`);
  t.equal(e.provider.effectsFor(r.effect_key), 1);
  const auth = e.authorizer.requests();
  t.equal(auth.length, 1);
  t.match(auth[0], {
    request: {
      operation_id: r.operation_id,
      effect_key: r.effect_key,
      approval_id: 'approval-1',
      policy_version: 'policy-1',
    },
  });
  const ev = await e.pool.query(
    'SELECT decision_sha256, args_sha256 FROM actionledger.authorization_evidence WHERE operation_id = $1',
    [r.operation_id],
  );
  t.equal(ev.rowCount, 1, 'evidence recorded before the call');
  const hist = await e.pool.query(
    'SELECT from_status, to_status FROM actionledger.operation_history WHERE operation_id = $1 ORDER BY id',
    [r.operation_id],
  );
  t.same(
    hist.rows.map((h: { to_status: string }) => h.to_status),
    ['pending', 'executing', 'succeeded'],
  );
  const result = done.result_json as Record<string, unknown>;
  t.notOk(JSON.stringify(result).includes(PROVIDER_TOKEN), 'no credential stored');
  t.match(result, { http_status: 201, body_sha256: /^[0-9a-f]{64}$/ });
});

t.test('each authorization defect: needs_review, the provider never called', async (t) => {
  const e = await dispatchEnv(t);
  await e.dispatcher();
  const defects: [string, Parameters<typeof e.authorizer.inject>[0], string][] = [
    ['deny', { kind: 'deny' }, 'authorization_denied'],
    ['missing field', { kind: 'missingField' }, 'authorization_invalid'],
    ['extra field', { kind: 'extraField' }, 'authorization_invalid'],
    ['mismatched binding', { kind: 'mismatchedBinding' }, 'authorization_invalid'],
    ['duplicate key', { kind: 'duplicateKey' }, 'authorization_invalid'],
    ['oversized', { kind: 'oversized', bytes: 10_000 }, 'authorization_invalid'],
    ['stale', { kind: 'stale', ageMs: 3_600_000 }, 'authorization_stale'],
    ['expired', { kind: 'expired', agoMs: 10_000 }, 'authorization_stale'],
    ['TTL too long', { kind: 'ttlTooLong', ttlMs: 86_400_000 }, 'authorization_stale'],
    ['500', { kind: 'status', status: 500 }, 'authorization_unavailable'],
  ];
  for (const [i, [name, fault, code]] of defects.entries()) {
    const step = `defect-${i}`;
    e.authorizer.inject(fault, { when: (r) => r.workflow_step_id === step, times: Infinity });
    const r = await e.ledger.reserve(ctx(step), 'issue_refund', args);
    const done = await settled(e.pool, r.operation_id);
    t.equal(done.status, 'needs_review', `${name}: needs_review`);
    t.equal(done.review_reason, `authorization:${code}`, `${name}: ${code}`);
    // No decision (a 500) is not a refusal: the operation went back to the queue until the limit was spent.
    if (code === 'authorization_unavailable') t.match(done.result_json, { releases: 8 }, `${name}: released first`);
    else t.notOk('releases' in (done.result_json ?? {}), `${name}: a decision goes to review at once`);
    t.equal(e.provider.requestsFor(r.effect_key), 0, `${name}: provider never called`);
  }
  t.equal(e.provider.requests().length, 0);
});

t.test('mTLS defect: an authorizer with a server certificate from another CA', async (t) => {
  const { createCa, issueServerCert, SandboxAuthorizer } = await import('../../sandbox/index.js');
  const e = await dispatchEnv(t);
  const other = await createCa('other-ca');
  const foreign = await issueServerCert(other, { hosts: ['localhost', '127.0.0.1'] });
  // The same authorizer URL served by certificates the dispatcher must refuse: swap the authorizer.
  const port = Number(new URL(e.authorizer.authorizeUrl).port);
  await e.authorizer.stop();
  const ownCa = (await import('node:fs')).readFileSync(`${e.dir}/ca.crt`, 'utf8');
  const cases = [['foreign CA', { cert: foreign.cert, key: foreign.key, ca: ownCa }]] as const;
  for (const [name, tls] of cases) {
    const bad = new SandboxAuthorizer({ tls, port });
    await bad.start();
    const d = await e.dispatcher(2);
    const r = await e.ledger.reserve(ctx(`tls-${name}`), 'issue_refund', args);
    const done = await settled(e.pool, r.operation_id);
    t.equal(done.status, 'needs_review', name);
    t.equal(done.review_reason, 'authorization:authorization_unavailable', name);
    t.match(done.result_json, { releases: 8 }, `${name}: released to the queue as often as the limit allows first`);
    t.equal(e.provider.requestsFor(r.effect_key), 0);
    await d.stop();
    await bad.stop();
  }
});

t.test('provider outcomes: timeout, 500, reset, oversized, redirect, no receipt, definitive 422', async (t) => {
  const e = await dispatchEnv(t);
  await e.dispatcher();
  const cases: [string, Parameters<typeof e.provider.inject>[0], string, number][] = [
    ['timeout', { kind: 'timeout' }, 'unknown', 1],
    ['500', { kind: 'status', status: 500 }, 'unknown', 1],
    ['429', { kind: 'status', status: 429 }, 'unknown', 1],
    ['commit then reset', { kind: 'commitThenReset' }, 'unknown', 1],
    ['reset before commit', { kind: 'resetBeforeCommit' }, 'unknown', 1],
    ['oversized', { kind: 'oversized', bytes: 100_000 }, 'unknown', 1],
    ['duplicate-key JSON', { kind: 'duplicateKeyJson' }, 'unknown', 1],
    ['redirect', { kind: 'redirect', location: 'https://localhost:1/elsewhere' }, 'unknown', 1],
    ['no receipt', { kind: 'noReceipt' }, 'needs_review', 1],
    ['422', { kind: 'status', status: 422 }, 'failed', 1],
  ];
  for (const [i, [name, fault, state, requests]] of cases.entries()) {
    const step = `p-${i}`;
    const r = await e.ledger.reserve(ctx(step), 'issue_refund', args);
    e.provider.inject(fault, { when: (k) => k === r.effect_key, times: Infinity });
    const done = await settled(e.pool, r.operation_id);
    t.equal(done.status, state, `${name}: ${state}`);
    t.equal(e.provider.requestsFor(r.effect_key), requests, `${name}: sent once, never re-sent`);
  }
});
