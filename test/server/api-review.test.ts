/**
 * The review and audit routes over real HTTP and a real PostgreSQL. Operations are reserved through the gate
 * and put in review through the ledger's own fenced transitions (claimed, then sent to review with the reason
 * and provider contact a dispatcher or reconciler records). A person lists them, retries the safe ones and
 * resolves the others over HTTP; each action is audited with the caller and its request id. Another tenant's
 * operation answers exactly like a random id and is left as it was; the audit log shows only the caller's
 * tenant and pages each row once.
 */
import t from 'tap';
import type { ProviderContact } from '../../ledger/index.js';
import { apiFixture, type ApiFixture } from '../helpers/api.js';
import { auditRows, gctx } from '../helpers/gate.js';
import { putOut } from '../helpers/review-state.js';

const RANDOM = '6f1e2a1c-9d3b-4c55-8a1e-0b7f3c2d1e00';

/** Reserves a transfer through the gate in `tenant`, claims it and sends it to review as a worker would. */
async function inReview(
  f: ApiFixture,
  step: string,
  reason: string,
  contact: ProviderContact,
  tenant = 'tenant-a',
): Promise<string> {
  const r = await f.gate.call(gctx({ tenant_id: tenant, workflow_step_id: step }), 'transfer_funds', {
    to_account: 'ACC0000000001',
    amount: 10,
  });
  if (!r.ok || r.operation_id === undefined) throw new Error(`not reserved: ${JSON.stringify(r)}`);
  const id = r.operation_id;
  await putOut(f, id, { reason, contact });
  return id;
}

async function op(f: ApiFixture, id: string) {
  const { rows } = await f.pool.query<{ status: string; attempt: number; provider_receipt: string | null }>(
    'SELECT status, attempt, provider_receipt FROM actionledger.operations WHERE operation_id = $1',
    [id],
  );
  return rows[0];
}

/** Waits until `n` rows of the API's own audit (written once the answer is sent) are in; no timing is asserted. */
async function apiRowsWritten(f: ApiFixture, n: number): Promise<void> {
  for (let i = 0; i < 200; i++) {
    if ((await auditRows(f.pool, "action = 'api'")).length >= n) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`fewer than ${n} api audit rows`);
}

async function populate(f: ApiFixture) {
  return {
    denied: await inReview(f, 's1', 'authorization:authorization_denied', 'not_called'),
    noReceipt: await inReview(f, 's2', 'provider:provider_no_receipt', 'maybe_called'),
    unreachable: await inReview(f, 's3', 'provider:provider_unreachable:ECONNREFUSED', 'not_called'),
    theirs: await inReview(f, 's4', 'authorization:authorization_denied', 'not_called', 'tenant-b'),
  };
}

t.test('the review list: read or review; only the caller’s tenant; filters', async (t) => {
  const f = await apiFixture(t);
  const ids = await populate(f);
  const ops = await f.token('ops-1', ['operator']);
  const list = await f.call('GET', '/v1/review', { token: ops });
  t.equal(list.status, 200);
  t.match(list.body, { ok: true, total: 3, truncated: false });
  const listed = list.body.operations as { operation_id: string; retry_safe: boolean; tenant_id: string }[];
  t.same(
    listed.map((o) => [o.operation_id, o.retry_safe]),
    [
      [ids.denied, true],
      [ids.noReceipt, false],
      [ids.unreachable, true],
    ],
    'oldest first, with whether a retry is safe; never the other tenant’s',
  );
  const prefix = await f.call('GET', '/v1/review?reason=provider:', { token: ops });
  t.same(
    (prefix.body.operations as { operation_id: string }[]).map((o) => o.operation_id),
    [ids.noReceipt, ids.unreachable],
  );
  const limited = await f.call('GET', '/v1/review?limit=1', { token: ops });
  t.match(limited.body, { total: 3, truncated: true, operations: [{ operation_id: ids.denied }] });
  t.same((await f.call('GET', '/v1/review?tool=issue_refund', { token: ops })).body.operations, []);
  t.same((await f.call('GET', '/v1/review?older_than_s=3600', { token: ops })).body.operations, []);

  const opsB = await f.token('ops-b', ['operator'], { tenant: 'tenant-b' });
  const listB = await f.call('GET', '/v1/review', { token: opsB });
  t.same(
    (listB.body.operations as { operation_id: string }[]).map((o) => o.operation_id),
    [ids.theirs],
  );
  const auditor = await f.token('aud-1', ['auditor']);
  t.equal((await f.call('GET', '/v1/review', { token: auditor })).status, 200, 'read may list');
  const agent = await f.token('agent-1', ['agent']);
  t.match(await f.call('GET', '/v1/review', { token: agent }), { status: 403, body: { error: 'permission_denied' } });
  t.equal((await f.call('GET', '/v1/review')).status, 401);
  t.equal((await f.call('GET', '/v1/review?limit=0', { token: ops })).status, 422);
  t.equal((await f.call('GET', '/v1/review?nope=1', { token: ops })).status, 422);
});

t.test('retry and resolve over HTTP, each audited with the caller and its request id', async (t) => {
  const f = await apiFixture(t);
  const ids = await populate(f);
  const ops = await f.token('ops-1', ['operator'], { kind: 'person' });
  const moved = await f.call('POST', `/v1/operations/${ids.denied}/review/retry`, {
    token: ops,
    body: { reason: 'as listed', expect: { attempt: 1, review_reason: 'authorization:authorization_unavailable' } },
  });
  t.match(moved, { status: 409, body: { error: 'invalid_state_transition', details: { expected_attempt: 1 } } });
  t.match(await op(f, ids.denied), { status: 'needs_review', attempt: 1 }, 'not what was listed: unchanged');
  const retry = await f.call('POST', `/v1/operations/${ids.denied}/review/retry`, {
    token: ops,
    body: {
      reason: 'the authorizer was misconfigured; fixed',
      expect: { attempt: 1, review_reason: 'authorization:authorization_denied' },
    },
  });
  t.equal(retry.status, 200);
  t.same(retry.body, { ok: true, operation_id: ids.denied, from: 'needs_review', to: 'pending', attempt: 2 });
  t.match(await op(f, ids.denied), { status: 'pending', attempt: 2 });
  const outbox = await f.pool.query('SELECT attempt FROM actionledger.outbox WHERE operation_id = $1', [ids.denied]);
  t.same(outbox.rows, [{ attempt: 2 }], 'a new outbox attempt');

  for (const bad of ['   ', 'line\nbreak', 'tab\there', '']) {
    const r = await f.call('POST', `/v1/operations/${ids.noReceipt}/review/retry`, {
      token: ops,
      body: { reason: bad },
    });
    t.match(
      r,
      { status: 422, body: { error: 'invalid_request', details: { field: 'body.reason' } } },
      JSON.stringify(bad),
    );
  }
  const unsafe = await f.call('POST', `/v1/operations/${ids.noReceipt}/review/retry`, {
    token: ops,
    body: { reason: 'try again' },
  });
  t.match(unsafe, { status: 409, body: { error: 'retry_not_safe', details: { provider_contact: 'maybe_called' } } });
  t.match(await op(f, ids.noReceipt), { status: 'needs_review', attempt: 1 }, 'refused: unchanged');
  const again = await f.call('POST', `/v1/operations/${ids.denied}/review/retry`, {
    token: ops,
    body: { reason: 'x' },
  });
  t.match(again, { status: 409, body: { error: 'invalid_state_transition' } }, 'not in review any more');

  const badReceipt = await f.call('POST', `/v1/operations/${ids.noReceipt}/review/resolve-succeeded`, {
    token: ops,
    body: { reason: 'found it', receipt: 'has a space' },
  });
  t.match(badReceipt, { status: 422, body: { error: 'invalid_request', details: { field: 'body.receipt' } } });
  const noReceipt = await f.call('POST', `/v1/operations/${ids.noReceipt}/review/resolve-succeeded`, {
    token: ops,
    body: { reason: 'found it' },
  });
  t.match(noReceipt, { status: 422, body: { details: { field: 'body.receipt' } } });
  const resolved = await f.call('POST', `/v1/operations/${ids.noReceipt}/review/resolve-succeeded`, {
    token: ops,
    body: { reason: 'the provider dashboard shows it', receipt: 'rcpt-42' },
  });
  t.match(resolved, { status: 200, body: { ok: true, from: 'needs_review', to: 'succeeded' } });
  t.match(await op(f, ids.noReceipt), { status: 'succeeded', provider_receipt: 'rcpt-42' });

  const failed = await f.call('POST', `/v1/operations/${ids.unreachable}/review/resolve-failed`, {
    token: ops,
    body: { reason: 'the customer cancelled' },
  });
  t.match(failed, { status: 200, body: { ok: true, from: 'needs_review', to: 'failed' } });
  t.match(await op(f, ids.unreachable), { status: 'failed' });

  const compensate = await f.call('POST', `/v1/operations/${ids.noReceipt}/review/compensate`, {
    token: ops,
    body: { reason: 'sent twice by hand' },
  });
  t.match(compensate, {
    status: 200,
    body: { ok: true, from: 'succeeded', to: 'needs_review', compensation: 'escalated' },
  });
  t.match(await op(f, ids.noReceipt), { status: 'needs_review' }, 'no compensation mapped: back to a person');

  const rows = await auditRows(f.pool, "action LIKE 'review:%'");
  t.same(
    rows.map((r) => [r.action, r.outcome, r.principal_id, r.tenant_id, r.tool_name]),
    [
      ['review:retry', 'invalid_state_transition', 'ops-1', 'tenant-a', 'transfer_funds'],
      ['review:retry', 'ok', 'ops-1', 'tenant-a', 'transfer_funds'],
      ['review:retry', 'retry_not_safe', 'ops-1', 'tenant-a', 'transfer_funds'],
      ['review:retry', 'invalid_state_transition', 'ops-1', 'tenant-a', 'transfer_funds'],
      ['review:resolve_succeeded', 'ok', 'ops-1', 'tenant-a', 'transfer_funds'],
      ['review:resolve_failed', 'ok', 'ops-1', 'tenant-a', 'transfer_funds'],
      ['review:compensate', 'ok', 'ops-1', 'tenant-a', 'transfer_funds'],
    ],
    'the malformed bodies never reached the review',
  );
  t.equal(rows[1]?.trace_id, retry.headers.get('x-request-id'), 'the request id is the trace id');
  t.match(rows[1]?.detail, {
    request_id: retry.headers.get('x-request-id'),
    why: 'the authorizer was misconfigured; fixed',
  });
});

t.test('another tenant’s operation answers exactly like a random id and is left as it was', async (t) => {
  const f = await apiFixture(t);
  const ids = await populate(f);
  const ops = await f.token('ops-1', ['operator']);
  const actions: [string, Record<string, unknown>][] = [
    ['retry', { reason: 'x' }],
    ['resolve-succeeded', { reason: 'x', receipt: 'r-1' }],
    ['resolve-failed', { reason: 'x' }],
    ['compensate', { reason: 'x' }],
  ];
  for (const [action, body] of actions) {
    const texts: string[] = [];
    for (const id of [ids.theirs, RANDOM, 'not-a-uuid']) {
      const r = await f.call('POST', `/v1/operations/${id}/review/${action}`, { token: ops, body });
      t.equal(r.status, 404, `${action} ${id}`);
      texts.push(r.text);
    }
    t.equal(new Set(texts).size, 1, `${action}: one answer: ${texts[0] ?? ''}`);
  }
  t.match(await op(f, ids.theirs), { status: 'needs_review', attempt: 1 }, 'theirs is untouched');
  const foreign = await auditRows(f.pool, "action LIKE 'review:%' AND subject_id IN ($1, $2)", [ids.theirs, RANDOM]);
  t.equal(foreign.length, 8);
  t.same(
    new Set(foreign.map((r) => `${String(r.tenant_id)}|${String(r.tool_name)}|${String(r.outcome)}`)),
    new Set(['tenant-a|null|not_found']),
    'audited like a missing one: nothing read from the other tenant’s operation',
  );
  const auditor = await f.token('aud-1', ['auditor']);
  const forbidden = await f.call('POST', `/v1/operations/${ids.denied}/review/retry`, {
    token: auditor,
    body: { reason: 'x' },
  });
  t.match(forbidden, { status: 403, body: { error: 'permission_denied', details: { capability: 'review' } } });
  t.match(await op(f, ids.denied), { status: 'needs_review' });
});

t.test('two retries of one operation at once: one moves it, the other is refused', async (t) => {
  const f = await apiFixture(t);
  const ids = await populate(f);
  const ops = await f.token('ops-1', ['operator']);
  const both = await Promise.all(
    [1, 2].map(() =>
      f.call('POST', `/v1/operations/${ids.denied}/review/retry`, { token: ops, body: { reason: 'go' } }),
    ),
  );
  t.same(both.map((r) => r.status).sort(), [200, 409]);
  t.match(await op(f, ids.denied), { status: 'pending', attempt: 2 }, 'one new attempt');
});

t.test('the audit log: the caller’s tenant only, newest first, filtered, each row once across pages', async (t) => {
  const f = await apiFixture(t);
  const ids = await populate(f);
  const ops = await f.token('ops-1', ['operator']);
  const opsB = await f.token('ops-b', ['operator'], { tenant: 'tenant-b' });
  await f.call('POST', `/v1/operations/${ids.denied}/review/retry`, { token: ops, body: { reason: 'go' } });
  await f.call('POST', `/v1/operations/${ids.theirs}/review/retry`, { token: opsB, body: { reason: 'go' } });
  const auditor = await f.token('aud-1', ['auditor']);
  await apiRowsWritten(f, 2);

  const all = await f.call('GET', '/v1/audit?limit=500', { token: auditor });
  t.equal(all.status, 200);
  const rows = all.body.rows as { id: string; tenant_id: string; action: string }[];
  t.ok(rows.length >= 5, `${rows.length} rows`);
  t.ok(
    rows.every((r) => r.tenant_id === 'tenant-a'),
    'only the tenant’s rows',
  );
  const expected = await auditRows(f.pool, "tenant_id = 'tenant-a'");
  t.same(
    rows.map((r) => r.id),
    expected.map((r) => String(r.id)).reverse(),
    'every row of the tenant, newest first',
  );
  t.equal(all.body.next_cursor, null);

  const seen: string[] = [];
  let cursor: string | null = null;
  let pages = 0;
  do {
    const r = await f.call('GET', `/v1/audit?limit=2${cursor === null ? '' : `&cursor=${cursor}`}`, { token: auditor });
    t.equal(r.status, 200);
    seen.push(...(r.body.rows as { id: string }[]).map((x) => x.id));
    cursor = r.body.next_cursor as string | null;
    pages++;
    if (pages === 1) await f.call('PUT', '/v1/kill-switches/issue_refund', { token: ops, body: { reason: 'new row' } });
  } while (cursor !== null && pages < 100);
  t.same(
    seen,
    rows.map((r) => r.id),
    'each row once; rows written meanwhile are newer than the first page',
  );

  const retries = await f.call('GET', '/v1/audit?action=review:retry', { token: auditor });
  t.match(retries.body.rows, [
    { action: 'review:retry', outcome: 'ok', principal_id: 'ops-1', subject_id: ids.denied },
  ]);
  t.equal((retries.body.rows as unknown[]).length, 1, 'not the other tenant’s retry');
  const bySubject = await f.call('GET', `/v1/audit?subject_id=${ids.theirs}`, { token: auditor });
  t.same(bySubject.body.rows, [], 'another tenant’s subject shows nothing');
  const future = await f.call('GET', '/v1/audit?since=2999-01-01T00:00:00Z', { token: auditor });
  t.same(future.body.rows, []);
  const past = await f.call('GET', `/v1/audit?since=${encodeURIComponent('2000-01-01T01:00:00.5+01:00')}&limit=1`, {
    token: auditor,
  });
  t.match(past.body, { rows: [{ tenant_id: 'tenant-a' }], next_cursor: String });
  for (const q of ['since=yesterday', 'since=2026-02-30T00:00:00Z', 'since=2026-01-01T24:00:00Z', 'limit=0', 'x=1']) {
    t.match(
      await f.call('GET', `/v1/audit?${q}`, { token: auditor }),
      { status: 422, body: { error: 'invalid_request' } },
      q,
    );
  }
  const forged = Buffer.from('a99999999999999999').toString('base64url');
  const fromTop = await f.call('GET', `/v1/audit?limit=500&cursor=${forged}`, { token: auditor });
  t.ok(
    (fromTop.body.rows as { tenant_id: string }[]).every((r) => r.tenant_id === 'tenant-a'),
    'a made-up cursor still shows only the tenant’s rows',
  );
  for (const bad of ['nope', Buffer.from('a0').toString('base64url'), Buffer.from('a1; --').toString('base64url')])
    t.match(await f.call('GET', `/v1/audit?cursor=${bad}`, { token: auditor }), {
      status: 422,
      body: { details: { field: 'cursor' } },
    });
  const agent = await f.token('agent-1', ['agent']);
  t.match(await f.call('GET', '/v1/audit', { token: agent }), {
    status: 403,
    body: { details: { capability: 'audit' } },
  });
  t.equal((await f.call('GET', '/v1/audit')).status, 401);
});
