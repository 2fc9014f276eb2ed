/**
 * The pipeline: order of checks, structured refusals, authority from the trusted context, budgets in
 * PostgreSQL (rate windows, caps, released on failure), the kill switch, and the audit log. Every refusal is
 * checked for its effect: nothing reserved, nothing consumed, one audit row.
 */
import t from 'tap';
import { bindQueries } from '../../db/db.js';
import { dispatcherQueries } from '../../dispatcher/queries.js';
import { auditRows, count, gateFixture, gctx } from '../helpers/gate.js';

const refund = (order = 'O-1', amount = 243.71) => ({ order_id: order, amount, currency: 'GBP' });
const ops = (pool: Parameters<typeof count>[0]) => count(pool, 'actionledger.operations');

t.test('14 prompt-injected refunds from one conversation stop at the per-conversation cap', async (t) => {
  const { gate, pool } = await gateFixture(t);
  const results = [];
  for (let i = 1; i <= 14; i++)
    results.push(
      await gate.call(gctx({ workflow_step_id: `refund-${i}`, turn_id: 'turn-7' }), 'issue_refund', refund(`O-${i}`)),
    );
  const allowed = results.filter((r) => r.ok);
  t.equal(allowed.length, 2, 'two refunds of 243.71 fit under the 500 cap; the third would not');
  t.same(
    [...new Set(results.filter((r) => !r.ok).map((r) => (r.ok ? '' : r.error)))],
    ['limit_exceeded'],
    'every other call is refused with limit_exceeded',
  );
  t.equal(await ops(pool), 2, 'exactly two operations reserved');
  const refusals = await auditRows(
    pool,
    "action = 'call' AND outcome = 'limit_exceeded' AND conversation_id = 'conv-1'",
  );
  t.equal(refusals.length, 12, 'an audit row for each refusal');
  t.equal((await auditRows(pool, "action = 'call' AND outcome = 'allowed'")).length, 2);
  const { rows } = await pool.query(
    "SELECT used_count, used_value::text FROM actionledger.gate_counters WHERE scope = 'conversation'",
  );
  t.same(rows, [{ used_count: 2, used_value: '487.42' }], 'refused calls took nothing from the cap');
  // Another conversation has its own budget.
  const other = await gate.call(
    gctx({ conversation_id: 'conv-2', workflow_step_id: 'refund-15' }),
    'issue_refund',
    refund('O-15'),
  );
  t.equal(other.ok, true);
});

t.test('daily cap 100,000 with two concurrent 80,000 transfers: exactly one', async (t) => {
  const { gate, pool } = await gateFixture(t);
  const transfer = { to_account: 'ACC0000000002', amount: 80000 };
  const [a, b] = await Promise.all([
    gate.call(gctx({ workflow_step_id: 'transfer-a' }), 'transfer_funds', transfer),
    gate.call(gctx({ workflow_step_id: 'transfer-b' }), 'transfer_funds', transfer),
  ]);
  t.equal([a, b].filter((r) => r.ok).length, 1, 'one succeeds');
  t.same(
    [a, b].filter((r) => !r.ok).map((r) => (r.ok ? '' : r.error)),
    ['limit_exceeded'],
  );
  t.equal(await ops(pool), 1, 'one operation');
  const { rows } = await pool.query(
    'SELECT scope, used_value::text, used_count FROM actionledger.gate_counters ORDER BY scope',
  );
  t.same(rows, [
    { scope: 'account_day', used_value: '80000', used_count: 1 },
    { scope: 'principal_day', used_value: '80000', used_count: 1 },
  ]);

  // Many at once, across connections: never past the cap.
  const many = await Promise.all(
    Array.from({ length: 12 }, (_, i) =>
      gate.call(gctx({ principal_id: 'agent-2', account_id: 'acct-9', workflow_step_id: `t-${i}` }), 'transfer_funds', {
        to_account: 'ACC0000000003',
        amount: 30000,
      }),
    ),
  );
  t.equal(many.filter((r) => r.ok).length, 3, '3 x 30,000 fit under 100,000; nine refused');
  const used = await pool.query<{ used_value: string }>(
    "SELECT used_value::text FROM actionledger.gate_counters WHERE scope = 'account_day' AND scope_key = 'acct-9'",
  );
  t.equal(used.rows[0]?.used_value, '90000');

  // The principal's cap admits it, the account's does not: the refusal leaves the principal's cap untouched.
  t.match(await gate.call(gctx({ principal_id: 'agent-3', workflow_step_id: 't-x' }), 'transfer_funds', transfer), {
    ok: false,
    error: 'limit_exceeded',
    details: { scope: 'account_day' },
  });
  t.equal(
    await count(pool, "actionledger.gate_counters WHERE scope_key = 'agent-3' AND used_value > 0"),
    0,
    'nothing taken from a cap that admitted it',
  );
});

t.test('a cap is released when the operation ends failed', async (t) => {
  const { gate, pool } = await gateFixture(t);
  const r = await gate.call(gctx({ workflow_step_id: 'x' }), 'transfer_funds', {
    to_account: 'ACC0000000002',
    amount: 90000,
  });
  if (!r.ok) throw new Error(r.message);
  t.equal(
    (await gate.call(gctx({ workflow_step_id: 'y' }), 'transfer_funds', { to_account: 'ACC0000000002', amount: 20000 }))
      .ok,
    false,
    'cap is held',
  );
  // Through executing: the database refuses pending -> failed.
  await pool.query(
    "UPDATE actionledger.operations SET status = 'executing', claim_token = gen_random_uuid() WHERE operation_id = $1",
    [r.operation_id],
  );
  await pool.query("UPDATE actionledger.operations SET status = 'failed' WHERE operation_id = $1", [r.operation_id]);
  const { rows } = await pool.query(
    'SELECT used_value::text, used_count FROM actionledger.gate_counters ORDER BY scope',
  );
  t.same(
    rows,
    [
      { used_value: '0', used_count: 0 },
      { used_value: '0', used_count: 0 },
    ],
    'both daily counters given back',
  );
  t.equal(
    await count(pool, 'actionledger.gate_cap_holds WHERE released_at IS NOT NULL AND release_reason = $1', [
      'operation_failed',
    ]),
    2,
  );
  t.equal(
    (await gate.call(gctx({ workflow_step_id: 'y' }), 'transfer_funds', { to_account: 'ACC0000000002', amount: 20000 }))
      .ok,
    true,
    'budget usable again',
  );
  // Succeeded operations keep their budget.
  await pool.query(
    "UPDATE actionledger.operations SET status = 'executing', claim_token = gen_random_uuid() WHERE workflow_step_id = 'y'",
  );
  await pool.query("UPDATE actionledger.operations SET status = 'succeeded' WHERE workflow_step_id = 'y'");
  t.equal(
    (
      await pool.query<{ used_value: string }>(
        "SELECT used_value::text FROM actionledger.gate_counters WHERE scope = 'account_day'",
      )
    ).rows[0]?.used_value,
    '20000',
  );
});

t.test('schema violations are invalid_arguments naming the violation; nothing reserved or consumed', async (t) => {
  const { gate, pool } = await gateFixture(t);
  const cases: [string, unknown, RegExp][] = [
    [
      'unexpected force argument',
      { to_account: 'ACC0000000002', amount: 10, force: true },
      /additional properties \(force\)/,
    ],
    ['negative amount', { to_account: 'ACC0000000002', amount: -50000 }, /amount must be > 0/],
    ['pattern-breaking account id', { to_account: 'attacker', amount: 10 }, /to_account must match pattern/],
    ['identity field in arguments', { to_account: 'ACC0000000002', amount: 10, account_id: 'acct-OTHER' }, /identity/],
    [
      'nested identity field',
      { to_account: 'ACC0000000002', amount: 10, memo: 'x', x: { principal_id: 'root' } },
      /identity/,
    ],
    ['not an object', ['ACC0000000002', 10], /must be object|identity|arguments/],
  ];
  for (const [name, args, message] of cases) {
    const r = await gate.call(gctx({ workflow_step_id: name }), 'transfer_funds', args);
    t.equal(r.ok, false, name);
    if (!r.ok) {
      t.equal(r.error, 'invalid_arguments', name);
      t.match(r.message, message, `${name}: ${r.message}`);
    }
  }
  t.equal(await ops(pool), 0, 'nothing reserved');
  t.equal(await count(pool, 'actionledger.gate_counters'), 0, 'no cap touched');
  t.equal((await auditRows(pool, "outcome = 'invalid_arguments'")).length, cases.length, 'each refusal audited');
});

t.test("another account's order is not_found, identical to a missing one", async (t) => {
  const { gate, pool } = await gateFixture(t);
  const other = await gate.call(gctx({ workflow_step_id: 'a' }), 'issue_refund', refund('O-900', 50));
  const missing = await gate.call(gctx({ workflow_step_id: 'b' }), 'issue_refund', refund('O-999999', 50));
  t.same(other, missing, 'the same result, byte for byte');
  t.match(other, { ok: false, error: 'not_found' });
  const refunded = await gate.call(gctx({ workflow_step_id: 'c' }), 'issue_refund', refund('O-901', 50));
  t.match(refunded, { ok: false, error: 'invalid_request' }, 'business refusal of an owned order');
  t.equal(await ops(pool), 0);
  t.equal(await count(pool, 'actionledger.gate_counters'), 0);
});

t.test('order of checks: unknown_tool, permission_denied (default deny), tool_disabled, rate_limited', async (t) => {
  const rated = { gate: { tools: { issue_refund: { rate: { limit: 2, window_s: 3600 } } } } };
  const { gate, pool, url } = await gateFixture(t, rated);
  t.match(await gate.call(gctx(), 'drop_tables', { force: true }), { ok: false, error: 'unknown_tool' });
  t.match(
    await gate.call(gctx(), 'lookup_order', { order_id: 'O-1' }),
    { ok: false, error: 'permission_denied' },
    'a tool nobody listed is callable by nobody',
  );
  t.match(
    await gate.call(gctx({ role: 'guest' }), 'issue_refund', { bogus: 1 }),
    { ok: false, error: 'permission_denied' },
    'permission before arguments',
  );
  t.match(
    await gate.call(gctx({ tenant_id: 'tenant-z' }), 'issue_refund', refund()),
    { ok: false, error: 'permission_denied' },
    'tenant without a route',
  );
  // Permission refusals consume no rate: two good calls still fit the window of 2.
  t.equal((await gate.call(gctx({ workflow_step_id: 's1' }), 'issue_refund', refund('O-1', 10))).ok, true);
  // An invalid call is refused and consumes nothing either.
  t.match(await gate.call(gctx({ workflow_step_id: 's2' }), 'issue_refund', refund('bad', 10)), {
    ok: false,
    error: 'invalid_arguments',
  });
  t.equal(
    (await gate.call(gctx({ workflow_step_id: 's3' }), 'issue_refund', refund('O-2', 10))).ok,
    true,
    'second allowed call fits',
  );
  const limited = await gate.call(gctx({ workflow_step_id: 's4' }), 'issue_refund', { bogus: true });
  t.match(limited, { ok: false, error: 'rate_limited' }, 'rate before arguments');
  t.ok(
    !limited.ok &&
      typeof limited.retry_after_s === 'number' &&
      limited.retry_after_s > 0 &&
      limited.retry_after_s <= 3600,
    'retry_after_s given',
  );
  t.equal(
    (await pool.query<{ used: number }>('SELECT used FROM actionledger.gate_rate_windows')).rows[0]?.used,
    2,
    'the window counts only allowed calls',
  );
  // The rate window is shared by every process: a second Gate (another pool) sees the same window.
  const second = await gateFixture(t, { ...rated, url });
  t.match(
    await second.gate.call(gctx({ workflow_step_id: 's5' }), 'issue_refund', refund('O-3', 10)),
    { ok: false, error: 'rate_limited' },
    'another process sees the same spent window',
  );

  await gate.engageKillSwitch('tenant-a', 'issue_refund', 'oncall', 'incident 42');
  t.match(
    await gate.call(gctx({ principal_id: 'agent-9', workflow_step_id: 's6' }), 'issue_refund', refund('O-4', 10)),
    { ok: false, error: 'tool_disabled' },
  );
  t.match(
    await gate.call(gctx({ principal_id: 'agent-9', role: 'guest' }), 'issue_refund', refund('O-4', 10)),
    { ok: false, error: 'permission_denied' },
    'permission before the kill switch',
  );
  t.equal(await gate.liftKillSwitch('tenant-a', 'issue_refund', 'oncall'), true);
  t.equal(
    (await gate.call(gctx({ principal_id: 'agent-9', workflow_step_id: 's6' }), 'issue_refund', refund('O-4', 10))).ok,
    true,
    'lifted',
  );
  await gate.engageKillSwitch('*', '*', 'oncall', 'everything');
  t.match(
    await gate.call(gctx({ principal_id: 'agent-9', workflow_step_id: 's7' }), 'transfer_funds', {
      to_account: 'ACC0000000002',
      amount: 1,
    }),
    { ok: false, error: 'tool_disabled' },
    'wildcard switch',
  );
  t.equal((await auditRows(pool, "action = 'kill_switch'")).length, 3);
  // Ended windows are pruned, so the table does not grow with every principal ever seen.
  await pool.query("UPDATE actionledger.gate_rate_windows SET window_start = window_start - interval '2 hours'");
  t.match(await gate.housekeeping(), { rate_windows_pruned: 2 });
  t.equal(await count(pool, 'actionledger.gate_rate_windows'), 0);
});

t.test('kill switch: pending operations are not claimed until it is lifted', async (t) => {
  const { gate, pool, config } = await gateFixture(t);
  const r = await gate.call(gctx({ workflow_step_id: 'k' }), 'transfer_funds', {
    to_account: 'ACC0000000002',
    amount: 5,
  });
  if (!r.ok) throw new Error(r.message);
  const q = bindQueries(dispatcherQueries, config.schemaQuoted);
  t.match(
    await gate.engageKillSwitch('tenant-a', 'transfer_funds', 'oncall', 'stop'),
    { pending_held: 1, executing: 0, still_in_flight: 0 },
    'engaging says what the switch holds',
  );
  t.equal((await pool.query(q.outboxClaimBatch, [10, 'w-1'])).rowCount, 0, 'held by the tool switch');
  await gate.liftKillSwitch('tenant-a', 'transfer_funds', 'oncall');
  await gate.engageKillSwitch('tenant-a', '*', 'oncall', 'tenant stop');
  t.equal((await pool.query(q.outboxClaimBatch, [10, 'w-1'])).rowCount, 0, 'held by the tenant switch');
  await gate.engageKillSwitch('tenant-b', '*', 'oncall', 'other tenant');
  await gate.liftKillSwitch('tenant-a', '*', 'oncall');
  const claimed = await pool.query(q.outboxClaimBatch, [10, 'w-1']);
  t.equal(claimed.rowCount, 1, "claimed once lifted; another tenant's switch does not hold it");
  t.equal(
    (await pool.query<{ status: string }>('SELECT status FROM actionledger.operations')).rows[0]?.status,
    'executing',
  );
});

t.test('kill switch: a tool or tenant the configuration does not know is refused, nothing engaged', async (t) => {
  const { gate, pool } = await gateFixture(t);
  await t.rejects(gate.engageKillSwitch('*', 'transfer_fund', 'oncall', 'typo'), {
    code: 'unknown_tool',
    message: /"transfer_fund".*configured: .*transfer_funds/,
  });
  await t.rejects(gate.engageKillSwitch('tenant-x', '*', 'oncall', 'typo'), {
    code: 'unknown_tenant',
    message: /"tenant-x".*configured: tenant-a, tenant-b/,
  });
  t.equal((await pool.query('SELECT 1 FROM actionledger.gate_kill_switches')).rowCount, 0, 'no switch engaged');
  t.equal((await auditRows(pool, "action = 'kill_switch'")).length, 0, 'and no decision audited');
  t.match(await gate.engageKillSwitch('*', '*', 'oncall', 'everything'), { pending_held: 0 }, "'*' for both");
  t.equal(await gate.liftKillSwitch('tenant-x', 'transfer_fund', 'oncall'), false, 'lifting is never refused');
});

t.test('audit: every decision, arguments redacted per tool at write time', async (t) => {
  const { gate, pool } = await gateFixture(t);
  await gate.call(gctx({ workflow_step_id: 'm' }), 'transfer_funds', {
    to_account: 'ACC0000000002',
    amount: 5,
    memo: 'card 4111 1111 1111 1111',
  });
  await gate.call(gctx({ workflow_step_id: 'n' }), 'transfer_funds', {
    to_account: 'nope',
    amount: 5,
    memo: 'secret again',
  });
  await gate.call(gctx(), 'no_such_tool', { password: 'hunter2' });
  const rows = await auditRows(pool, "action = 'call'");
  t.same(
    rows.map((r) => [r.tool_name, r.outcome]),
    [
      ['transfer_funds', 'allowed'],
      ['transfer_funds', 'invalid_arguments'],
      ['no_such_tool', 'unknown_tool'],
    ],
  );
  t.same(rows[0]?.arguments, { to_account: 'ACC0000000002', amount: 5, memo: '[redacted]' });
  t.same(rows[1]?.arguments, { to_account: 'nope', amount: 5, memo: '[redacted]' }, 'refusals are redacted too');
  t.equal(rows[2]?.arguments, null, 'no redaction policy for an unknown tool: arguments not kept');
  const text = JSON.stringify((await pool.query('SELECT * FROM actionledger.gate_audit')).rows);
  t.notMatch(text, /4111 1111|secret again|hunter2/, 'no secret reached the audit table');
  t.match(rows[0], {
    principal_id: 'agent-1',
    role: 'agent',
    conversation_id: 'conv-1',
    turn_id: 'turn-1',
    trace_id: 'trace-1',
    account_id: 'acct-1',
  });
  await t.rejects(pool.query('DELETE FROM actionledger.gate_audit'), /append-only/, 'append-only');
});

t.test('a replayed step is one operation and counts once against the caps', async (t) => {
  const { gate, pool } = await gateFixture(t);
  const a = await gate.call(gctx({ workflow_step_id: 'same' }), 'transfer_funds', {
    to_account: 'ACC0000000002',
    amount: 60000,
  });
  const b = await gate.call(gctx({ workflow_step_id: 'same' }), 'transfer_funds', {
    to_account: 'ACC0000000002',
    amount: 60000,
  });
  t.match(a, { ok: true, created: true });
  t.match(b, { ok: true, created: false });
  t.equal(a.ok && b.ok && a.operation_id === b.operation_id, true);
  t.equal(
    (
      await pool.query<{ used_value: string }>(
        "SELECT used_value::text FROM actionledger.gate_counters WHERE scope = 'account_day'",
      )
    ).rows[0]?.used_value,
    '60000',
  );
  // The same step with other arguments is refused by the ledger after the caps were taken: all rolled back.
  t.match(
    await gate.call(gctx({ workflow_step_id: 'same' }), 'transfer_funds', { to_account: 'ACC0000000002', amount: 100 }),
    { ok: false, error: 'operation_conflict' },
  );
  t.equal(
    (
      await pool.query<{ used_value: string }>(
        "SELECT used_value::text FROM actionledger.gate_counters WHERE scope = 'account_day'",
      )
    ).rows[0]?.used_value,
    '60000',
    'the conflicting call took nothing',
  );
  t.equal((await auditRows(pool, "outcome = 'operation_conflict'")).length, 1, 'and is audited');
});

t.test('invalid trusted context is refused as a value, not thrown', async (t) => {
  const { gate } = await gateFixture(t);
  const r = await gate.call({ ...gctx(), role: '' }, 'issue_refund', refund());
  t.match(r, { ok: false, error: 'invalid_context', details: { fields: ['role'] } });
});
