/**
 * Attacks on the HTTP API over real HTTP and a real PostgreSQL: what another tenant's caller can learn, hostile
 * query strings and paths, spellings of a name that hide it, and what a caller without any tool role can do
 * to a proposal. Each test names the promise it checks.
 */
import t, { type Test } from 'tap';
import { AuthorizationService } from '../../gate/index.js';
import { authorizationRequest } from '../../protocol/index.js';
import { apiFixture, type ApiFixture } from '../helpers/api.js';
import { count, documentVersion, gctx } from '../helpers/gate.js';

const EMAIL = { to: 'customer@example.com', subject: 'Your refund', body: 'It is on its way.' };
const b64 = (s: string) => Buffer.from(s, 'utf8').toString('base64url');
const ZERO_ID = '00000000-0000-0000-0000-000000000000';
const refundCap = { tools: { issue_refund: { limits: { per_conversation: { max_count: 10, max_value: 5000 } } } } };

/** No answer names another tenant, a stack, SQL text or a server message. */
function clean(t: Test, r: { status: number; text: string }, label: string): void {
  t.not(r.status, 500, `${label}: not a 500`);
  t.notMatch(r.text, /tenant-b|stack|SELECT|at async|sqlstate/i, `${label}: nothing leaks`);
}

t.test('a kill switch refused for a tenant without routes does not name the other tenants', async (t) => {
  const f = await apiFixture(t);
  const c = await f.token('op-c', ['operator'], { tenant: 'tenant-c' });
  const engaged = await f.call('PUT', '/v1/kill-switches/issue_refund', { token: c, body: { reason: 'stop' } });
  t.equal(engaged.status, 422);
  clean(t, engaged, 'engage in tenant-c');
  t.notMatch(engaged.text, /tenant-a/, 'the configured tenants are not listed');
  const star = await f.call('PUT', '/v1/kill-switches/*', { token: c, body: { reason: 'stop' } });
  t.notMatch(star.text, /tenant-a|tenant-b/);
});

t.test('NUL in a query string filter is a 422, never a 500', async (t) => {
  const f = await apiFixture(t);
  const op = await f.token('op-1', ['operator']);
  for (const path of [
    '/v1/review?reason=%00',
    '/v1/audit?action=%00',
    '/v1/audit?outcome=a%00b',
    '/v1/audit?subject_id=%00',
    '/v1/audit?principal_id=%00',
    '/v1/audit?tool=%00',
    '/v1/operations?task_id=%00',
    '/v1/approvals?tool=%00',
  ]) {
    const r = await f.call('GET', path, { token: op });
    clean(t, r, path);
    t.equal(r.status, 422, path);
  }
});

t.test('an approval cursor naming an impossible time is a 422, never a 500', async (t) => {
  const f = await apiFixture(t);
  const op = await f.token('op-1', ['operator']);
  for (const time of ['0000-01-01T00:00:00.000000Z', '2026-02-30T00:00:00.000000Z', '2026-02-03T24:00:00.000000Z']) {
    const r = await f.call('GET', `/v1/approvals?cursor=${b64(`${time}|${ZERO_ID}`)}`, { token: op });
    clean(t, r, time);
    t.match(r, { status: 422, body: { ok: false, error: 'invalid_request', details: { field: 'cursor' } } }, time);
  }
});

t.test('a path that is not valid UTF-8 gets the structured error body and a request id', async (t) => {
  const f = await apiFixture(t);
  const op = await f.token('op-1', ['operator']);
  for (const path of ['/v1/operations/%ED%A0%80', '/v1/operations/%']) {
    const r = await f.call('GET', path, { token: op });
    t.equal(r.status, 400, path);
    t.match(r.body, { ok: false, error: 'invalid_request' }, path);
    t.notOk('code' in r.body || 'statusCode' in r.body, `${path}: no framework fields`);
    t.ok(r.headers.get('x-request-id'), `${path}: a request id`);
  }
});

async function emailProposal(f: ApiFixture, token: string) {
  const identity = { task_id: 'task-e', workflow_step_id: 'mail-1', conversation_id: 'conv-e' };
  const p = await f.call('POST', '/v1/calls', {
    token,
    body: { tool: 'send_email', arguments: EMAIL, ...identity, turn_id: '1' },
  });
  return { id: String(p.body.request_id), confirm: String(p.body.confirm_token), identity };
}

t.test('a read-only auditor cannot cancel or execute an agent’s proposal it found in the audit log', async (t) => {
  const f = await apiFixture(t);
  const agent = await f.token('agent-1', ['agent']);
  const auditor = await f.token('aud-1', ['auditor']);
  const { id, confirm, identity } = await emailProposal(f, agent);
  const log = await f.call('GET', '/v1/audit?action=call', { token: auditor });
  t.ok(log.text.includes(id), 'the auditor can read the proposal id');
  const cancel = await f.call('POST', `/v1/proposals/${id}/cancel`, { token: auditor, body: identity });
  t.not(cancel.body.ok, true, 'the auditor does not cancel it');
  const still = await f.pool.query<{ status: string }>('SELECT status FROM actionledger.gate_proposals');
  t.same(still.rows, [{ status: 'proposed' }], 'the proposal is left as it was');
  const confirmed = await f.call('POST', '/v1/proposals/confirm', {
    token: agent,
    body: { ...identity, confirm_token: confirm, turn_id: '2' },
  });
  t.equal(confirmed.body.ok, true);
  const exec = await f.call('POST', `/v1/proposals/${id}/execute`, { token: auditor, body: identity });
  t.not(exec.body.ok, true, 'the auditor does not execute it');
  t.equal(await count(f.pool, 'actionledger.operations'), 0, 'nothing reserved by the auditor');
});

t.test('a requester spelled with a no-break space is not another person: no self-approval', async (t) => {
  const f = await apiFixture(t, { gate: refundCap });
  const runtime = await f.token('runtime', ['agent-runtime']);
  const sup = await f.token('sup-1', ['supervisor'], { kind: 'person' });
  for (const spelling of ['sup-1\u00a0', 'sup-1 ', ' sup-1', 'sup-1\u3000']) {
    const r = await f.call('POST', '/v1/calls', {
      token: runtime,
      body: {
        tool: 'issue_refund',
        arguments: { order_id: 'O-1', amount: 900, currency: 'GBP' },
        task_id: 'task-r',
        workflow_step_id: `r-${spelling.length}-${spelling.codePointAt(0) ?? 0}`,
        user: { principal_id: spelling, role: 'agent', account_id: 'acct-1', conversation_id: 'c', turn_id: '1' },
      },
    });
    t.match(
      r,
      { status: 422, body: { error: 'invalid_context', details: { field: 'user.principal_id' } } },
      JSON.stringify(spelling),
    );
  }
  const pending = await f.call('GET', '/v1/approvals', { token: sup });
  t.same(pending.body.approvals, [], 'nothing waits for sup-1 to approve itself');
});

t.test('a role revoked through the gate (revoke-role) grants no API capability on the next request', async (t) => {
  const f = await apiFixture(t);
  const ops = await f.token('ops-1', ['operator']);
  const runtime = await f.token('runtime', ['agent-runtime']);
  t.equal((await f.call('GET', '/v1/kill-switches', { token: ops })).status, 200);
  await f.gate.revokeRole('tenant-a', 'ops-1', 'operator', 'security-team');
  await f.gate.revokeRole('tenant-a', 'runtime', 'agent-runtime', 'security-team');
  const engaged = await f.call('PUT', '/v1/kill-switches/issue_refund', { token: ops, body: { reason: 'x' } });
  t.equal(engaged.status, 403, 'the revoked operator engages nothing');
  t.equal((await f.call('GET', '/v1/audit', { token: ops })).status, 403, 'nor reads the audit log');
  const status = await f.call('GET', '/v1/status', { token: ops });
  t.same(status.body.roles, [], 'the status shows no role');
  const acted = await f.call('POST', '/v1/calls', {
    token: runtime,
    body: {
      tool: 'transfer_funds',
      arguments: { to_account: 'ACC0000000002', amount: 25 },
      task_id: 'task-1',
      workflow_step_id: 's-1',
      user: { principal_id: 'user-1', role: 'agent', account_id: 'acct-1', conversation_id: 'c', turn_id: '1' },
    },
  });
  t.equal(acted.status, 403, 'the revoked runtime acts for no user');
  t.equal(await count(f.pool, 'actionledger.operations'), 0, 'nothing reserved');
  await f.gate.restoreRole('tenant-a', 'ops-1', 'operator', 'security-team');
  t.equal((await f.call('GET', '/v1/kill-switches', { token: ops })).status, 200, 'restored: allowed again');
});

t.test('the request limit is the principal’s: a second token or a certificate shares it', async (t) => {
  const f = await apiFixture(t, { api: { rate_limit: { requests: 3, window_s: 60 } } });
  const first = await f.token('svc-1', ['service']);
  const second = await f.token('svc-1', ['service']);
  const statuses: number[] = [];
  for (const token of [first, second, first, second, second]) {
    statuses.push((await f.call('GET', '/v1/status', { token })).status);
  }
  t.same(statuses, [200, 200, 200, 429, 429]);
  const limited = await f.call('POST', '/v1/operations', { token: second, body: { nonsense: true } });
  t.equal(limited.status, 429);
  const rows = await f.pool.query<{ outcome: string; principal_id: string; trace_id: string }>(
    "SELECT outcome, principal_id, trace_id FROM actionledger.gate_audit WHERE action = 'api'",
  );
  t.same(
    rows.rows,
    [{ outcome: '429', principal_id: 'svc-1', trace_id: limited.headers.get('x-request-id') }],
    'the refused state-changing request is audited with its principal and request id',
  );
});

t.test('approved over the API, then the approver’s role revoked through the API store: no dispatch', async (t) => {
  const f = await apiFixture(t, { gate: refundCap });
  await f.token('agent-1', ['agent']);
  const sup = await f.token('sup-1', ['supervisor'], { kind: 'person' });
  const waiting = await f.gate.call(gctx({ workflow_step_id: 'r-1' }), 'issue_refund', {
    order_id: 'O-1',
    amount: 900,
    currency: 'GBP',
  });
  const id = waiting.ok ? '' : String(waiting.request_id);
  const shown = await f.call('GET', `/v1/approvals/${id}`, { token: sup });
  const approved = await f.call('POST', `/v1/approvals/${id}/approve`, {
    token: sup,
    body: { envelope_sha256: shown.body.envelope_sha256 },
  });
  t.match(approved.body, { ok: true, status: 'reserved' });
  const again = await f.call('POST', `/v1/approvals/${id}/approve`, {
    token: sup,
    body: { envelope_sha256: shown.body.envelope_sha256 },
  });
  t.not(again.body.ok, true, 'a second approval reserves nothing more');
  t.equal(await count(f.pool, 'actionledger.operations'), 1, 'one operation');
  const service = new AuthorizationService({
    config: f.config,
    pool: f.pool,
    resolvers: { document: documentVersion },
    tls: { cert: 'unused', key: 'unused', ca: 'unused' },
  });
  const { rows } = await f.pool.query<Parameters<typeof authorizationRequest>[0]>(
    'SELECT * FROM actionledger.operations',
  );
  const request = authorizationRequest(rows[0] as Parameters<typeof authorizationRequest>[0]);
  t.match(await service.decide(request), { allow: true, reason: 'approval' }, 'allowed while the approver holds');
  await f.store.revoke('sup-1', 'tenant-a', 'supervisor', 'security-team');
  t.match(await service.decide(request), { allow: false, reason: 'approver_role_not_held' }, 'refused at dispatch');
  await f.store.grant('sup-1', 'tenant-a', 'supervisor', 'test');
  await f.store.revoke('agent-1', 'tenant-a', 'agent', 'security-team');
  t.match(await service.decide(request), { allow: false, reason: 'role_not_held' }, 'the requester revoked: refused');
});
