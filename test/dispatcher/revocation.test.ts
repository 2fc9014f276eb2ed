/**
 * A role revoked between the authorization decision and the send: the dispatcher's final check, made under
 * the row lock right before the provider request, sees it, and the provider receives nothing. The revocation
 * is made by a trigger on the evidence row, so it commits after the built-in authorization service allowed
 * and before the dispatch batch takes its locks. Real PostgreSQL, real mTLS, the sandbox provider.
 */
import t from 'tap';
import { bindQueries } from '../../db/db.js';
import { dispatcherQueries } from '../../dispatcher/queries.js';
import { approvedDeletion, gateDispatchEnv, type GateDispatchEnv } from '../helpers/gate-dispatch.js';
import { auditRows } from '../helpers/gate.js';

/** Revokes `role` of `principal` in tenant-a in the transaction that records an operation's evidence. */
async function revokeAfterDecision(x: GateDispatchEnv, principal: string, role: string): Promise<void> {
  await x.e.pool.query(`
    CREATE FUNCTION public.revoke_after_evidence() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO actionledger.gate_role_revocations (tenant_id, principal_id, role, revoked_by)
      VALUES ('tenant-a', '${principal}', '${role}', 'security') ON CONFLICT DO NOTHING;
      RETURN NEW;
    END $$;
    CREATE TRIGGER revoke_after_evidence AFTER INSERT ON actionledger.authorization_evidence
      FOR EACH ROW EXECUTE FUNCTION public.revoke_after_evidence();`);
}

const cases: [string, string, string][] = [
  ['an approver', 'supervisor-2', 'supervisor'],
  ['the requester', 'admin-1', 'admin'],
];

for (const [who, principal, role] of cases) {
  t.test(`${who}'s role revoked after the decision: no provider request`, async (t) => {
    const x = await gateDispatchEnv(t);
    const op = await approvedDeletion(x.g);
    await revokeAfterDecision(x, principal, role);
    const row = await x.dispatch(op.operation_id);
    t.equal(row.status, 'needs_review');
    t.equal(row.review_reason, 'final_check:role_revoked');
    t.equal(x.e.provider.requestsFor(op.effect_key), 0, 'the provider received zero requests');
    t.match(
      await auditRows(x.e.pool, "action = 'authorize'"),
      [{ outcome: 'allow', detail: { reason: 'approval' } }],
      'the authorization service had allowed it',
    );
    const { rows } = await x.e.pool.query<{ provider_contact: string }>(
      'SELECT provider_contact FROM actionledger.operations WHERE operation_id = $1',
      [op.operation_id],
    );
    t.equal(rows[0]?.provider_contact, 'not_called', 'recorded as never sent, so a reviewed retry is safe');
  });
}

t.test('a revocation of another role or another principal does not stop the send', async (t) => {
  const x = await gateDispatchEnv(t);
  const op = await approvedDeletion(x.g);
  await x.g.gate.revokeRole('tenant-a', 'supervisor-2', 'editor', 'security');
  await x.g.gate.revokeRole('tenant-a', 'supervisor-9', 'supervisor', 'security');
  await revokeAfterDecision(x, 'admin-1', 'agent');
  t.equal((await x.dispatch(op.operation_id)).status, 'succeeded');
  t.equal(x.e.provider.requestsFor(op.effect_key), 1);
});

t.test('the final check finds revocations, approvals and the gate record by index', async (t) => {
  const x = await gateDispatchEnv(t);
  const op = await approvedDeletion(x.g);
  const q = bindQueries(dispatcherQueries, '"actionledger"');
  const c = await x.e.pool.connect();
  try {
    await c.query('BEGIN');
    await c.query('SET LOCAL enable_seqscan = off');
    const sql = q.operationFinalCheckBatch
      .replaceAll('$1::uuid[]', `ARRAY['${op.operation_id}']::uuid[]`)
      .replaceAll('$2::uuid[]', 'ARRAY[gen_random_uuid()]')
      .replaceAll('$3::float8', '1000::float8');
    const { rows } = await c.query<{ 'QUERY PLAN': unknown }>(`EXPLAIN (FORMAT JSON) ${sql}`);
    await c.query('ROLLBACK');
    const plan = JSON.stringify(rows[0]?.['QUERY PLAN']);
    for (const table of ['gate_role_revocations', 'gate_approvals', 'gate_operations', 'operations']) {
      t.match(plan, new RegExp(`"Relation Name":"${table}"`), `${table} is read`);
      t.notMatch(
        plan,
        new RegExp(`"Node Type":"Seq Scan"[^}]*"Relation Name":"${table}"`),
        `${table} is not read by a sequential scan`,
      );
    }
  } finally {
    c.release();
  }
});
