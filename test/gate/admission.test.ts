/**
 * A call's admission is one statement (gate/admission.ts): the role revocation, the kill switch, the rate window,
 * the caps and the plan version are read and taken together, and the checks that need no database (arguments,
 * value) and the business validator are answered in their places between them. These cases put two refusals in
 * one call and check that the earlier one in the pipeline's order answers, that nothing is consumed, and that a
 * pool connection which lost the named statements decides again unnamed.
 */
import t from 'tap';
import { createPool } from '../../db/db.js';
import { createTestDatabase } from '../helpers/db.js';
import { auditRows, count, gateFixture, gctx } from '../helpers/gate.js';

const refund = (order = 'O-1', amount = 10, currency = 'GBP') => ({ order_id: order, amount, currency });
const counters = async (pool: Parameters<typeof count>[0]) =>
  (
    await pool.query<{ used_count: number; used_value: string }>(
      "SELECT used_count, used_value::text FROM actionledger.gate_counters WHERE scope = 'conversation'",
    )
  ).rows;

t.test('a revoked role answers before a spent window and bad arguments, and takes nothing', async (t) => {
  const { gate, pool } = await gateFixture(t, {
    gate: { tools: { issue_refund: { rate: { limit: 1, window_s: 3600 } } } },
  });
  t.equal((await gate.call(gctx({ workflow_step_id: 'a' }), 'issue_refund', refund())).ok, true);
  await gate.revokeRole('tenant-a', 'agent-1', 'agent', 'oncall');
  t.match(await gate.call(gctx({ workflow_step_id: 'b' }), 'issue_refund', { bogus: 1 }), {
    ok: false,
    error: 'permission_denied',
  });
  await gate.restoreRole('tenant-a', 'agent-1', 'agent', 'oncall');
  await gate.engageKillSwitch('tenant-a', 'issue_refund', 'oncall', 'incident');
  t.match(await gate.call(gctx({ workflow_step_id: 'b' }), 'issue_refund', { bogus: 1 }), {
    ok: false,
    error: 'tool_disabled',
  });
  await gate.liftKillSwitch('tenant-a', 'issue_refund', 'oncall');
  t.match(await gate.call(gctx({ workflow_step_id: 'b' }), 'issue_refund', { bogus: 1 }), {
    ok: false,
    error: 'rate_limited',
  });
  t.equal(
    (await pool.query<{ used: number }>('SELECT used FROM actionledger.gate_rate_windows')).rows[0]?.used,
    1,
    'only the allowed call is in the window',
  );
  t.same(await counters(pool), [{ used_count: 1, used_value: '10' }], 'only the allowed call is on the cap');
});

t.test('the business validator answers before the value and the caps', async (t) => {
  const { gate, pool } = await gateFixture(t);
  t.equal((await gate.call(gctx({ workflow_step_id: 'a' }), 'issue_refund', refund('O-1', 400))).ok, true);
  // O-900 is another account's order (not_found), and 200 more would pass the conversation's 500.
  t.match(await gate.call(gctx({ workflow_step_id: 'b' }), 'issue_refund', refund('O-900', 200)), {
    ok: false,
    error: 'not_found',
  });
  t.match(await gate.call(gctx({ workflow_step_id: 'd' }), 'issue_refund', refund('O-2', 200)), {
    ok: false,
    error: 'limit_exceeded',
    details: { scope: 'conversation' },
  });
  t.same(await counters(pool), [{ used_count: 1, used_value: '400' }], 'refused calls took nothing');
  t.equal(await count(pool, 'actionledger.operations'), 1);
  t.equal((await auditRows(pool, "action = 'call'")).length, 3, 'every decision audited');
});

t.test('a value refusal with another account’s order: the validator answers first', async (t) => {
  // A currency other than the caps' is refused by the argument schema now (a configuration whose schema admits
  // one does not load); the value refusal left is a value-capped tool without value.limits_currency.
  const { gate, pool } = await gateFixture(t, {
    gate: { tools: { issue_refund: { value: { argument: 'amount', currency_argument: 'currency' } } } },
  });
  t.match(await gate.call(gctx({ workflow_step_id: 'c' }), 'issue_refund', refund('O-900', 20)), {
    ok: false,
    error: 'not_found',
  });
  t.match(await gate.call(gctx({ workflow_step_id: 'c' }), 'issue_refund', refund('O-2', 20)), {
    ok: false,
    error: 'config_invalid',
  });
  t.same(await counters(pool), [], 'refused calls took nothing');
  t.equal(await count(pool, 'actionledger.operations'), 0);
});

t.test('a connection that lost the named statements decides again unnamed', async (t) => {
  const url = await createTestDatabase(t);
  // One connection, so the DEALLOCATE below reaches the session the gate's statements were named in.
  const pool = createPool(url, { max: 1, statementTimeoutMs: 30_000, applicationName: 'test-gate' });
  t.teardown(() => pool.end());
  const { gate } = await gateFixture(t, {
    url,
    pool,
    gate: { tools: { issue_refund: { rate: { limit: 10, window_s: 3600 } } } },
  });
  t.equal((await gate.call(gctx({ workflow_step_id: 'a' }), 'issue_refund', refund())).ok, true);
  t.equal(
    (await gate.call(gctx({ workflow_step_id: 'b' }), 'transfer_funds', { to_account: 'ACC0000000002', amount: 5 })).ok,
    true,
  );
  await pool.query('DEALLOCATE ALL');
  const again = await gate.call(gctx({ workflow_step_id: 'c' }), 'issue_refund', refund('O-2'));
  t.match(again, { ok: true, created: true });
  t.match(
    await gate.call(gctx({ workflow_step_id: 'd' }), 'transfer_funds', { to_account: 'ACC0000000002', amount: 5 }),
    { ok: true, created: true },
  );
  t.equal(await count(pool, 'actionledger.operations'), 4);
  t.equal(await count(pool, 'actionledger.gate_operations'), 4);
  t.equal(
    (await pool.query<{ used: number }>('SELECT used FROM actionledger.gate_rate_windows')).rows[0]?.used,
    2,
    'the failed try took nothing from the window',
  );
  t.equal(await count(pool, "actionledger.gate_audit WHERE action = 'call' AND outcome = 'allowed'"), 4);
});
