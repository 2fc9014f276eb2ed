/**
 * The gate under misuse: caps across currencies, conflicts with another tenant's step, audit rows for input
 * PostgreSQL cannot store, caps held by abandoned proposals, a plan changed after execution, redaction of
 * nested secrets, hostile input, and approval or execution by someone without the right role or resolvers.
 */
import t from 'tap';
import { AuthorizationService, Gate, runGateHousekeeping, type GateResult } from '../../gate/index.js';
import { auditRows, count, GATE_RESOLVERS, gateFixture, gctx, reviewer } from '../helpers/gate.js';

const editor = (over = {}) => gctx({ principal_id: 'editor-1', role: 'editor', ...over });
const publish = { document_id: 'DOC-1', status: 'published' };
const errorOf = (r: GateResult): string => (r.ok ? 'ok' : r.error);

function requestId(r: GateResult): string {
  if (r.ok || r.request_id === undefined) throw new Error(`expected a held call, got ${JSON.stringify(r)}`);
  return r.request_id;
}

t.test('alternating GBP/EUR refunds never double the per-conversation count and value caps', async (t) => {
  const { gate, pool } = await gateFixture(t);
  const results: GateResult[] = [];
  for (let i = 1; i <= 14; i++) {
    results.push(
      await gate.call(gctx({ workflow_step_id: `refund-${i}`, turn_id: 'turn-7' }), 'issue_refund', {
        order_id: `O-${i}`,
        amount: 100,
        currency: i % 2 === 0 ? 'GBP' : 'EUR',
      }),
    );
  }
  const allowed = results.filter((r) => r.ok);
  t.ok(allowed.length <= 3, `at most max_count 3 allowed (got ${allowed.length})`);
  const { rows } = await pool.query<{ total: string }>(
    "SELECT coalesce(sum((arguments_json->>'amount')::numeric), 0)::text AS total FROM actionledger.operations",
  );
  t.ok(Number(rows[0]?.total) <= 500, `total reserved value within max_value 500 (got ${rows[0]?.total})`);
  t.ok(
    results.filter((_, i) => (i + 1) % 2 === 1).every((r) => !r.ok && r.error === 'invalid_arguments'),
    "a call in a currency other than the caps' one is refused",
  );
  t.equal(
    await count(pool, "actionledger.gate_counters WHERE currency = 'EUR'"),
    0,
    'no separate bucket for another currency',
  );
  // The approval threshold (500 GBP) is not dodged by naming another currency either.
  const eur = await gate.call(gctx({ conversation_id: 'conv-9', workflow_step_id: 'refund-eur' }), 'issue_refund', {
    order_id: 'O-15',
    amount: 600,
    currency: 'EUR',
  });
  t.equal(errorOf(eur), 'invalid_arguments', 'EUR 600 is neither auto-approved nor held under a GBP threshold');
});

t.test("another tenant's call of the same principal, task and step is its own operation", async (t) => {
  const { gate, pool } = await gateFixture(t);
  const step = { task_id: 'task-x', workflow_step_id: 'step-x' };
  const mine = await gate.call(gctx(step), 'transfer_funds', { to_account: 'ACC0000000002', amount: 10 });
  if (!mine.ok || mine.operation_id === undefined) throw new Error(JSON.stringify(mine));
  const other = (over = {}) =>
    gctx({ tenant_id: 'tenant-b', account_id: 'acct-b', conversation_id: 'conv-b', ...step, ...over });
  const same = await gate.call(other(), 'transfer_funds', { to_account: 'ACC0000000002', amount: 10 });
  const different = await gate.call(other({ workflow_step_id: 'step-y' }), 'transfer_funds', {
    to_account: 'ACC0000000003',
    amount: 11,
  });
  t.match(same, { ok: true, status: 'reserved', created: true }, "tenant-a's step does not stand in tenant-b's way");
  t.match(different, { ok: true, created: true });
  t.not(same.ok && same.operation_id, mine.operation_id, 'a different operation id');
  t.not(same.ok && same.effect_key, mine.effect_key, 'and a different effect key');
  const audit = await auditRows(pool, "tenant_id = 'tenant-b'");
  t.equal(audit.length, 2);
  t.notOk(JSON.stringify(audit).includes(mine.operation_id), "tenant-a's operation is not in tenant-b's audit rows");
});

t.test('refusals whose tool name or arguments hold U+0000 or lone surrogates are audited', async (t) => {
  const { gate, pool } = await gateFixture(t);
  const calls: [string, unknown][] = [
    ['bad\u0000tool', { a: 1 }],
    ['bad\ud800tool', { a: 1 }],
    ['issue_refund', { order_id: 'O-1', amount: 1, currency: 'GBP', 'x\u0000': 1 }],
    ['issue_refund', { order_id: '\ud800', amount: 1, currency: 'GBP' }],
    ['transfer_funds', { to_account: 'ACC\u0000', amount: 1, memo: 'a\u0000b' }],
  ];
  for (const [i, [tool, args]] of calls.entries()) {
    const r = await gate.call(gctx({ workflow_step_id: `s-${i}` }), tool, args);
    t.equal(r.ok, false, `call ${i} refused`);
  }
  const rows = await auditRows(pool, "action = 'call'");
  t.equal(rows.length, calls.length, 'one audit row per refusal');
  t.equal(
    rows.filter((r) => r.arguments === null && (r.detail as Record<string, unknown>).arguments_omitted !== undefined)
      .length,
    3,
    'unstorable arguments are marked, not dropped',
  );
  t.ok(
    rows.every((r) => typeof r.tool_name === 'string' && !r.tool_name.includes('\u0000')),
    'tool names escaped',
  );
});

t.test('a cap held by an abandoned proposal is released by the scheduled housekeeping', async (t) => {
  const { gate, pool, config } = await gateFixture(t, {
    gate: { tools: { send_email: { limits: { per_conversation: { max_count: 1 } } } } },
  });
  const mail = { to: 'a@example.com', subject: 'hi', body: 'hello' };
  requestId(await gate.call(gctx({ workflow_step_id: 'm-1' }), 'send_email', mail, { ttl_s: 1 }));
  t.equal(
    errorOf(await gate.call(gctx({ workflow_step_id: 'm-2' }), 'send_email', mail)),
    'limit_exceeded',
    'the proposal holds the cap',
  );
  await new Promise((r) => setTimeout(r, 1200));
  const done = await gate.housekeeping();
  t.equal(done.proposals_expired, 1, 'housekeeping expired the abandoned proposal');
  t.equal(
    errorOf(await gate.call(gctx({ workflow_step_id: 'm-3' }), 'send_email', mail)),
    'confirmation_required',
    'the cap is free again',
  );
  t.equal(
    await count(pool, "actionledger.gate_audit WHERE action = 'expire' AND tool_name = 'send_email'"),
    1,
    'the expiry is audited',
  );
  const again = await runGateHousekeeping(config, pool);
  t.same(
    { approvals: again.approvals_expired, proposals: again.proposals_expired },
    { approvals: 0, proposals: 0 },
    "the fleet's entry point needs only config and pool",
  );
});

t.test('a plan change after an approval was executed stops dispatch', async (t) => {
  const { gate, pool, config } = await gateFixture(t);
  const id = requestId(await gate.call(editor({ plan_version: 'p1' }), 'update_document', publish));
  const view = await gate.approvals.show(id, { tenant_id: 'tenant-a' });
  const r = await gate.approve(id, view.envelope_sha256, reviewer('supervisor-1'));
  if (!r.ok || r.operation_id === undefined) throw new Error(JSON.stringify(r));
  const service = new AuthorizationService({
    config,
    pool,
    resolvers: GATE_RESOLVERS,
    tls: { cert: '', key: '', ca: '' },
  });
  const { rows } = await pool.query<Record<string, string>>(
    `SELECT operation_id, effect_key, principal_id, task_id, workflow_step_id, tool_name, tenant_id, provider_id,
            canonical_args_sha256 AS args_sha256, current_approval_id AS approval_id, current_policy_version AS policy_version
     FROM actionledger.operations WHERE operation_id = $1`,
    [r.operation_id],
  );
  const request = rows[0] as Parameters<AuthorizationService['decide']>[0];
  t.equal((await service.decide(request)).allow, true, 'allowed while the plan holds');
  await gate.call(editor({ plan_version: 'p2', workflow_step_id: 'step-2' }), 'update_document', publish);
  const after = await service.decide(request);
  t.same({ allow: after.allow, reason: after.reason }, { allow: false, reason: 'plan_version' });
});

t.test('audit redaction reaches nested objects and arrays', async (t) => {
  const { gate, pool } = await gateFixture(t);
  await gate.call(gctx(), 'transfer_funds', {
    to_account: 'ACC0000000002',
    amount: 1,
    nested: { memo: 'secret-1', deeper: [{ memo: 'secret-2' }] },
    list: [{ memo: 'secret-3' }],
  });
  const rows = await auditRows(pool, "action = 'call'");
  t.equal(rows.length, 1);
  const text = JSON.stringify(rows[0]?.arguments);
  t.notOk(/secret-/.test(text), `no redacted value at any depth: ${text}`);
  t.match(rows[0]?.arguments, {
    nested: { memo: '[redacted]', deeper: [{ memo: '[redacted]' }] },
    list: [{ memo: '[redacted]' }],
  });
});

t.test('hostile input gets a specific refusal, never internal', async (t) => {
  const { gate, pool } = await gateFixture(t);
  let deep: Record<string, unknown> = {};
  for (let i = 0; i < 100_000; i++) deep = { a: deep };
  t.equal(
    errorOf(await gate.call(gctx({ workflow_step_id: 'deep' }), 'issue_refund', deep)),
    'invalid_arguments',
    '100,000-deep nesting',
  );
  const none = errorOf(await gate.call(gctx({ workflow_step_id: 'none' }), undefined as unknown as string, {}));
  t.ok(none === 'unknown_tool' || none === 'invalid_request', `tool undefined: ${none}`);
  const mail = { to: 'a@example.com', subject: 'hi', body: 'hello' };
  for (const ttl of [1e-9, 0.5, -1, 0, Number.NaN, 1.5]) {
    t.equal(
      errorOf(await gate.call(gctx({ workflow_step_id: `ttl-${ttl}` }), 'send_email', mail, { ttl_s: ttl })),
      'invalid_request',
      `ttl_s ${ttl}`,
    );
  }
  t.equal(await count(pool, "actionledger.gate_audit WHERE outcome = 'internal'"), 0, 'no internal refusal audited');
});

t.test("approve without resolvers changes nothing; execute needs an approver's role", async (t) => {
  const { gate, pool, config, ledger } = await gateFixture(t);
  const id = requestId(await gate.call(editor(), 'update_document', publish));
  const view = await gate.approvals.show(id, { tenant_id: 'tenant-a' });
  const cli = new Gate({ config, pool, ledger, withoutValidators: true, withoutResolvers: true });
  t.equal(errorOf(await cli.approve(id, view.envelope_sha256, reviewer('supervisor-1'))), 'config_invalid');
  const row = (
    await pool.query<{ status: string; approvers: string[] }>(
      'SELECT status, approvers FROM actionledger.gate_approvals WHERE approval_id = $1',
      [id],
    )
  ).rows[0];
  t.same(row, { status: 'pending', approvers: [] }, 'the approval was not recorded');

  // An approved approval, not yet executed (kill switch), then executed by someone without an approver role.
  await gate.engageKillSwitch('tenant-a', 'update_document', 'sre', 'incident');
  t.equal(errorOf(await gate.approve(id, view.envelope_sha256, reviewer('supervisor-1'))), 'tool_disabled');
  await gate.liftKillSwitch('tenant-a', 'update_document', 'sre');
  t.equal(
    errorOf(await gate.approvals.execute(id, { tenant_id: 'tenant-a', principal_id: 'agent-1', role: 'agent' })),
    'permission_denied',
  );
  t.equal(await count(pool, 'actionledger.operations'), 0, 'nothing reserved');
  t.equal((await gate.approvals.execute(id, reviewer('supervisor-2'))).ok, true, 'an approver may execute it');
});
