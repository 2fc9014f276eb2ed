/**
 * Approval by another person: the envelope and its hash, approve by id AND displayed hash,
 * four eyes and N distinct approvers, concurrent approvers, reject and expiry final, dynamic checks and
 * resource versions re-run on approval, plan version invalidation, and the operation identity surviving a
 * re-approval of the same step. Effects are read from the database.
 */
import t from 'tap';
import { canonicalJson, sha256Hex } from '../../core/json.js';
import type { Gate, GateResult } from '../../gate/index.js';
import { auditRows, count, gateFixture, gctx, reviewer } from '../helpers/gate.js';

const editor = (over = {}) => gctx({ principal_id: 'editor-1', role: 'editor', ...over });
const publish = { document_id: 'DOC-1', status: 'published' };

function pending(r: GateResult): string {
  if (r.ok || r.error !== 'approval_required' || r.request_id === undefined)
    throw new Error(`expected approval_required, got ${JSON.stringify(r)}`);
  return r.request_id;
}

async function requestAndShow(
  gate: Gate,
  ctx = editor(),
  tool = 'update_document',
  args: unknown = publish,
): Promise<{ id: string; hash: string }> {
  const id = pending(await gate.call(ctx, tool, args));
  const view = await gate.approvals.show(id, { tenant_id: 'tenant-a' });
  return { id, hash: view.envelope_sha256 };
}

const status = async (pool: import('../../db/db.js').Pool, id: string) =>
  (await pool.query('SELECT status, reason FROM actionledger.gate_approvals WHERE approval_id = $1', [id])).rows[0] as {
    status: string;
    reason: string | null;
  };

t.test(
  'an approval actually succeeds (the transposed-arguments bug), bound to the envelope the approver saw',
  async (t) => {
    const { gate, pool } = await gateFixture(t);
    const id = pending(await gate.call(editor(), 'update_document', publish));
    t.equal(await count(pool, 'actionledger.operations'), 0, 'nothing reserved while pending');
    const view = await gate.approvals.show(id, { tenant_id: 'tenant-a' });
    t.match(view.envelope, {
      approval_id: id,
      requester: { tenant_id: 'tenant-a', principal_id: 'editor-1', role: 'editor' },
      tool: 'update_document',
      arguments: publish,
      resources: [{ type: 'document', id: 'DOC-1', version: '7' }],
      policy_version: 'gate-policy-1',
      effect: 'Set document DOC-1 to published',
    });
    t.equal(
      view.envelope_sha256,
      sha256Hex(canonicalJson(view.envelope)),
      'the hash is the sha256 of the canonical envelope',
    );
    const e = view.envelope as { created_at: string; expires_at: string };
    t.equal(Date.parse(e.expires_at) - Date.parse(e.created_at), 300_000, 'irreversible tool: 300 s by default');

    t.match(
      await gate.approve('supervisor-1', id, reviewer('supervisor-1')),
      { ok: false, error: 'not_found' },
      'transposed arguments fail loudly, not silently',
    );
    const r = await gate.approve(id, view.envelope_sha256, reviewer('supervisor-1'));
    t.match(r, { ok: true, status: 'reserved', created: true, request_id: id }, 'the approval succeeds and reserves');
    const op = (
      await pool.query(
        'SELECT operation_id, current_approval_id, current_policy_version, arguments_json, principal_id FROM actionledger.operations',
      )
    ).rows;
    t.equal(op.length, 1, 'one operation');
    t.match(op[0], {
      current_approval_id: id,
      current_policy_version: 'gate-policy-1',
      arguments_json: publish,
      principal_id: 'editor-1',
    });
    t.same(await status(pool, id), { status: 'executed', reason: null });
    t.same(
      (await pool.query<{ approvers: string[] }>('SELECT approvers FROM actionledger.gate_approvals')).rows[0]
        ?.approvers,
      ['supervisor-1'],
    );
    t.same(
      (await auditRows(pool, 'subject_id = $1', [id])).map((a) => [a.action, a.outcome]),
      [
        ['call', 'approval_required'],
        ['approve', 'approved'],
        ['execute', 'reserved'],
      ],
    );
    t.match(
      await gate.approve(id, view.envelope_sha256, reviewer('supervisor-2')),
      { ok: false, error: 'invalid_state_transition' },
      'single use',
    );
    t.equal(await count(pool, 'actionledger.operations'), 1);
  },
);

t.test('self-approval, an approver without the role, and a stale displayed hash are refused', async (t) => {
  const { gate, pool } = await gateFixture(t);
  const { id, hash } = await requestAndShow(gate);
  t.match(
    await gate.approve(id, hash, reviewer('editor-1')),
    { ok: false, error: 'self_approval_forbidden' },
    'the requester never approves, even holding an approver role',
  );
  t.match(await gate.approve(id, hash, reviewer('agent-5', { role: 'agent' })), {
    ok: false,
    error: 'permission_denied',
  });
  t.match(
    await gate.approve(id, hash, reviewer('supervisor-1', { tenant_id: 'tenant-b' })),
    { ok: false, error: 'not_found' },
    'another tenant sees nothing',
  );
  const stale = sha256Hex('the envelope I was shown last week');
  t.match(await gate.approve(id, stale, reviewer('supervisor-1')), { ok: false, error: 'approval_hash_mismatch' });
  t.same(await status(pool, id), { status: 'pending', reason: null }, 'still pending after every refusal');
  t.same(
    (await pool.query<{ approvers: string[] }>('SELECT approvers FROM actionledger.gate_approvals')).rows[0]?.approvers,
    [],
    'no vote recorded',
  );
  t.equal(await count(pool, 'actionledger.operations'), 0);
  t.match(
    await gate.approve(id, hash, reviewer('supervisor-1')),
    { ok: true, status: 'reserved' },
    'the right person with the right hash',
  );
  t.same(
    (await auditRows(pool, "action = 'approve'")).map((a) => a.outcome),
    ['self_approval_forbidden', 'permission_denied', 'not_found', 'approval_hash_mismatch', 'approved'],
  );
});

t.test('two approvers approving at once: one wins, one operation', async (t) => {
  const { gate, pool } = await gateFixture(t);
  for (let round = 0; round < 5; round++) {
    const { id, hash } = await requestAndShow(gate, editor({ workflow_step_id: `race-${round}` }));
    const rs = await Promise.all([
      gate.approve(id, hash, reviewer('supervisor-1')),
      gate.approve(id, hash, reviewer('supervisor-2')),
    ]);
    t.equal(rs.filter((r) => r.ok).length, 1, `round ${round}: exactly one wins`);
    t.same(
      rs.filter((r) => !r.ok).map((r) => (r.ok ? '' : r.error)),
      ['invalid_state_transition'],
    );
    t.equal(
      (
        await pool.query<{ n: number }>(
          'SELECT cardinality(approvers) AS n FROM actionledger.gate_approvals WHERE approval_id = $1',
          [id],
        )
      ).rows[0]?.n,
      1,
    );
  }
  t.equal(await count(pool, 'actionledger.operations'), 5, 'one operation per approval');
});

t.test('N distinct approvers: the same person never counts twice', async (t) => {
  const { gate, pool } = await gateFixture(t);
  const { id, hash } = await requestAndShow(gate, gctx({ principal_id: 'admin-1', role: 'admin' }), 'delete_customer', {
    customer_id: 'C-1',
  });
  t.match(await gate.approve(id, hash, reviewer('supervisor-1')), { ok: true, status: 'pending_approvals' });
  t.equal(await count(pool, 'actionledger.operations'), 0, 'one approval of two reserves nothing');
  t.match(await gate.approve(id, hash, reviewer('supervisor-1')), { ok: false, error: 'self_approval_forbidden' });
  t.match(await gate.approve(id, hash, reviewer('supervisor-2')), { ok: true, status: 'reserved' });
  t.same((await pool.query('SELECT approvers, status FROM actionledger.gate_approvals')).rows[0], {
    approvers: ['supervisor-1', 'supervisor-2'],
    status: 'executed',
  });
});

t.test('document at version 7 approved, changed to 8 before execution: reapproval_required, untouched', async (t) => {
  const { gate, pool } = await gateFixture(t);
  const { id, hash } = await requestAndShow(gate);
  // Approved while the tool is switched off: the approval stands, execution waits.
  await gate.engageKillSwitch('tenant-a', 'update_document', 'oncall', 'maintenance');
  t.match(await gate.approve(id, hash, reviewer('supervisor-1')), { ok: false, error: 'tool_disabled' });
  t.same(await status(pool, id), { status: 'approved', reason: null });
  await pool.query("UPDATE shop.documents SET version = 8, status = 'archived' WHERE doc_id = 'DOC-1'");
  await gate.liftKillSwitch('tenant-a', 'update_document', 'oncall');
  const r = await gate.approvals.execute(id, reviewer('supervisor-1'));
  t.match(r, {
    ok: false,
    error: 'reapproval_required',
    details: { reason: 'stale_resource', resources: [{ id: 'DOC-1', approved_version: '7', current_version: '8' }] },
  });
  t.equal(await count(pool, 'actionledger.operations'), 0, 'nothing reserved');
  t.same(
    (await pool.query("SELECT version, status FROM shop.documents WHERE doc_id = 'DOC-1'")).rows[0],
    { version: 8, status: 'archived' },
    'the document is untouched',
  );
  t.same(await status(pool, id), { status: 'invalidated', reason: 'stale_resource' });
  t.match(
    await gate.approvals.execute(id, reviewer('supervisor-1')),
    { ok: false, error: 'invalid_state_transition' },
    'never executable again',
  );
  // A fresh request binds version 8 and goes through.
  const again = await requestAndShow(gate, editor({ workflow_step_id: 'step-2' }));
  t.match(await gate.approve(again.id, again.hash, reviewer('supervisor-1')), { ok: true, status: 'reserved' });
});

t.test('permission revoked after the request: reapproval_required on approval, nothing reserved', async (t) => {
  const { gate, pool } = await gateFixture(t);
  const { id, hash } = await requestAndShow(gate);
  await gate.revokeRole('tenant-a', 'editor-1', 'editor', 'security');
  t.match(await gate.approve(id, hash, reviewer('supervisor-1')), {
    ok: false,
    error: 'reapproval_required',
    details: { reason: 'permission_denied' },
  });
  t.equal(await count(pool, 'actionledger.operations'), 0);
  t.match(
    await gate.call(editor({ workflow_step_id: 'x' }), 'update_document', publish),
    { ok: false, error: 'permission_denied' },
    'new calls refused too',
  );
});

t.test('TTL passed: expired, final, never revivable; reject is final with its reason; both release caps', async (t) => {
  const { gate, pool } = await gateFixture(t, {
    gate: {
      tools: {
        update_document: { approval: { mode: 'always', ttl_s: 1 } },
        issue_refund: { limits: { per_conversation: { max_value: 5000 } } },
      },
    },
  });
  const { id, hash } = await requestAndShow(gate);
  await new Promise((r) => setTimeout(r, 1200));
  t.match(await gate.approve(id, hash, reviewer('supervisor-1')), { ok: false, error: 'approval_expired' });
  t.same(await status(pool, id), { status: 'expired', reason: null });
  t.match(
    await gate.approve(id, hash, reviewer('supervisor-2')),
    { ok: false, error: 'approval_expired' },
    'and stays expired',
  );
  await t.rejects(
    pool.query(
      "UPDATE actionledger.gate_approvals SET status = 'pending', expires_at = now() + interval '1 hour' WHERE approval_id = $1",
      [id],
    ),
    /final/,
    'not even SQL revives it',
  );
  t.equal(await count(pool, 'actionledger.operations'), 0);

  const big = pending(
    await gate.call(gctx({ workflow_step_id: 'big' }), 'issue_refund', {
      order_id: 'O-3',
      amount: 600,
      currency: 'GBP',
    }),
  );
  const capUsed = async () =>
    (
      await pool.query<{ used_value: string }>(
        "SELECT used_value::text FROM actionledger.gate_counters WHERE scope = 'conversation'",
      )
    ).rows[0]?.used_value;
  t.equal(await capUsed(), '600', 'the pending approval holds its value');
  t.match(
    await gate.reject(big, reviewer('supervisor-1'), ''),
    { ok: false, error: 'invalid_request' },
    'a reason is required',
  );
  t.match(await gate.reject(big, reviewer('supervisor-1'), 'customer already compensated'), {
    ok: true,
    status: 'rejected',
  });
  t.same(await status(pool, big), { status: 'rejected', reason: 'customer already compensated' });
  t.equal(await capUsed(), '0', 'released on rejection');
  const view = await gate.approvals.show(big, { tenant_id: 'tenant-a' });
  t.match(
    await gate.approve(big, view.envelope_sha256, reviewer('supervisor-2')),
    { ok: false, error: 'invalid_state_transition' },
    'rejected is final',
  );

  const late = pending(
    await gate.call(gctx({ workflow_step_id: 'late' }), 'issue_refund', {
      order_id: 'O-4',
      amount: 700,
      currency: 'GBP',
    }),
  );
  await pool.query(
    "UPDATE actionledger.gate_approvals SET expires_at = created_at + interval '1 millisecond' WHERE approval_id = $1",
    [late],
  );
  t.equal(await gate.approvals.expireDue(), 1, 'the sweep expires it');
  t.equal(await capUsed(), '0', 'released on expiry');
  t.equal((await auditRows(pool, "action = 'expire'")).length, 1);
});

t.test('a changed plan version invalidates the approval', async (t) => {
  const { gate, pool } = await gateFixture(t);
  const { id, hash } = await requestAndShow(gate, editor({ plan_version: 'plan-4' }));
  t.equal(
    (
      await pool.query<{ v: string }>('SELECT envelope_json->>$1 AS v FROM actionledger.gate_approvals', [
        'plan_version',
      ])
    ).rows[0]?.v,
    'plan-4',
    'bound into the envelope',
  );
  // The workflow replans: the next call of this task carries plan 5.
  const next = pending(
    await gate.call(editor({ plan_version: 'plan-5', workflow_step_id: 'other' }), 'update_document', {
      document_id: 'DOC-1',
      status: 'reviewed',
    }),
  );
  t.same(await status(pool, id), { status: 'invalidated', reason: 'plan_changed' });
  t.match(
    await auditRows(pool, "action = 'invalidate'"),
    [{ outcome: 'plan_changed', subject_id: id }],
    'the invalidation is audited',
  );
  t.match(await gate.approve(id, hash, reviewer('supervisor-1')), { ok: false, error: 'invalid_state_transition' });
  t.equal(await count(pool, "actionledger.operations WHERE tool_name = 'update_document'"), 0);
  t.same(await status(pool, next), { status: 'pending', reason: null }, 'the request under the new plan stands');
});

t.test('a re-approval of the same step keeps the operation identity and effect key', async (t) => {
  const { gate, pool } = await gateFixture(t, {
    gate: { tools: { issue_refund: { limits: { per_conversation: { max_value: 5000 } } } } },
  });
  const args = { order_id: 'O-5', amount: 800, currency: 'GBP' };
  const first = pending(await gate.call(gctx({ workflow_step_id: 'refund-big' }), 'issue_refund', args));
  const v1 = await gate.approvals.show(first, { tenant_id: 'tenant-a' });
  const r1 = await gate.approve(first, v1.envelope_sha256, reviewer('supervisor-1'));
  const second = pending(
    await gate.call(gctx({ workflow_step_id: 'refund-big', turn_id: 'turn-9' }), 'issue_refund', args),
  );
  const v2 = await gate.approvals.show(second, { tenant_id: 'tenant-a' });
  const r2 = await gate.approve(second, v2.envelope_sha256, reviewer('supervisor-2'));
  t.match(r1, { ok: true, created: true });
  t.match(r2, { ok: true, created: false });
  t.equal(
    r1.ok && r2.ok && r1.operation_id === r2.operation_id && r1.effect_key === r2.effect_key,
    true,
    'same operation id and effect key',
  );
  const op = (await pool.query('SELECT current_approval_id FROM actionledger.operations')).rows;
  t.same(op, [{ current_approval_id: second }], 'the pending operation now carries the new approval');
  t.equal(
    (
      await pool.query<{ used_value: string }>(
        "SELECT used_value::text FROM actionledger.gate_counters WHERE scope = 'conversation'",
      )
    ).rows[0]?.used_value,
    '800',
    'counted once',
  );
});
