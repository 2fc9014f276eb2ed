/**
 * The gate's view of identity: the tenant is part of the operation identity, and every trusted-context field
 * is an NFC identifier (core/identifier.ts). Real PostgreSQL, the example gate configuration.
 */
import t from 'tap';
import { auditRows, count, gateFixture, gctx, reviewer } from '../helpers/gate.js';

const transfer = (amount = 10) => ({ to_account: 'ACC0000000002', amount });

t.test('one step in two tenants: two operations; a replay in one tenant is the same one', async (t) => {
  const { gate } = await gateFixture(t);
  const a = await gate.call(gctx(), 'transfer_funds', transfer());
  const b = await gate.call(gctx({ tenant_id: 'tenant-b', account_id: 'acct-b' }), 'transfer_funds', transfer());
  if (!a.ok || !b.ok) throw new Error(JSON.stringify([a, b]));
  t.equal(a.created, true);
  t.equal(b.created, true);
  t.not(a.operation_id, b.operation_id, 'different operation ids');
  t.not(a.effect_key, b.effect_key, 'different effect keys');
  const replay = await gate.call(gctx({ turn_id: 'turn-2' }), 'transfer_funds', transfer());
  t.match(replay, { ok: true, operation_id: a.operation_id, effect_key: a.effect_key, created: false });
  const conflict = await gate.call(gctx({ turn_id: 'turn-3' }), 'transfer_funds', transfer(11));
  t.match(conflict, { ok: false, error: 'operation_conflict' }, 'other arguments for the same step still conflict');
});

t.test('composed and decomposed names are one identity through the gate', async (t) => {
  const { gate, pool } = await gateFixture(t);
  const composed = gctx({ principal_id: 'jos\u00e9', task_id: 't\u00e9che', workflow_step_id: '\u00e9tape' });
  const decomposed = gctx({ principal_id: 'jose\u0301', task_id: 'te\u0301che', workflow_step_id: 'e\u0301tape' });
  const first = await gate.call(composed, 'transfer_funds', transfer());
  const second = await gate.call({ ...decomposed, turn_id: 'turn-2' }, 'transfer_funds', transfer());
  if (!first.ok) throw new Error(JSON.stringify(first));
  t.match(second, { ok: true, operation_id: first.operation_id, created: false }, 'the same operation');
  t.equal(await count(pool, 'actionledger.operations'), 1);
  t.equal(
    await count(pool, "actionledger.gate_audit WHERE action = 'call' AND principal_id = $1", ['jos\u00e9']),
    2,
    'both calls are audited under the NFC name',
  );
  await gate.revokeRole('tenant-a', 'jose\u0301', 'agent', 'security');
  t.match(
    await gate.call({ ...composed, workflow_step_id: 'other' }, 'transfer_funds', transfer()),
    { ok: false, error: 'permission_denied' },
    'a revocation named in the decomposed spelling reaches the composed one',
  );
});

t.test('context fields that hide what they say are refused as values, naming the field', async (t) => {
  const { gate, pool } = await gateFixture(t);
  const bad: [string, string, string][] = [
    ['zero-width space', 'principal_id', 'agent\u200b1'],
    ['right-to-left override', 'role', 'agent\u202e'],
    ['byte-order mark', 'tenant_id', '\ufefftenant-a'],
    ['NUL', 'account_id', 'acct\u00001'],
    ['only whitespace', 'task_id', '   '],
    ['lone surrogate', 'workflow_step_id', 'step\udc00'],
    ['zero-width joiner', 'trace_id', 'trace\u200d'],
    ['plan version with a bidi isolate', 'plan_version', 'v1\u2066'],
  ];
  for (const [name, field, value] of bad) {
    const r = await gate.call(gctx({ [field]: value }), 'transfer_funds', transfer());
    t.match(
      r,
      { ok: false, error: 'invalid_context', message: new RegExp(`\\b${field}\\b`), details: { field } },
      `${name} in ${field}`,
    );
  }
  t.equal(await count(pool, 'actionledger.operations'), 0, 'nothing reserved');
  const audited = await auditRows(pool, "action = 'call'");
  t.equal(audited.length, bad.length, 'every refusal is audited');
  t.ok(
    audited.every((r) => r.outcome === 'invalid_context'),
    'as invalid_context',
  );
});

t.test('an approver is an identifier too: another spelling of the requester cannot approve', async (t) => {
  const { gate } = await gateFixture(t);
  const held = await gate.call(gctx({ principal_id: 'jos\u00e9', role: 'editor' }), 'update_document', {
    document_id: 'DOC-1',
    status: 'published',
  });
  if (held.ok || held.request_id === undefined) throw new Error(JSON.stringify(held));
  const view = await gate.approvals.show(held.request_id, { tenant_id: 'tenant-a' });
  t.match(
    await gate.approve(held.request_id, view.envelope_sha256, reviewer('jose\u0301')),
    { ok: false, error: 'self_approval_forbidden' },
    'the decomposed spelling of the requester is the requester',
  );
  t.match(await gate.approve(held.request_id, view.envelope_sha256, reviewer('super\u200bvisor-1')), {
    ok: false,
    error: 'invalid_context',
    details: { field: 'principal_id' },
  });
  t.match(await gate.approve(held.request_id, view.envelope_sha256, reviewer('supervisor-1')), {
    ok: true,
    status: 'reserved',
  });
});
