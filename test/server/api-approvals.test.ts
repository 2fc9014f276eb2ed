/**
 * The approval routes over real HTTP and a real PostgreSQL: an agent's call waits for approval (through the
 * gate), a supervisor lists it, reads the exact envelope and approves it with the hash it was shown, and the
 * operation is reserved. A wrong hash, the requester approving itself, a revoked role, a role that decides
 * nothing, a second vote by the same person and a decision on another tenant's approval are each refused with
 * their status and leave the approval as it was. Lists page each row once and never show another tenant's.
 */
import t, { type Test } from 'tap';
import { canonicalJson, sha256Hex } from '../../core/json.js';
import type { GateContext, GateResult } from '../../gate/index.js';
import { API_PERMISSIONS, apiFixture, type ApiFixture } from '../helpers/api.js';
import { auditRows, count, gctx } from '../helpers/gate.js';

/** Refunds over 500 wait for a supervisor; the per-conversation cap is raised so a 900 refund reaches approval. */
const refundCap = { tools: { issue_refund: { limits: { per_conversation: { max_count: 10, max_value: 5000 } } } } };

function waiting(r: GateResult): string {
  if (r.ok || r.error !== 'approval_required' || r.request_id === undefined)
    throw new Error(`expected approval_required, got ${JSON.stringify(r)}`);
  return r.request_id;
}

const refund = (f: ApiFixture, step: string, over: Partial<GateContext> = {}) =>
  f.gate
    .call(gctx({ workflow_step_id: step, ...over }), 'issue_refund', { order_id: 'O-1', amount: 900, currency: 'GBP' })
    .then(waiting);

const deletion = (f: ApiFixture, step: string, tenant = 'tenant-a') =>
  f.gate
    .call(
      gctx({ tenant_id: tenant, principal_id: 'admin-1', role: 'admin', workflow_step_id: step }),
      'delete_customer',
      {
        customer_id: 'C-1',
      },
    )
    .then(waiting);

async function approval(f: ApiFixture, id: string): Promise<{ status: string; approvers: string[]; reason: string }> {
  const { rows } = await f.pool.query<{ status: string; approvers: string[]; reason: string }>(
    'SELECT status, approvers, reason FROM actionledger.gate_approvals WHERE approval_id = $1',
    [id],
  );
  if (rows[0] === undefined) throw new Error(`no approval ${id}`);
  return rows[0];
}

async function setup(t: Test, gate: Record<string, unknown> = refundCap) {
  const f = await apiFixture(t, { gate });
  const sup = await f.token('sup-1', ['supervisor'], { kind: 'person' });
  return { f, sup };
}

t.test(
  'an agent’s refund of 900 waits; a supervisor lists it, reads the envelope, approves it: reserved',
  async (t) => {
    const { f, sup } = await setup(t);
    const id = await refund(f, 'step-1');
    t.equal(await count(f.pool, 'actionledger.operations'), 0, 'nothing reserved while waiting');

    const list = await f.call('GET', '/v1/approvals', { token: sup });
    t.equal(list.status, 200);
    t.match(list.body, {
      ok: true,
      next_cursor: null,
      approvals: [
        {
          approval_id: id,
          status: 'pending',
          tool_name: 'issue_refund',
          requester_id: 'agent-1',
          requester_role: 'agent',
          required_approvals: 1,
          approvers: [],
          past_ttl: false,
        },
      ],
    });
    const shown = await f.call('GET', `/v1/approvals/${id}`, { token: sup });
    t.equal(shown.status, 200);
    const envelope = shown.body.envelope as Record<string, unknown>;
    t.match(envelope, {
      approval_id: id,
      requester: { tenant_id: 'tenant-a', principal_id: 'agent-1', role: 'agent' },
      tool: 'issue_refund',
      arguments: { order_id: 'O-1', amount: 900, currency: 'GBP' },
    });
    const hash = shown.body.envelope_sha256 as string;
    t.equal(hash, sha256Hex(canonicalJson(envelope as never)), 'the hash is the canonical envelope’s sha256');
    t.same(shown.body.blockers, [], 'nothing stands in the supervisor’s way');
    t.equal((list.body.approvals as { envelope_sha256: string }[])[0]?.envelope_sha256, hash, 'the list shows it too');

    const wrong = await f.call('POST', `/v1/approvals/${id}/approve`, {
      token: sup,
      body: { envelope_sha256: 'a'.repeat(64) },
    });
    t.equal(wrong.status, 409);
    t.match(wrong.body, { ok: false, error: 'approval_hash_mismatch', details: { request_id: id } });
    t.match(await approval(f, id), { status: 'pending', approvers: [] }, 'a wrong hash records no vote');
    t.equal(await count(f.pool, 'actionledger.operations'), 0, 'and reserves nothing');

    const ok = await f.call('POST', `/v1/approvals/${id}/approve`, { token: sup, body: { envelope_sha256: hash } });
    t.equal(ok.status, 200);
    t.match(ok.body, { ok: true, status: 'reserved', request_id: id, operation_id: String, created: true });
    const { rows } = await f.pool.query<{ status: string; tenant_id: string; principal_id: string }>(
      'SELECT status, tenant_id, principal_id FROM actionledger.operations WHERE operation_id = $1',
      [ok.body.operation_id],
    );
    t.same(rows, [{ status: 'pending', tenant_id: 'tenant-a', principal_id: 'agent-1' }], 'reserved as the agent’s');
    t.match(await approval(f, id), { status: 'executed', approvers: ['sup-1'] });

    t.same((await f.call('GET', '/v1/approvals', { token: sup })).body.approvals, [], 'no longer pending');
    const executed = await f.call('GET', '/v1/approvals?status=executed', { token: sup });
    t.match(executed.body.approvals, [{ approval_id: id, operation_id: ok.body.operation_id }]);
    const again = await f.call('POST', `/v1/approvals/${id}/approve`, { token: sup, body: { envelope_sha256: hash } });
    t.match(again, { status: 409, body: { error: 'invalid_state_transition' } }, 'an executed approval is final');
    t.equal(await count(f.pool, 'actionledger.operations'), 1);

    const decisions = await auditRows(f.pool, "action IN ('approve', 'execute') AND subject_id = $1", [id]);
    t.same(
      decisions.map((r) => [r.action, r.outcome, r.principal_id, r.tenant_id]),
      [
        ['approve', 'approval_hash_mismatch', 'sup-1', 'tenant-a'],
        ['approve', 'approved', 'sup-1', 'tenant-a'],
        ['execute', 'reserved', 'sup-1', 'tenant-a'],
        ['approve', 'invalid_state_transition', 'sup-1', 'tenant-a'],
      ],
    );
  },
);

t.test('the requester never approves its own request, and nobody votes twice', async (t) => {
  const { f, sup } = await setup(t);
  const id = await refund(f, 'step-1');
  const own = await f.token('agent-1', ['supervisor'], { kind: 'person' });
  const hash = (await f.call('GET', `/v1/approvals/${id}`, { token: sup })).body.envelope_sha256 as string;
  t.match((await f.call('GET', `/v1/approvals/${id}`, { token: own })).body.blockers, [
    { code: 'self_approval_forbidden', message: /you asked for this yourself/, details: { reason: 'requester' } },
  ]);
  const self = await f.call('POST', `/v1/approvals/${id}/approve`, { token: own, body: { envelope_sha256: hash } });
  t.equal(self.status, 403);
  t.match(self.body, { error: 'self_approval_forbidden' });
  t.match(await approval(f, id), { status: 'pending', approvers: [] });

  const del = await deletion(f, 'del-1');
  const delHash = (await f.call('GET', `/v1/approvals/${del}`, { token: sup })).body.envelope_sha256 as string;
  const sup2 = await f.token('sup-2', ['supervisor'], { kind: 'person' });
  const first = await f.call('POST', `/v1/approvals/${del}/approve`, {
    token: sup,
    body: { envelope_sha256: delHash },
  });
  t.match(first, { status: 200, body: { ok: true, status: 'pending_approvals' } }, 'one of two approvers');
  const blockersOf = async (token: string) =>
    (
      (await f.call('GET', `/v1/approvals/${del}`, { token })).body.blockers as { code: string; details: unknown }[]
    ).map((b) => [b.code, b.details]);
  t.same(await blockersOf(sup), [['self_approval_forbidden', { reason: 'already_approved' }]], 'GET says why');
  t.same(await blockersOf(sup2), [], 'the second approver may');
  t.equal(await count(f.pool, 'actionledger.operations'), 0);
  const twice = await f.call('POST', `/v1/approvals/${del}/approve`, {
    token: sup,
    body: { envelope_sha256: delHash },
  });
  t.match(twice, { status: 403, body: { error: 'self_approval_forbidden' } }, 'the same person counts once');
  t.match(await approval(f, del), { status: 'pending', approvers: ['sup-1'] });
  const second = await f.call('POST', `/v1/approvals/${del}/approve`, {
    token: sup2,
    body: { envelope_sha256: delHash },
  });
  t.match(second, { status: 200, body: { ok: true, status: 'reserved', operation_id: String } });
  t.match(await approval(f, del), { status: 'executed', approvers: ['sup-1', 'sup-2'] });
});

t.test('a revoked approver, or a role that decides nothing, is refused on the next request', async (t) => {
  const { f, sup } = await setup(t);
  const id = await refund(f, 'step-1');
  const hash = (await f.call('GET', `/v1/approvals/${id}`, { token: sup })).body.envelope_sha256 as string;
  const auditor = await f.token('aud-1', ['auditor']);
  t.equal((await f.call('GET', '/v1/approvals', { token: auditor })).status, 200, 'read sees approvals');
  t.match((await f.call('GET', `/v1/approvals/${id}`, { token: auditor })).body.blockers, [
    { code: 'permission_denied', details: { roles: ['auditor'], approver_roles: ['supervisor'] } },
  ]);
  const byAuditor = await f.call('POST', `/v1/approvals/${id}/approve`, {
    token: auditor,
    body: { envelope_sha256: hash },
  });
  t.match(byAuditor, { status: 403, body: { error: 'permission_denied' } }, 'reading is not deciding');
  const agent = await f.token('agent-2', ['agent']);
  t.match(await f.call('GET', '/v1/approvals', { token: agent }), {
    status: 403,
    body: { error: 'permission_denied' },
  });
  t.match(await f.call('GET', `/v1/approvals/${id}`, { token: agent }), { status: 403 });
  t.equal((await f.call('GET', '/v1/approvals')).status, 401);
  const misnamed = await f.call('POST', `/v1/approvals/${id}/approve`, {
    token: sup,
    body: { envelope_sha256: hash, role: 'admin' },
  });
  t.match(
    misnamed,
    { status: 403, body: { error: 'permission_denied', details: { role: 'admin' } } },
    'a role not held',
  );

  await f.store.revoke('sup-1', 'tenant-a', 'supervisor', 'security-team');
  t.match(await f.call('GET', '/v1/approvals', { token: sup }), { status: 403, body: { error: 'permission_denied' } });
  const after = await f.call('POST', `/v1/approvals/${id}/approve`, { token: sup, body: { envelope_sha256: hash } });
  t.match(after, { status: 403, body: { error: 'permission_denied' } });
  const reject = await f.call('POST', `/v1/approvals/${id}/reject`, { token: sup, body: { reason: 'no' } });
  t.match(reject, { status: 403, body: { error: 'permission_denied' } });
  t.match(await approval(f, id), { status: 'pending', approvers: [] }, 'nothing recorded by any of them');
  t.equal(await count(f.pool, 'actionledger.operations'), 0);
});

t.test('reject with a reason is final; hostile bodies change nothing', async (t) => {
  const { f, sup } = await setup(t);
  const id = await refund(f, 'step-1');
  const hash = (await f.call('GET', `/v1/approvals/${id}`, { token: sup })).body.envelope_sha256 as string;
  const bodies: [unknown, string][] = [
    [{}, 'body.reason'],
    [{ reason: '' }, 'body.reason'],
    [{ reason: 'x'.repeat(1001) }, 'body.reason'],
    [{ reason: 'x', extra: 1 }, 'body.extra'],
    [{ reason: 5 }, 'body.reason'],
  ];
  for (const [body, field] of bodies) {
    const r = await f.call('POST', `/v1/approvals/${id}/reject`, { token: sup, body });
    t.match(
      r,
      { status: 422, body: { error: 'invalid_request', details: { field } } },
      JSON.stringify(body).slice(0, 40),
    );
  }
  for (const body of [{ envelope_sha256: hash.toUpperCase() }, { envelope_sha256: hash, x: 1 }, {}]) {
    const r = await f.call('POST', `/v1/approvals/${id}/approve`, { token: sup, body });
    t.match(r, { status: 422, body: { error: 'invalid_request' } });
  }
  t.match(await approval(f, id), { status: 'pending', approvers: [] }, 'none of them touched it');

  const rejected = await f.call('POST', `/v1/approvals/${id}/reject`, {
    token: sup,
    body: { reason: 'the order was already refunded by hand' },
  });
  t.match(rejected, { status: 200, body: { ok: true, status: 'rejected', request_id: id } });
  t.match(await approval(f, id), { status: 'rejected', reason: 'the order was already refunded by hand' });
  const twice = await f.call('POST', `/v1/approvals/${id}/reject`, { token: sup, body: { reason: 'again' } });
  t.match(twice, { status: 409, body: { error: 'invalid_state_transition' } });
  const approve = await f.call('POST', `/v1/approvals/${id}/approve`, { token: sup, body: { envelope_sha256: hash } });
  t.match(approve, { status: 409, body: { error: 'invalid_state_transition' } });
  t.match((await f.call('GET', '/v1/approvals?status=rejected', { token: sup })).body, {
    approvals: [{ approval_id: id, reason: 'the order was already refunded by hand' }],
  });
  t.equal(await count(f.pool, 'actionledger.operations'), 0);
});

t.test('another tenant’s approval answers exactly like a random or malformed id', async (t) => {
  const { f, sup } = await setup(t);
  const mine = await deletion(f, 'del-a');
  const theirs = await deletion(f, 'del-b', 'tenant-b');
  const supB = await f.token('sup-b', ['supervisor'], { tenant: 'tenant-b', kind: 'person' });
  const theirHash = (await f.call('GET', `/v1/approvals/${theirs}`, { token: supB })).body.envelope_sha256 as string;
  t.match(theirHash, /^[0-9a-f]{64}$/, 'its own tenant sees it');

  const ids = [theirs, '6f1e2a1c-9d3b-4c55-8a1e-0b7f3c2d1e00', 'not-a-uuid', "x'; DROP TABLE x; --"];
  const answers: Record<string, string[]> = { show: [], approve: [], reject: [] };
  for (const raw of ids) {
    const id = encodeURIComponent(raw);
    const show = await f.call('GET', `/v1/approvals/${id}`, { token: sup });
    const approve = await f.call('POST', `/v1/approvals/${id}/approve`, {
      token: sup,
      body: { envelope_sha256: theirHash },
    });
    const reject = await f.call('POST', `/v1/approvals/${id}/reject`, { token: sup, body: { reason: 'x' } });
    for (const [name, r] of [
      ['show', show],
      ['approve', approve],
      ['reject', reject],
    ] as const) {
      t.equal(r.status, 404, `${name} ${raw}`);
      answers[name]?.push(r.text);
    }
  }
  for (const [name, texts] of Object.entries(answers))
    t.equal(new Set(texts).size, 1, `${name}: one answer for all of them: ${texts[0] ?? ''}`);
  t.match(JSON.parse(answers.show?.[0] ?? '{}'), { ok: false, error: 'not_found' });
  t.match(await approval(f, theirs), { status: 'pending', approvers: [] }, 'theirs is untouched');

  const listA = (await f.call('GET', '/v1/approvals?status=all', { token: sup })).body.approvals as {
    approval_id: string;
  }[];
  t.same(
    listA.map((a) => a.approval_id),
    [mine],
    'the list shows only the tenant’s own',
  );
  const listB = (await f.call('GET', '/v1/approvals', { token: supB })).body.approvals as { approval_id: string }[];
  t.same(
    listB.map((a) => a.approval_id),
    [theirs],
  );
});

t.test('pages list each approval once, in order; a cursor never reaches another tenant', async (t) => {
  const { f, sup } = await setup(t);
  const made: string[] = [];
  for (let i = 0; i < 5; i++) made.push(await deletion(f, `del-${i}`));
  await deletion(f, 'del-b', 'tenant-b');
  const seen: string[] = [];
  let cursor: string | null = null;
  let pages = 0;
  do {
    const r = await f.call('GET', `/v1/approvals?limit=2${cursor === null ? '' : `&cursor=${cursor}`}`, { token: sup });
    t.equal(r.status, 200);
    seen.push(...(r.body.approvals as { approval_id: string }[]).map((a) => a.approval_id));
    cursor = r.body.next_cursor as string | null;
    if (++pages === 1) made.push(await deletion(f, 'del-late')); // arrives while paging: listed once, at the end
  } while (cursor !== null && pages < 10);
  t.same(seen, made, 'every approval once, oldest first, the late one last');
  t.equal(pages, 3);

  const forged = Buffer.from('2000-01-01T00:00:00.000000Z|00000000-0000-0000-0000-000000000000').toString('base64url');
  const fromStart = await f.call('GET', `/v1/approvals?limit=100&cursor=${forged}`, { token: sup });
  t.same(
    (fromStart.body.approvals as { approval_id: string }[]).map((a) => a.approval_id),
    made,
    'a made-up cursor still lists only the tenant’s rows',
  );
  for (const bad of ['garbage', Buffer.from('2000-13-45T00:00:00.000000Z|x').toString('base64url'), "'--"]) {
    const r = await f.call('GET', `/v1/approvals?cursor=${encodeURIComponent(bad)}`, { token: sup });
    t.match(r, { status: 422, body: { error: 'invalid_request', details: { field: 'cursor' } } }, bad);
  }
  for (const q of ['limit=0', 'limit=201', 'status=nope', 'extra=1']) {
    t.match(await f.call('GET', `/v1/approvals?${q}`, { token: sup }), { status: 422 }, q);
  }
  t.match(await f.call('GET', '/v1/approvals?tool=no_such_tool', { token: sup }), {
    status: 422,
    body: { error: 'unknown_tool' },
  });
  const byTool = await f.call('GET', '/v1/approvals?tool=issue_refund', { token: sup });
  t.same(byTool.body.approvals, [], 'filtered by tool');
});

t.test('a caller with approver roles only sees the tools it may decide', async (t) => {
  const f = await apiFixture(t, {
    gate: { tools: { ...refundCap.tools, delete_customer: { approver_roles: ['security'] } } },
    api: { permissions: { ...API_PERMISSIONS, read: ['operator'] } },
  });
  const sup = await f.token('sup-1', ['supervisor'], { kind: 'person' });
  const refundId = await refund(f, 'step-1');
  const deleteId = await deletion(f, 'del-1');
  const list = await f.call('GET', '/v1/approvals', { token: sup });
  t.same(
    (list.body.approvals as { approval_id: string }[]).map((a) => a.approval_id),
    [refundId],
  );
  t.equal((await f.call('GET', `/v1/approvals/${refundId}`, { token: sup })).status, 200);
  const hidden = await f.call('GET', `/v1/approvals/${deleteId}`, { token: sup });
  const random = await f.call('GET', '/v1/approvals/6f1e2a1c-9d3b-4c55-8a1e-0b7f3c2d1e00', { token: sup });
  t.equal(hidden.status, 404);
  t.equal(hidden.text, random.text, 'a tool it may not decide is not there for it');
  const ops = await f.token('ops-1', ['operator']);
  t.equal(((await f.call('GET', '/v1/approvals', { token: ops })).body.approvals as unknown[]).length, 2, 'read: all');
});

t.test('two supervisors approving at once: one reserves, the other is refused, one operation', async (t) => {
  const { f, sup } = await setup(t);
  const sup2 = await f.token('sup-2', ['supervisor'], { kind: 'person' });
  const id = await refund(f, 'step-1');
  const hash = (await f.call('GET', `/v1/approvals/${id}`, { token: sup })).body.envelope_sha256 as string;
  const both = await Promise.all(
    [sup, sup2].map((token) =>
      f.call('POST', `/v1/approvals/${id}/approve`, { token, body: { envelope_sha256: hash } }),
    ),
  );
  t.same(both.map((r) => r.status).sort(), [200, 409]);
  t.match(both.find((r) => r.status === 409)?.body, { error: 'invalid_state_transition' });
  t.equal(await count(f.pool, 'actionledger.operations'), 1);
  t.equal((await approval(f, id)).approvers.length, 1, 'one vote recorded');
});

t.test('the new routes are in the OpenAPI document with their operation ids and error statuses', async (t) => {
  const f = await apiFixture(t);
  const doc = (await f.call('GET', '/v1/openapi.json')).body as {
    paths: Record<string, Record<string, { operationId: string; tags: string[]; responses: Record<string, unknown> }>>;
  };
  const expected: [string, string, string, string[]][] = [
    ['/v1/approvals', 'get', 'listApprovals', ['200']],
    ['/v1/approvals/{id}', 'get', 'getApproval', ['200', '404']],
    ['/v1/approvals/{id}/approve', 'post', 'approveApproval', ['200', '404', '409']],
    ['/v1/approvals/{id}/reject', 'post', 'rejectApproval', ['200', '404', '409']],
    ['/v1/review', 'get', 'listReview', ['200']],
    ['/v1/operations/{id}/review/retry', 'post', 'retryOperation', ['200', '404', '409']],
    ['/v1/operations/{id}/review/resolve-succeeded', 'post', 'resolveOperationSucceeded', ['200', '404', '409']],
    ['/v1/operations/{id}/review/resolve-failed', 'post', 'resolveOperationFailed', ['200', '404', '409']],
    ['/v1/operations/{id}/review/compensate', 'post', 'compensateOperation', ['200', '404', '409']],
    ['/v1/audit', 'get', 'listAudit', ['200']],
  ];
  for (const [path, method, operationId, statuses] of expected) {
    const op = doc.paths[path]?.[method];
    t.equal(op?.operationId, operationId, `${method} ${path}`);
    for (const s of [...statuses, '401', '403']) t.ok(op?.responses[s] !== undefined, `${operationId} documents ${s}`);
  }
});
