/**
 * A task is its principal's over HTTP: a runtime granted act_for_users acts as the user it names, so acting
 * for user 1 it moves user 1's plan (invalidating user 1's approvals and stopping user 1's approved operation
 * at dispatch), while acting for user 3 with the same task id it touches neither. Another principal of the
 * tenant cannot confirm, execute or cancel a proposal: 404 `proposal_not_found`, the body of an unknown id.
 */
import t from 'tap';
import { AuthorizationService } from '../../gate/index.js';
import { apiFixture, type ApiFixture } from '../helpers/api.js';
import { count, GATE_RESOLVERS, reviewer } from '../helpers/gate.js';

const EMAIL = { to: 'customer@example.com', subject: 'Your refund', body: 'It is on its way.' };

/** A user the runtime acts for. */
const user = (principal: string, over: Record<string, string> = {}) => ({
  principal_id: principal,
  role: 'agent',
  account_id: 'acct-1',
  conversation_id: `conv-${principal}`,
  turn_id: 't-1',
  ...over,
});

async function decision(f: ApiFixture, operationId: string): Promise<{ allow: boolean; reason: string }> {
  const service = new AuthorizationService({
    config: f.config,
    pool: f.pool,
    resolvers: GATE_RESOLVERS,
    tls: { cert: '', key: '', ca: '' },
  });
  const { rows } = await f.pool.query<Record<string, string>>(
    `SELECT operation_id, effect_key, principal_id, task_id, workflow_step_id, tool_name, tenant_id, provider_id,
            canonical_args_sha256 AS args_sha256, current_approval_id AS approval_id, current_policy_version AS policy_version
     FROM actionledger.operations WHERE operation_id = $1`,
    [operationId],
  );
  const d = await service.decide(rows[0] as Parameters<AuthorizationService['decide']>[0]);
  return { allow: d.allow, reason: d.reason };
}

async function approvalStatus(f: ApiFixture, id: string): Promise<string | undefined> {
  return (
    await f.pool.query<{ status: string }>('SELECT status FROM actionledger.gate_approvals WHERE approval_id = $1', [
      id,
    ])
  ).rows[0]?.status;
}

t.test('act_for_users: acting for user 1 moves user 1’s plan; acting for user 3 cannot', async (t) => {
  const f = await apiFixture(t, {
    gate: { tools: { issue_refund: { limits: { per_conversation: { max_value: 5000 } } } } },
  });
  const runtime = await f.token('runtime-1', ['agent-runtime']);
  const refund = async (who: string, step: string, plan: string, amount = 600) => {
    const r = await f.call('POST', '/v1/calls', {
      token: runtime,
      body: {
        tool: 'issue_refund',
        arguments: { order_id: 'O-1', amount, currency: 'GBP' },
        task_id: 'refund-42',
        workflow_step_id: step,
        plan_version: plan,
        user: user(who),
      },
    });
    t.equal(r.status, 200, `${who} ${step}`);
    return r.body;
  };
  const first = await refund('user-1', 'big-1', 'p1');
  t.match(first, { ok: false, error: 'approval_required' });
  const view = await f.gate.approvals.show(String(first.request_id), { tenant_id: 'tenant-a' });
  const approved = await f.gate.approve(String(first.request_id), view.envelope_sha256, reviewer('supervisor-1'));
  if (!approved.ok || approved.operation_id === undefined) throw new Error(JSON.stringify(approved));
  const pending = String((await refund('user-1', 'big-2', 'p1')).request_id);
  t.same(await decision(f, approved.operation_id), { allow: true, reason: 'approval' });

  // The same runtime acting for another user, same tenant, same task id, a new plan version.
  t.match(await refund('user-3', 'small', 'p2', 10), { ok: true, status: 'reserved' });
  t.equal(await approvalStatus(f, pending), 'pending', 'user 1’s approval stands');
  t.same(await decision(f, approved.operation_id), { allow: true, reason: 'approval' }, 'and its dispatch');

  // Acting for user 1 again: the service is user 1 here, and moves user 1's plan.
  t.match(await refund('user-1', 'small', 'p2', 10), { ok: true, status: 'reserved' });
  t.equal(await approvalStatus(f, pending), 'invalidated', 'user 1’s own plan change invalidates');
  t.same(await decision(f, approved.operation_id), { allow: false, reason: 'plan_version' }, 'and stops dispatch');
});

t.test('another principal’s proposal is 404 over HTTP, exactly like an unknown one, and stays as it was', async (t) => {
  const f = await apiFixture(t);
  const agentA = await f.token('agent-a', ['agent']);
  const agentB = await f.token('agent-b', ['agent']);
  const runtime = await f.token('runtime-1', ['agent-runtime']);
  const identity = { task_id: 'task-e', workflow_step_id: 'mail-1', turn_id: '1' };
  const proposed = await f.call('POST', '/v1/calls', {
    token: agentA,
    body: { tool: 'send_email', arguments: EMAIL, ...identity },
  });
  t.match(proposed.body, { ok: false, error: 'confirmation_required' });
  const id = String(proposed.body.request_id);
  const token = String(proposed.body.confirm_token);
  const later = { ...identity, turn_id: '2' };
  const status = async () =>
    (await f.pool.query<{ status: string }>('SELECT status FROM actionledger.gate_proposals')).rows[0]?.status;

  const random = await f.call('POST', '/v1/proposals/6f1c2b9e-0d4a-4c52-9a57-3e0f1b2c4d5e/cancel', {
    token: agentB,
    body: later,
  });
  t.equal(random.status, 404);
  const attempts: [string, string, string, Record<string, unknown>][] = [
    [`/v1/proposals/${id}/cancel`, 'cancel by another agent of the tenant', agentB, later],
    [`/v1/proposals/confirm`, 'confirm with the token by another agent', agentB, { ...later, confirm_token: token }],
    [`/v1/proposals/${id}/execute`, 'execute by another agent', agentB, later],
    [
      `/v1/proposals/${id}/cancel`,
      'cancel by a runtime acting for a user',
      runtime,
      { ...later, user: user('user-9') },
    ],
  ];
  for (const [path, what, caller, body] of attempts) {
    const r = await f.call('POST', path, { token: caller, body });
    t.equal(r.status, 404, what);
    t.equal(r.text, random.text, `${what}: the unknown id’s body`);
    t.equal(await status(), 'proposed', `${what}: the proposal is untouched`);
  }
  t.match(
    (await f.call('POST', '/v1/proposals/confirm', { token: agentA, body: { ...later, confirm_token: token } })).body,
    {
      ok: true,
      status: 'confirmed',
    },
  );
  const executeB = await f.call('POST', `/v1/proposals/${id}/execute`, { token: agentB, body: later });
  t.equal(executeB.status, 404, 'execute by another agent');
  t.equal(executeB.text, random.text);
  const cancelB = await f.call('POST', `/v1/proposals/${id}/cancel`, { token: agentB, body: later });
  t.equal(cancelB.status, 404, 'cancel of a confirmed one by another agent');
  t.equal(await status(), 'confirmed');
  t.equal(await count(f.pool, 'actionledger.operations'), 0, 'nothing reserved');
  const cancelA = await f.call('POST', `/v1/proposals/${id}/cancel`, { token: agentA, body: later });
  t.match(
    cancelA,
    { status: 200, body: { ok: true, status: 'cancelled', request_id: id } },
    'its own principal cancels',
  );
});
