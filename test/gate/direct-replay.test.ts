/** The gate never takes over an operation reserved straight through the ledger (the trusted path). */
import t from 'tap';
import { count, gateFixture, gctx } from '../helpers/gate.js';

t.test('a gate call replaying a direct reservation is refused and changes nothing', async (t) => {
  const g = await gateFixture(t);
  const args = { to_account: 'ACC0000000002', amount: 25 };
  const direct = await g.ledger.reserve(
    {
      tenant_id: 'tenant-a',
      principal_id: 'agent-1',
      task_id: 'task-1',
      workflow_step_id: 'step-1',
      approval_id: 'ap-direct',
      policy_version: 'p-direct',
    },
    'transfer_funds',
    args,
  );
  t.equal(direct.created, true);

  const r = await g.gate.call(gctx(), 'transfer_funds', args);
  t.match(r, { ok: false, error: 'operation_conflict', message: /reserved outside the gate/ });
  const op = await g.pool.query<{ current_approval_id: string; current_policy_version: string }>(
    'SELECT current_approval_id, current_policy_version FROM actionledger.operations WHERE operation_id = $1',
    [direct.operation_id],
  );
  t.same(
    op.rows[0],
    { current_approval_id: 'ap-direct', current_policy_version: 'p-direct' },
    'its approval and policy are as reserved: the replay was rolled back',
  );
  t.equal(await count(g.pool, 'actionledger.gate_operations'), 0, 'no gate record of it');
  t.equal(
    await count(g.pool, "actionledger.gate_audit WHERE action = 'call' AND outcome = 'operation_conflict'"),
    1,
    'the refusal is audited',
  );

  // A step the gate reserved still replays as before: same operation, nothing taken twice.
  const first = await g.gate.call(gctx({ workflow_step_id: 'step-2' }), 'transfer_funds', args);
  const again = await g.gate.call(gctx({ workflow_step_id: 'step-2' }), 'transfer_funds', args);
  t.match(first, { ok: true, status: 'reserved', created: true });
  t.match(again, {
    ok: true,
    status: 'reserved',
    created: false,
    operation_id: (first as { operation_id: string }).operation_id,
  });
});
