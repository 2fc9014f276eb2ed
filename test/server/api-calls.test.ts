/**
 * The gate over HTTP: `POST /v1/calls` and the proposal routes on a real listener and a real PostgreSQL. The
 * gate's answer comes back as it is, status 200, refusals and holds included (the model reads them); only the
 * caller's own mistakes are HTTP errors. The trusted context is the token's: tenant always, principal unless a
 * caller granted act_for_users names the user. Another tenant's proposal is 404 with exactly the body an
 * unknown one gets.
 */
import t from 'tap';
import { apiFixture, type ApiFixture } from '../helpers/api.js';
import { auditRows, count } from '../helpers/gate.js';

const TRANSFER = { to_account: 'ACC0000000002', amount: 25 };
const EMAIL = { to: 'customer@example.com', subject: 'Your refund', body: 'It is on its way.' };

const call = (f: ApiFixture, token: string | undefined, body: Record<string, unknown>) =>
  f.call('POST', '/v1/calls', { token, body });

/** A user the agent runtime acts for, in a turn. */
const user = (turn = 't-1', over: Record<string, string> = {}) => ({
  principal_id: 'user-1',
  role: 'agent',
  account_id: 'acct-1',
  conversation_id: 'conv-1',
  turn_id: turn,
  ...over,
});

t.test('a call is reserved in the token’s tenant as the caller, audited with the request id', async (t) => {
  const f = await apiFixture(t);
  const agent = await f.token('agent-1', ['agent']);
  const r = await call(f, agent, {
    tool: 'transfer_funds',
    arguments: TRANSFER,
    task_id: 'task-1',
    workflow_step_id: 's-1',
  });
  t.equal(r.status, 200);
  t.match(r.body, {
    ok: true,
    status: 'reserved',
    operation_id: String,
    effect_key: /^v1\.k1\./,
    created: true,
    operation_status: 'pending',
  });
  const op = await f.pool.query(
    'SELECT tenant_id, principal_id, task_id, workflow_step_id FROM actionledger.operations',
  );
  t.same(op.rows, [{ tenant_id: 'tenant-a', principal_id: 'agent-1', task_id: 'task-1', workflow_step_id: 's-1' }]);
  const audit = await auditRows(f.pool, "action = 'call'");
  t.match(audit, [
    {
      outcome: 'allowed',
      tenant_id: 'tenant-a',
      principal_id: 'agent-1',
      role: 'agent',
      account_id: 'agent-1',
      conversation_id: 'task-1',
      trace_id: r.headers.get('x-request-id'),
      subject_id: r.body.operation_id,
    },
  ]);

  const again = await call(f, agent, {
    tool: 'transfer_funds',
    arguments: TRANSFER,
    task_id: 'task-1',
    workflow_step_id: 's-1',
  });
  t.match(again.body, { ok: true, status: 'reserved', operation_id: r.body.operation_id, created: false });
});

t.test('credentials, roles and the act_for_users capability', async (t) => {
  const f = await apiFixture(t);
  const body = { tool: 'transfer_funds', arguments: TRANSFER, task_id: 'task-1', workflow_step_id: 's-1' };
  const none = await call(f, undefined, body);
  t.equal(none.status, 401);
  t.match(none.body, { ok: false, error: 'unauthenticated' });

  const agent = await f.token('agent-1', ['agent']);
  const notHeld = await call(f, agent, { ...body, role: 'admin' });
  t.equal(notHeld.status, 403, 'a role the caller does not hold here is the caller’s mistake');
  t.match(notHeld.body, { ok: false, error: 'permission_denied', details: { role: 'admin' } });

  const service = await f.token('svc-1', ['service']);
  const denied = await call(f, service, body);
  t.equal(denied.status, 200, 'a role the tool does not list is the gate’s own refusal');
  t.match(denied.body, { ok: false, error: 'permission_denied', message: /may not call transfer_funds/ });

  const forUser = await call(f, agent, { ...body, user: user() });
  t.equal(forUser.status, 403, '`user` needs act_for_users');
  t.match(forUser.body, { ok: false, error: 'permission_denied', details: { capability: 'act_for_users' } });

  const both = await f.token('multi-1', ['agent', 'admin']);
  const unnamed = await call(f, both, body);
  t.equal(unnamed.status, 422, 'several roles held and none named');
  t.match(unnamed.body, { error: 'invalid_request', details: { field: 'role' } });
  t.match((await call(f, both, { ...body, role: 'admin', workflow_step_id: 's-admin' })).body, {
    ok: true,
    status: 'reserved',
  });

  const tenantInBody = await call(f, agent, { ...body, tenant_id: 'tenant-b' });
  t.equal(tenantInBody.status, 422, 'the tenant is never the body’s');
  t.match(tenantInBody.body, { error: 'invalid_request', details: { field: 'body.tenant_id' } });
  const missingStep = await call(f, agent, { tool: 'transfer_funds', arguments: TRANSFER, task_id: 'task-1' });
  t.match(missingStep, { status: 422, body: { details: { field: 'body.workflow_step_id' } } });
  const zeroWidth = await call(f, agent, { ...body, workflow_step_id: 's\u200b1' });
  t.match(zeroWidth, { status: 422, body: { error: 'invalid_context' } });
  t.equal(await count(f.pool, "actionledger.operations WHERE principal_id = 'agent-1'"), 0, 'none of these reserved');
});

t.test('a runtime with act_for_users acts for the user, in its own token’s tenant', async (t) => {
  const f = await apiFixture(t);
  const runtimeB = await f.token('runtime-1', ['agent-runtime'], { tenant: 'tenant-b' });
  const r = await call(f, runtimeB, {
    tool: 'transfer_funds',
    arguments: TRANSFER,
    task_id: 'task-1',
    workflow_step_id: 's-1',
    user: user(),
  });
  t.match(r, { status: 200, body: { ok: true, status: 'reserved', created: true } });
  const op = await f.pool.query('SELECT tenant_id, principal_id FROM actionledger.operations');
  t.same(op.rows, [{ tenant_id: 'tenant-b', principal_id: 'user-1' }], 'the user’s operation in the token’s tenant');
  t.match(await auditRows(f.pool, "action = 'call'"), [
    { tenant_id: 'tenant-b', principal_id: 'user-1', role: 'agent', account_id: 'acct-1', turn_id: 't-1' },
  ]);
});

t.test('refusals are 200 with ok false: the model reads them', async (t) => {
  const f = await apiFixture(t);
  const agent = await f.token('agent-1', ['agent']);
  const base = { task_id: 'task-1', workflow_step_id: 's-1' };
  const cases: [Record<string, unknown>, string][] = [
    [{ tool: 'no_such_tool', arguments: {} }, 'unknown_tool'],
    [{ tool: 'transfer_funds', arguments: { to_account: 'nope', amount: 1 } }, 'invalid_arguments'],
    [{ tool: 'transfer_funds', arguments: [1, 2] }, 'invalid_arguments'],
    [{ tool: 'transfer_funds', arguments: { ...TRANSFER, tenant_id: 'tenant-b' } }, 'invalid_arguments'],
    [{ tool: 'transfer_funds', arguments: { ...TRANSFER, amount: 2000000 } }, 'invalid_arguments'],
    [{ tool: 'transfer_funds', arguments: { ...TRANSFER, amount: 200000 } }, 'limit_exceeded'],
  ];
  for (const [body, error] of cases) {
    const r = await call(f, agent, { ...base, ...body });
    t.equal(r.status, 200, error);
    t.match(r.body, { ok: false, error, message: String }, error);
  }
  await f.call('PUT', '/v1/kill-switches/transfer_funds', {
    token: await f.token('ops-1', ['operator']),
    body: { reason: 'incident 9' },
  });
  const killed = await call(f, agent, { ...base, tool: 'transfer_funds', arguments: TRANSFER });
  t.match(killed, { status: 200, body: { ok: false, error: 'tool_disabled', message: /incident 9/ } });
  t.equal(await count(f.pool, 'actionledger.operations'), 0);
});

t.test('issue_refund over 500 needs an approval: 200 approval_required with the approval id', async (t) => {
  const f = await apiFixture(t, {
    gate: { tools: { issue_refund: { limits: { per_conversation: { max_value: 5000 } } } } },
  });
  const runtime = await f.token('runtime-1', ['agent-runtime']);
  const refund = (amount: number, step: string) =>
    call(f, runtime, {
      tool: 'issue_refund',
      arguments: { order_id: 'O-1', amount, currency: 'GBP' },
      task_id: 'task-r',
      workflow_step_id: step,
      user: user(),
    });
  const big = await refund(600, 'big');
  t.equal(big.status, 200);
  t.match(big.body, { ok: false, error: 'approval_required', request_id: String, expires_at: String });
  t.equal(await count(f.pool, 'actionledger.gate_approvals WHERE approval_id = $1', [big.body.request_id]), 1);
  const small = await refund(400, 'small');
  t.match(small.body, { ok: true, status: 'reserved' }, 'at the threshold or under, reserved');
  const notOwned = await call(f, runtime, {
    tool: 'issue_refund',
    arguments: { order_id: 'O-900', amount: 10, currency: 'GBP' },
    task_id: 'task-r',
    workflow_step_id: 'other',
    user: user(),
  });
  t.match(notOwned, { status: 200, body: { ok: false, error: 'not_found' } }, 'the business check’s refusal');
  t.equal(await count(f.pool, 'actionledger.operations'), 1);
});

t.test('send_email: confirmation_required, confirmed in a later turn, executed, reserved', async (t) => {
  const f = await apiFixture(t);
  const agent = await f.token('agent-1', ['agent']);
  const identity = { task_id: 'task-e', workflow_step_id: 'mail-1', conversation_id: 'conv-e' };
  const proposed = await call(f, agent, { tool: 'send_email', arguments: EMAIL, ...identity, turn_id: '1' });
  t.equal(proposed.status, 200);
  t.match(proposed.body, {
    ok: false,
    error: 'confirmation_required',
    request_id: String,
    confirm_token: String,
    expires_at: String,
  });
  const id = String(proposed.body.request_id);
  const token = String(proposed.body.confirm_token);
  t.equal(await count(f.pool, 'actionledger.operations'), 0, 'nothing reserved yet');

  const confirm = (body: Record<string, unknown>) =>
    f.call('POST', '/v1/proposals/confirm', { token: agent, body: { ...identity, confirm_token: token, ...body } });
  const noTurn = await confirm({});
  t.match(noTurn, { status: 422, body: { error: 'invalid_request', details: { field: 'body.turn_id' } } });
  const sameTurn = await confirm({ turn_id: '1' });
  t.match(sameTurn, { status: 200, body: { ok: false, error: 'proposal_same_turn_confirm', request_id: id } });
  const early = await f.call('POST', `/v1/proposals/${id}/execute`, {
    token: agent,
    body: { ...identity, turn_id: '2' },
  });
  t.match(early, { status: 200, body: { ok: false, error: 'invalid_state_transition' } }, 'not confirmed yet');

  const confirmed = await confirm({ turn_id: '2' });
  t.match(confirmed, { status: 200, body: { ok: true, status: 'confirmed', request_id: id } });
  const replayed = await confirm({ turn_id: '3' });
  t.match(replayed, { status: 200, body: { ok: false, error: 'invalid_state_transition' } }, 'a token counts once');

  const wrongArgs = await f.call('POST', `/v1/proposals/${id}/execute`, {
    token: agent,
    body: { ...identity, turn_id: '2', arguments: { ...EMAIL, to: 'someone@else.example' } },
  });
  t.match(wrongArgs, { status: 200, body: { ok: false, error: 'params_mismatch' } });
  const executed = await f.call('POST', `/v1/proposals/${id}/execute`, {
    token: agent,
    body: { ...identity, turn_id: '2', arguments: EMAIL },
  });
  t.match(executed, {
    status: 200,
    body: { ok: true, status: 'reserved', operation_id: String, created: true, request_id: id },
  });
  const again = await f.call('POST', `/v1/proposals/${id}/execute`, {
    token: agent,
    body: { ...identity, turn_id: '3' },
  });
  t.match(again.body, { ok: true, status: 'reserved', operation_id: executed.body.operation_id, created: false });
  const op = await f.pool.query(
    'SELECT tenant_id, principal_id, tool_name, current_approval_id FROM actionledger.operations',
  );
  t.same(op.rows, [
    { tenant_id: 'tenant-a', principal_id: 'agent-1', tool_name: 'send_email', current_approval_id: `proposal:${id}` },
  ]);

  const cancelled = await f.call('POST', `/v1/proposals/${id}/cancel`, { token: agent, body: identity });
  t.match(cancelled, { status: 200, body: { ok: false, error: 'invalid_state_transition' } }, 'executed is final');
  const second = await call(f, agent, {
    tool: 'send_email',
    arguments: EMAIL,
    ...identity,
    workflow_step_id: 'mail-2',
  });
  const secondId = String(second.body.request_id);
  const cancel = await f.call('POST', `/v1/proposals/${secondId}/cancel`, { token: agent, body: identity });
  t.match(cancel, { status: 200, body: { ok: true, status: 'cancelled', request_id: secondId } });
  t.same(
    (await auditRows(f.pool, "action IN ('confirm', 'execute', 'cancel')")).map(
      (a) => `${String(a.action)}:${String(a.outcome)}`,
    ),
    [
      'confirm:proposal_same_turn_confirm',
      'execute:invalid_state_transition',
      'confirm:confirmed',
      'confirm:invalid_state_transition',
      'execute:params_mismatch',
      'execute:reserved',
      'execute:reserved',
      'cancel:invalid_state_transition',
      'cancel:cancelled',
    ],
    'every proposal action audited',
  );
});

t.test('another tenant’s proposal is 404, exactly like an unknown one', async (t) => {
  const f = await apiFixture(t);
  const agentA = await f.token('agent-a', ['agent']);
  const agentB = await f.token('agent-b', ['agent'], { tenant: 'tenant-b' });
  const identity = { task_id: 'task-e', workflow_step_id: 'mail-1', turn_id: '1' };
  const proposed = await call(f, agentA, { tool: 'send_email', arguments: EMAIL, ...identity });
  const id = String(proposed.body.request_id);
  const token = String(proposed.body.confirm_token);
  const later = { ...identity, turn_id: '2' };

  const bodies: string[] = [];
  for (const [path, who] of [
    [`/v1/proposals/${id}/execute`, 'another tenant’s id'],
    ['/v1/proposals/6f1c2b9e-0d4a-4c52-9a57-3e0f1b2c4d5e/execute', 'a random id'],
    ['/v1/proposals/not-a-uuid/execute', 'not an id'],
    [`/v1/proposals/${id}/cancel`, 'cancel, another tenant’s id'],
    ['/v1/proposals/6f1c2b9e-0d4a-4c52-9a57-3e0f1b2c4d5e/cancel', 'cancel, a random id'],
  ] as const) {
    const r = await f.call('POST', path, { token: agentB, body: later });
    t.equal(r.status, 404, who);
    bodies.push(r.text);
  }
  for (const [tok, who] of [
    [token, 'another tenant’s token'],
    ['A'.repeat(43), 'a random token'],
  ] as const) {
    const r = await f.call('POST', '/v1/proposals/confirm', { token: agentB, body: { ...later, confirm_token: tok } });
    t.equal(r.status, 404, who);
    bodies.push(r.text);
  }
  t.same(new Set(bodies).size, 1, 'one body for all of them');
  t.same(JSON.parse(bodies[0] ?? ''), { ok: false, error: 'proposal_not_found', message: 'no such proposal' });

  const stillThere = await f.call('POST', '/v1/proposals/confirm', {
    token: agentA,
    body: { ...later, confirm_token: token },
  });
  t.match(stillThere.body, { ok: true, status: 'confirmed' }, 'untouched by the other tenant’s tries');
  t.equal((await f.call('POST', `/v1/proposals/${id}/execute`, { body: later })).status, 401);
});

t.test('16 identical calls at once for one step: exactly one operation', async (t) => {
  const f = await apiFixture(t);
  const agent = await f.token('agent-1', ['agent']);
  const body = { tool: 'transfer_funds', arguments: TRANSFER, task_id: 'task-c', workflow_step_id: 'race' };
  const results = await Promise.all(Array.from({ length: 16 }, () => call(f, agent, body)));
  t.same(
    results.map((r) => r.status),
    Array(16).fill(200),
  );
  t.ok(
    results.every((r) => r.body.ok === true && r.body.status === 'reserved'),
    results.map((r) => r.text).join('\n'),
  );
  t.equal(new Set(results.map((r) => r.body.operation_id)).size, 1, 'one operation id for all');
  t.equal(results.filter((r) => r.body.created === true).length, 1, 'created once');
  t.equal(await count(f.pool, 'actionledger.operations'), 1, 'one row');
  t.equal(await count(f.pool, 'actionledger.outbox'), 1, 'one dispatch');
  const caps = await f.pool.query<{ used_value: string; used_count: number }>(
    "SELECT used_value::text, used_count FROM actionledger.gate_counters WHERE scope = 'principal_day'",
  );
  t.same(caps.rows, [{ used_value: '25', used_count: 1 }], 'the cap counts the effect once');
});

t.test('the OpenAPI document lists the call and proposal routes', async (t) => {
  const f = await apiFixture(t);
  const doc = (await f.call('GET', '/v1/openapi.json')).body as {
    paths: Record<string, Record<string, { operationId: string; responses: Record<string, unknown> }>>;
  };
  t.equal(doc.paths['/v1/calls']?.post?.operationId, 'callTool');
  t.equal(doc.paths['/v1/proposals/confirm']?.post?.operationId, 'confirmProposal');
  t.equal(doc.paths['/v1/proposals/{id}/execute']?.post?.operationId, 'executeProposal');
  t.equal(doc.paths['/v1/proposals/{id}/cancel']?.post?.operationId, 'cancelProposal');
  t.ok(doc.paths['/v1/proposals/{id}/execute']?.post?.responses['404'], '404 documented');
});

t.test('gate calls are counted by tool and outcome; an unknown tool name is one label', async (t) => {
  const f = await apiFixture(t);
  const agent = await f.token('agent-1', ['agent']);
  const body = (step: string, tool: string, args: unknown) => ({
    tool,
    arguments: args,
    task_id: 'task-m',
    workflow_step_id: step,
  });
  t.match((await call(f, agent, body('s-1', 'transfer_funds', TRANSFER))).body, { ok: true });
  t.match((await call(f, agent, body('s-2', 'transfer_funds', { to_account: 'x' }))).body, {
    error: 'invalid_arguments',
  });
  t.match((await call(f, agent, body('s-3', 'no_such_tool_7c1e', {}))).body, { error: 'unknown_tool' });
  const metrics = (await f.call('GET', '/metrics')).text;
  t.match(metrics, /actionledger_gate_calls_total\{tool="transfer_funds",outcome="allowed"\} 1/);
  t.match(metrics, /actionledger_gate_calls_total\{tool="transfer_funds",outcome="invalid_arguments"\} 1/);
  t.match(metrics, /actionledger_gate_calls_total\{tool="unknown",outcome="unknown_tool"\} 1/);
  t.notMatch(metrics, /no_such_tool_7c1e/, 'a name from the body never becomes a label');
});

t.test('a token whose principal lost every role may do nothing: 403, nothing reserved', async (t) => {
  const f = await apiFixture(t);
  const agent = await f.token('agent-1', ['agent']);
  await f.store.revoke('agent-1', 'tenant-a', 'agent', 'security-team');
  const r = await call(f, agent, {
    tool: 'transfer_funds',
    arguments: TRANSFER,
    task_id: 'task-r',
    workflow_step_id: 's-1',
  });
  t.equal(r.status, 403);
  t.match(r.body, { ok: false, error: 'permission_denied' });
  t.equal(await count(f.pool, 'actionledger.operations'), 0);
});
