/**
 * Revocation reaches approvals: each approver's vote records the role it was cast with, a revocation withdraws
 * the revoked approver's votes from approvals still pending (through the gate and through the principal
 * store, one shared statement), and the built-in authorization service denies an approval-backed operation
 * whose approver no longer holds that role. Real PostgreSQL, real mTLS, the sandbox provider.
 */
import t from 'tap';
import type { Pool } from '../../db/db.js';
import { PrincipalStore } from '../../principals/index.js';
import { approvedDeletion, gateDispatchEnv } from '../helpers/gate-dispatch.js';
import { auditRows, gateFixture, gctx, reviewer, type GateFixture } from '../helpers/gate.js';

async function votes(pool: Pool, approvalId: string): Promise<{ approvers: string[]; approver_roles: string[] }> {
  const { rows } = await pool.query<{ approvers: string[]; approver_roles: string[] }>(
    'SELECT approvers, approver_roles FROM actionledger.gate_approvals WHERE approval_id = $1',
    [approvalId],
  );
  return rows[0]!;
}

/** A pending `delete_customer` approval (two approvers needed) in `tenant`, with its envelope hash. */
async function pendingDeletion(g: GateFixture, tenant = 'tenant-a'): Promise<{ id: string; hash: string }> {
  const held = await g.gate.call(
    gctx({ tenant_id: tenant, principal_id: 'admin-1', role: 'admin', workflow_step_id: `del-${tenant}` }),
    'delete_customer',
    { customer_id: 'C-1' },
  );
  if (held.ok || held.request_id === undefined) throw new Error(JSON.stringify(held));
  const view = await g.gate.approvals.show(held.request_id, { tenant_id: tenant });
  return { id: held.request_id, hash: view.envelope_sha256 };
}

t.test('each vote records the role it was cast with, in the order of the approvers', async (t) => {
  const g = await gateFixture(t, {
    gate: { tools: { delete_customer: { approver_roles: ['supervisor', 'compliance'] } } },
  });
  const a = await pendingDeletion(g);
  await g.gate.approve(a.id, a.hash, reviewer('supervisor-1'));
  t.same(await votes(g.pool, a.id), { approvers: ['supervisor-1'], approver_roles: ['supervisor'] });
  const r = await g.gate.approve(a.id, a.hash, reviewer('officer-1', { role: 'compliance' }));
  t.match(r, { ok: true, status: 'reserved' });
  t.same(await votes(g.pool, a.id), {
    approvers: ['supervisor-1', 'officer-1'],
    approver_roles: ['supervisor', 'compliance'],
  });
});

t.test("a revoked approver's pending vote stops counting: a third approver is needed", async (t) => {
  const g = await gateFixture(t);
  const a = await pendingDeletion(g);
  const b = await pendingDeletion(g, 'tenant-b');
  t.match(await g.gate.approve(a.id, a.hash, reviewer('supervisor-1')), { ok: true, status: 'pending_approvals' });
  await g.gate.approve(b.id, b.hash, reviewer('supervisor-1', { tenant_id: 'tenant-b' }));
  const revoked = await g.gate.revokeRole('tenant-a', 'supervisor-1', 'supervisor', 'security');
  t.same(revoked, { votes_withdrawn: [a.id] }, 'the pending approval of that tenant lost the vote');
  t.same(await votes(g.pool, a.id), { approvers: [], approver_roles: [] });
  t.same(await votes(g.pool, b.id), { approvers: ['supervisor-1'], approver_roles: ['supervisor'] }, 'not tenant-b');
  t.match(
    await g.gate.approve(a.id, a.hash, reviewer('supervisor-1')),
    { ok: false, error: 'permission_denied' },
    'the revoked approver cannot vote again',
  );
  t.match(
    await g.gate.approve(a.id, a.hash, reviewer('supervisor-2')),
    { ok: true, status: 'pending_approvals' },
    'a second vote is now only the first that counts',
  );
  t.match(await g.gate.approve(a.id, a.hash, reviewer('supervisor-3')), { ok: true, status: 'reserved' });
  t.same((await votes(g.pool, a.id)).approvers, ['supervisor-2', 'supervisor-3']);
  const [row] = await auditRows(g.pool, "action = 'role' AND outcome = 'revoked'");
  t.match(row, { principal_id: 'supervisor-1', detail: { by: 'security', votes_withdrawn: [a.id] } });
});

t.test('the principal store withdraws the same votes; a vote of unknown role goes on any revocation', async (t) => {
  const g = await gateFixture(t);
  const store = new PrincipalStore(g.config, g.pool);
  const a = await pendingDeletion(g);
  await g.gate.approve(a.id, a.hash, reviewer('supervisor-1'));
  t.same(
    await store.revoke('supervisor-1', 'tenant-a', 'auditor', 'security'),
    { votes_withdrawn: [] },
    'another role of the approver: the vote stays',
  );
  t.same((await votes(g.pool, a.id)).approvers, ['supervisor-1']);
  // A vote recorded before roles were: its role is unknown, so any revocation of that approver withdraws it.
  await g.pool.query("UPDATE actionledger.gate_approvals SET approver_roles = '{}' WHERE approval_id = $1", [a.id]);
  t.same(await store.revoke('supervisor-1', 'tenant-a', 'reader', 'security'), { votes_withdrawn: [a.id] });
  t.same(await votes(g.pool, a.id), { approvers: [], approver_roles: [] });
  await g.gate.approve(a.id, a.hash, reviewer('supervisor-2'));
  t.same(
    await store.revoke('supervisor-2', 'tenant-a', 'supervisor', 'security'),
    { votes_withdrawn: [a.id] },
    'and the role it was cast with',
  );
});

t.test('a vote cast after votes of unknown role keeps the two arrays aligned', async (t) => {
  const g = await gateFixture(t);
  const a = await pendingDeletion(g);
  await g.gate.approve(a.id, a.hash, reviewer('supervisor-1'));
  await g.pool.query("UPDATE actionledger.gate_approvals SET approver_roles = '{}' WHERE approval_id = $1", [a.id]);
  await g.gate.approve(a.id, a.hash, reviewer('supervisor-2'));
  t.same(await votes(g.pool, a.id), {
    approvers: ['supervisor-1', 'supervisor-2'],
    approver_roles: [null, 'supervisor'],
  });
});

t.test('the authorization service denies an approval-backed operation whose approver lost the role', async (t) => {
  const x = await gateDispatchEnv(t);
  const op = await approvedDeletion(x.g);
  t.same((await x.g.gate.revokeRole('tenant-a', 'supervisor-2', 'supervisor', 'security')).votes_withdrawn, []);
  const row = await x.dispatch(op.operation_id);
  t.equal(row.status, 'needs_review');
  t.equal(row.review_reason, 'authorization:authorization_denied');
  t.equal(x.e.provider.requestsFor(op.effect_key), 0, 'no request reached the provider');
  t.match(await auditRows(x.e.pool, "action = 'authorize'"), [
    { outcome: 'deny', detail: { reason: 'approver_role_not_held' } },
  ]);
});

t.test('an approval whose votes carry no roles is denied; restored roles are allowed', async (t) => {
  const x = await gateDispatchEnv(t);
  const legacy = await approvedDeletion(x.g);
  const revoked = await approvedDeletion(x.g, ['supervisor-3', 'supervisor-4'], 'delete-2');
  // As an approval executed before approver roles were recorded: the final-state trigger is bypassed for this.
  const c = await x.e.pool.connect();
  try {
    await c.query('BEGIN');
    await c.query('SET LOCAL session_replication_role = replica');
    await c.query("UPDATE actionledger.gate_approvals SET approver_roles = '{}' WHERE approval_id = $1", [
      legacy.approval_id,
    ]);
    await c.query('COMMIT');
  } finally {
    c.release();
  }
  await x.g.gate.revokeRole('tenant-a', 'supervisor-4', 'supervisor', 'security');
  await x.g.gate.restoreRole('tenant-a', 'supervisor-4', 'supervisor', 'security');
  t.equal((await x.dispatch(legacy.operation_id)).review_reason, 'authorization:authorization_denied');
  t.equal((await x.dispatch(revoked.operation_id)).status, 'succeeded', 'a restored role holds again');
  t.equal(x.e.provider.requestsFor(legacy.effect_key), 0);
  t.equal(x.e.provider.requestsFor(revoked.effect_key), 1);
  const reasons = (await auditRows(x.e.pool, "action = 'authorize'")).map(
    (r) => (r.detail as { reason: string }).reason,
  );
  t.same(reasons.sort(), ['approval', 'approver_role_not_held']);
});
