/**
 * Operations over HTTP on a real listener and a real PostgreSQL: a trusted service's direct reservation
 * (capability reserve; replayed, conflicting, never taking over a step the gate reserved), one operation with
 * its history (read, or its own principal), and the tenant's list, keyset-paged. Every read is the caller's
 * tenant's only: another tenant's operation is 404 with exactly the body a random id gets, and the list walks
 * an index of the tenant's rows, not the whole table.
 */
import t from 'tap';
import { bindQueries } from '../../db/db.js';
import { ledgerTenantQueries } from '../../ledger/queries.js';
import { apiFixture, type ApiFixture } from '../helpers/api.js';
import { count } from '../helpers/gate.js';

const TRANSFER = { to_account: 'ACC0000000002', amount: 25 };
const RANDOM_ID = '6f1c2b9e-0d4a-4c52-9a57-3e0f1b2c4d5e';

const reserveBody = (step: string, over: Record<string, unknown> = {}) => ({
  tool: 'transfer_funds',
  arguments: TRANSFER,
  task_id: 'task-1',
  workflow_step_id: step,
  approval_id: 'ap-1',
  policy_version: 'p-1',
  ...over,
});

const reserve = (f: ApiFixture, token: string | undefined, body: Record<string, unknown>) =>
  f.call('POST', '/v1/operations', { token, body });

t.test('a direct reservation: created, replayed, conflicting; only with the reserve capability', async (t) => {
  const f = await apiFixture(t);
  const svc = await f.token('svc-1', ['service']);
  const first = await reserve(f, svc, reserveBody('s-1'));
  t.equal(first.status, 200);
  t.same(Object.keys(first.body).sort(), ['created', 'effect_key', 'ok', 'operation_id', 'status']);
  t.match(first.body, { ok: true, operation_id: String, effect_key: /^v1\.k1\./, created: true, status: 'pending' });
  const row = await f.pool.query(
    'SELECT tenant_id, principal_id, current_approval_id, current_policy_version FROM actionledger.operations',
  );
  t.same(row.rows, [
    { tenant_id: 'tenant-a', principal_id: 'svc-1', current_approval_id: 'ap-1', current_policy_version: 'p-1' },
  ]);
  const history = await f.pool.query('SELECT actor, reason FROM actionledger.operation_history');
  t.same(history.rows, [{ actor: 'api:svc-1', reason: 'reserved' }], 'the history names the API caller');
  t.equal(await count(f.pool, 'actionledger.outbox'), 1, 'queued for dispatch');

  const replay = await reserve(f, svc, reserveBody('s-1'));
  t.same(replay.body, { ...first.body, created: false }, 'the same body again: the same operation');
  const conflict = await reserve(f, svc, reserveBody('s-1', { arguments: { ...TRANSFER, amount: 26 } }));
  t.equal(conflict.status, 409);
  t.match(conflict.body, {
    ok: false,
    error: 'operation_conflict',
    details: { operation_id: first.body.operation_id, changed: ['arguments'] },
  });

  t.equal((await reserve(f, undefined, reserveBody('s-2'))).status, 401);
  const agent = await f.token('agent-1', ['agent']);
  const forbidden = await reserve(f, agent, reserveBody('s-2'));
  t.equal(forbidden.status, 403);
  t.match(forbidden.body, { error: 'permission_denied', details: { capability: 'reserve' } });
  const forUser = await reserve(f, svc, reserveBody('s-2', { user: { principal_id: 'user-1' } }));
  t.match(forUser, { status: 403, body: { details: { capability: 'act_for_users' } } });
  const tenant = await reserve(f, svc, reserveBody('s-2', { tenant_id: 'tenant-b' }));
  t.match(tenant, { status: 422, body: { error: 'invalid_request', details: { field: 'body.tenant_id' } } });
  const noRoute = await reserve(f, svc, reserveBody('s-2', { tool: 'no_such_tool' }));
  t.match(noRoute, { status: 422, body: { error: 'route_not_approved' } });
  let deep: Record<string, unknown> = { x: 1 };
  for (let i = 0; i < 20; i++) deep = { x: deep };
  const badArgs = await reserve(f, svc, reserveBody('s-2', { arguments: deep }));
  t.match(badArgs, { status: 422, body: { error: 'invalid_arguments' } });
  t.equal(await count(f.pool, 'actionledger.operations'), 1, 'nothing else reserved');

  const runtime = await f.token('runtime-1', ['service', 'agent-runtime'], { tenant: 'tenant-b' });
  const asUser = await reserve(f, runtime, reserveBody('s-1', { user: { principal_id: 'user-1' } }));
  t.match(asUser, { status: 200, body: { ok: true, created: true } });
  const userRow = await f.pool.query(
    'SELECT tenant_id, principal_id FROM actionledger.operations WHERE operation_id = $1',
    [asUser.body.operation_id],
  );
  t.same(userRow.rows, [{ tenant_id: 'tenant-b', principal_id: 'user-1' }], 'the user’s, in the token’s tenant');
});

t.test(
  'a direct reservation never takes over a step the gate reserved; another tenant’s step is its own',
  async (t) => {
    const f = await apiFixture(t);
    // One principal acting in two tenants: the agent through the gate, the service role in both.
    const agent = await f.token('p-1', ['agent', 'service']);
    const gated = await f.call('POST', '/v1/calls', {
      token: agent,
      body: { tool: 'transfer_funds', arguments: TRANSFER, task_id: 'task-1', workflow_step_id: 's-1', role: 'agent' },
    });
    t.match(gated.body, { ok: true, status: 'reserved', created: true });
    const takeover = await reserve(f, agent, reserveBody('s-1', { approval_id: 'mine-now' }));
    t.equal(takeover.status, 409);
    t.match(takeover.body, { error: 'operation_conflict', message: /reserved through the gate/ });
    const op = await f.pool.query('SELECT current_approval_id, current_policy_version FROM actionledger.operations');
    t.same(op.rows, [{ current_approval_id: 'auto', current_policy_version: 'gate-policy-1' }], 'rolled back');

    // The same principal, task and step in another tenant is another operation (the identity includes the tenant).
    const inB = await f.token('p-1', ['service'], { tenant: 'tenant-b' });
    const otherTenant = await reserve(f, inB, reserveBody('s-1', { arguments: { ...TRANSFER, amount: 99 } }));
    t.equal(otherTenant.status, 200);
    t.match(otherTenant.body, { ok: true, created: true });
    t.not(otherTenant.body.operation_id, gated.body.operation_id, 'its own operation, nothing of the other revealed');
    t.equal(await count(f.pool, 'actionledger.operations'), 2);
  },
);

t.test('one operation: read capability or its own principal; another tenant’s is a random id', async (t) => {
  const f = await apiFixture(t);
  const svc = await f.token('svc-1', ['service']);
  const other = await f.token('svc-2', ['service']);
  const ops = await f.token('ops-1', ['operator']);
  const opsB = await f.token('ops-b', ['operator'], { tenant: 'tenant-b' });
  const reserved = await reserve(f, svc, reserveBody('s-1'));
  const id = String(reserved.body.operation_id);

  const byOps = await f.call('GET', `/v1/operations/${id}`, { token: ops });
  t.equal(byOps.status, 200);
  t.match(byOps.body, {
    ok: true,
    operation: {
      operation_id: id,
      tenant_id: 'tenant-a',
      principal_id: 'svc-1',
      tool_name: 'transfer_funds',
      status: 'pending',
      arguments_json: TRANSFER,
      effect_key: reserved.body.effect_key,
    },
    history: [{ from_status: null, to_status: 'pending', actor: 'api:svc-1', reason: 'reserved' }],
  });
  const byOwner = await f.call('GET', `/v1/operations/${id}`, { token: svc });
  t.same(byOwner.body, byOps.body, 'its own principal reads it without read');
  const upper = await f.call('GET', `/v1/operations/${id.toUpperCase()}`, { token: ops });
  t.equal(upper.status, 200, 'the id in capitals is the same id');

  t.equal((await f.call('GET', `/v1/operations/${id}`)).status, 401);
  const misses = [
    await f.call('GET', `/v1/operations/${id}`, { token: opsB }),
    await f.call('GET', `/v1/operations/${RANDOM_ID}`, { token: opsB }),
    await f.call('GET', `/v1/operations/${RANDOM_ID}`, { token: ops }),
    await f.call('GET', '/v1/operations/not-a-uuid', { token: ops }),
    await f.call('GET', `/v1/operations/${id}`, { token: other }),
    await f.call('GET', `/v1/operations/${id}x`, { token: ops }),
  ];
  t.same(
    misses.map((r) => r.status),
    [404, 404, 404, 404, 404, 404],
  );
  t.same(new Set(misses.map((r) => r.text)).size, 1, 'one body for every miss');
  t.same(misses[0]?.body, { ok: false, error: 'not_found', message: 'no such operation' });
});

t.test('the list: the tenant’s only, newest first, each operation on exactly one page', async (t) => {
  const f = await apiFixture(t);
  const svc = await f.token('svc-1', ['service']);
  const svcB = await f.token('svc-b', ['service'], { tenant: 'tenant-b' });
  const ops = await f.token('ops-1', ['operator']);
  const ids: string[] = [];
  for (let i = 0; i < 7; i++) {
    const r = await reserve(
      f,
      svc,
      reserveBody(`s-${i}`, {
        task_id: i < 4 ? 'task-1' : 'task-2',
        ...(i === 6 ? { tool: 'issue_refund', arguments: { order_id: 'O-1', amount: 1, currency: 'GBP' } } : {}),
      }),
    );
    ids.push(String(r.body.operation_id));
  }
  for (let i = 0; i < 3; i++) await reserve(f, svcB, reserveBody(`b-${i}`));

  const seen: string[] = [];
  const pages: number[] = [];
  let cursor: string | null = null;
  do {
    const path: string = `/v1/operations?limit=3${cursor === null ? '' : `&cursor=${cursor}`}`;
    const r = await f.call('GET', path, { token: ops });
    t.equal(r.status, 200, path);
    const rows = r.body.operations as { operation_id: string; tenant_id: string }[];
    pages.push(rows.length);
    for (const row of rows) {
      t.equal(row.tenant_id, 'tenant-a');
      seen.push(row.operation_id);
    }
    cursor = r.body.next_cursor as string | null;
  } while (cursor !== null && pages.length < 10);
  t.same(pages, [3, 3, 1]);
  t.same(seen, [...ids].reverse(), 'every operation once, newest first');

  const all = await f.call('GET', '/v1/operations', { token: ops });
  t.equal((all.body.operations as unknown[]).length, 7, 'default page size holds them all');
  t.equal(all.body.next_cursor, null);
  t.notOk('arguments_json' in ((all.body.operations as Record<string, unknown>[])[0] ?? {}), 'no arguments in a list');
  const list = async (query: string) =>
    (
      (await f.call('GET', `/v1/operations?${query}`, { token: ops })).body.operations as { operation_id: string }[]
    ).map((o) => o.operation_id);
  t.same(await list('task_id=task-2'), ids.slice(4).reverse());
  t.same(await list('tool=issue_refund'), [ids[6]]);
  t.same(await list('tool=issue_refund&task_id=task-1'), []);
  t.same(await list('status=pending&principal_id=svc-1&limit=2'), ids.slice(5).reverse());
  t.same(await list('status=succeeded'), []);
  t.same(await list('principal_id=svc-b'), [], 'another tenant’s principal: nothing');
  const opsB = await f.token('ops-b', ['operator'], { tenant: 'tenant-b' });
  t.equal(
    ((await f.call('GET', '/v1/operations', { token: opsB })).body.operations as unknown[]).length,
    3,
    'tenant-b sees its three',
  );

  for (const [query, field] of [
    ['cursor=nonsense', 'cursor'],
    [`cursor=${Buffer.from(`12:${RANDOM_ID}`).toString('base64url')}x`, 'cursor'],
    [`cursor=${Buffer.from(`-1:${RANDOM_ID}`).toString('base64url')}`, 'cursor'],
    [`cursor=${Buffer.from('12:not-a-uuid').toString('base64url')}`, 'cursor'],
    ['cursor=', 'querystring.cursor'],
    ['limit=0', 'querystring.limit'],
    ['limit=201', 'querystring.limit'],
    ['limit=ten', 'querystring.limit'],
    ['status=done', 'querystring.status'],
    ['tenant_id=tenant-b', 'querystring.tenant_id'],
  ] as const) {
    const r = await f.call('GET', `/v1/operations?${query}`, { token: ops });
    t.equal(r.status, 422, query);
    t.match(r.body, { ok: false, error: 'invalid_request', details: { field } }, query);
  }
  t.equal((await f.call('GET', '/v1/operations')).status, 401);
  const denied = await f.call('GET', '/v1/operations', { token: svc });
  t.match(denied, { status: 403, body: { error: 'permission_denied', details: { capability: 'read' } } });
});

t.test(
  'a page boundary inside one microsecond: rows with the same created_at are neither lost nor repeated',
  async (t) => {
    const f = await apiFixture(t);
    const ops = await f.token('ops-1', ['operator']);
    await f.pool.query(`
    INSERT INTO actionledger.operations (operation_id, effect_key, effect_key_id, principal_id, task_id,
      workflow_step_id, tool_name, tenant_id, provider_id, provider_endpoint, idempotency_header,
      canonical_args_sha256, arguments_json, current_approval_id, current_policy_version, status, created_at)
    SELECT gen_random_uuid(), 'same-' || i, 'k1', 'p', 't', 's' || i, 'transfer_funds', 'tenant-a', 'x', 'x', 'x',
      repeat('0', 64), '{}', 'a', 'v', 'succeeded', timestamptz '2026-01-01 00:00:00.123456+00'
    FROM generate_series(1, 5) i`);
    const seen: string[] = [];
    let cursor: string | null = null;
    for (let i = 0; i < 10; i++) {
      const r = await f.call('GET', `/v1/operations?limit=2${cursor === null ? '' : `&cursor=${cursor}`}`, {
        token: ops,
      });
      seen.push(...(r.body.operations as { operation_id: string }[]).map((o) => o.operation_id));
      cursor = r.body.next_cursor as string | null;
      if (cursor === null) break;
    }
    const expected = await f.pool.query<{ operation_id: string }>(
      'SELECT operation_id FROM actionledger.operations ORDER BY operation_id DESC',
    );
    t.same(
      seen,
      expected.rows.map((r) => r.operation_id),
    );
  },
);

t.test('listing reads the caller’s tenant through its index, not every tenant’s rows', async (t) => {
  const f = await apiFixture(t);
  await f.pool.query(`
    INSERT INTO actionledger.operations (operation_id, effect_key, effect_key_id, principal_id, task_id,
      workflow_step_id, tool_name, tenant_id, provider_id, provider_endpoint, idempotency_header,
      canonical_args_sha256, arguments_json, current_approval_id, current_policy_version, status, created_at)
    SELECT gen_random_uuid(), 'big-' || i, 'k1', 'p-' || (i % 7), 't-' || (i % 13), 's' || i, 'transfer_funds',
      'tenant-' || (i % 40), 'x', 'x', 'x', repeat('0', 64), '{}', 'a', 'v', 'succeeded',
      now() - i * interval '1 second'
    FROM generate_series(1, 40000) i;
    ANALYZE actionledger.operations`);
  const q = bindQueries(ledgerTenantQueries, '"actionledger"');
  const plan = async (text: string, params: unknown[]) => {
    const { rows } = await f.pool.query<{ 'QUERY PLAN': unknown }>(
      `EXPLAIN (ANALYZE, FORMAT JSON, COSTS OFF, TIMING OFF) ${text}`,
      params,
    );
    return JSON.stringify(rows[0]?.['QUERY PLAN']);
  };
  const first = await plan(q.tenantListFirst, ['tenant-3', null, null, null, null, 51]);
  t.match(first, /operations_tenant_created_idx/, 'the tenant index');
  t.notMatch(first, /Seq Scan/, 'no sequential scan');
  t.notMatch(first, /"Sort"/, 'no sort: the index gives the order');
  const after = await plan(q.tenantListAfter, ['tenant-3', null, null, null, null, 51, '1700000000000000', RANDOM_ID]);
  t.match(after, /operations_tenant_created_idx/);
  t.notMatch(after, /Seq Scan/);
  const filtered = await plan(q.tenantListFirst, ['tenant-3', 'succeeded', 'transfer_funds', 't-1', 'p-1', 51]);
  t.notMatch(filtered, /Seq Scan/, 'with every filter too');
  const rowsRead = [...first.matchAll(/"Actual Rows": (\d+)/g)].map((m) => Number(m[1]));
  t.ok(Math.max(...rowsRead) <= 51, `at most a page plus one read: ${rowsRead.join(', ')}`);
});

t.test('the OpenAPI document: the operation routes, and what a direct reservation means at dispatch', async (t) => {
  const f = await apiFixture(t);
  const doc = (await f.call('GET', '/v1/openapi.json')).body as {
    paths: Record<string, Record<string, { operationId: string; description?: string; parameters?: unknown[] }>>;
  };
  t.equal(doc.paths['/v1/operations']?.post?.operationId, 'reserveOperation');
  t.match(doc.paths['/v1/operations']?.post?.description, /gate\.direct_reservations is allow.*deny/s);
  t.equal(doc.paths['/v1/operations']?.get?.operationId, 'listOperations');
  t.equal(doc.paths['/v1/operations']?.get?.parameters?.length, 6);
  t.equal(doc.paths['/v1/operations/{id}']?.get?.operationId, 'getOperation');
});
