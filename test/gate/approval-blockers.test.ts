/**
 * `gate.approvals.blockers(id, caller)`: why a person cannot approve an approval now, read without writing. An
 * approver of a fresh approval has none; the requester, a second vote, a role that decides nothing or was
 * revoked, a final, expired, switched-off, stale or already approved approval and an envelope that does not
 * hash to its record each give their code, message and details, and approving is then refused with that code.
 * Hidden characters are a requirement, not a blocker. Another tenant's approval is `not_found`.
 */
import t from 'tap';
import type { ApprovalCaller, Gate, GateResult } from '../../gate/index.js';
import { count, gateFixture, gctx, reviewer } from '../helpers/gate.js';

const editor = (over = {}) => gctx({ principal_id: 'editor-1', role: 'editor', ...over });
const publish = { document_id: 'DOC-1', status: 'published' };
const sup = (principal = 'supervisor-1', roles = ['supervisor']): ApprovalCaller => ({
  tenant_id: 'tenant-a',
  principal_id: principal,
  roles,
});

function pending(r: GateResult): string {
  if (r.ok || r.error !== 'approval_required' || r.request_id === undefined)
    throw new Error(`expected approval_required, got ${JSON.stringify(r)}`);
  return r.request_id;
}

const request = async (gate: Gate, step: string, args: unknown = publish) =>
  pending(await gate.call(editor({ workflow_step_id: step }), 'update_document', args));
const codes = async (gate: Gate, id: string, caller: ApprovalCaller) =>
  (await gate.approvals.blockers(id, caller)).map((b) => b.code);

t.test('an approver of a fresh approval has none, and approving succeeds', async (t) => {
  const { gate, pool } = await gateFixture(t);
  const id = await request(gate, 's-fresh');
  const before = await count(pool, 'actionledger.gate_audit');
  t.same(await gate.approvals.blockers(id, sup()), []);
  t.equal(await count(pool, 'actionledger.gate_audit'), before, 'read only: not even an audit row');
  const view = await gate.approvals.show(id, { tenant_id: 'tenant-a' });
  t.match(await gate.approve(id, view.envelope_sha256, reviewer('supervisor-1')), { ok: true, status: 'reserved' });
  t.match(await gate.approvals.blockers(id, sup('supervisor-2')), [
    { code: 'invalid_state_transition', message: 'this approval is executed', details: { status: 'executed' } },
  ]);
});

t.test('the person: the requester, a second vote, no approver role, a revoked one', async (t) => {
  const { gate } = await gateFixture(t);
  const id = await request(gate, 's-person');
  t.same(await gate.approvals.blockers(id, { tenant_id: 'tenant-a', principal_id: 'editor-1', roles: ['editor'] }), [
    {
      code: 'self_approval_forbidden',
      message: 'you asked for this yourself (as editor-1): another approver must decide it',
      details: { reason: 'requester', requester_id: 'editor-1' },
    },
    {
      code: 'permission_denied',
      message: 'your roles in tenant-a (editor) may not decide update_document; it needs one of: supervisor',
      details: { roles: ['editor'], approver_roles: ['supervisor'] },
    },
  ]);
  t.same(await codes(gate, id, sup('editor-1', ['editor', 'supervisor'])), ['self_approval_forbidden']);

  const two = pending(
    await gate.call(gctx({ principal_id: 'admin-1', role: 'admin', workflow_step_id: 's-two' }), 'delete_customer', {
      customer_id: 'C-1',
    }),
  );
  const hash = (await gate.approvals.show(two, { tenant_id: 'tenant-a' })).envelope_sha256;
  t.match(await gate.approve(two, hash, reviewer('supervisor-1')), { ok: true, status: 'pending_approvals' });
  t.match(await gate.approvals.blockers(two, sup()), [
    { code: 'self_approval_forbidden', details: { reason: 'already_approved' } },
  ]);
  t.match(await gate.approve(two, hash, reviewer('supervisor-1')), { ok: false, error: 'self_approval_forbidden' });
  t.same(await codes(gate, two, sup('supervisor-2')), [], 'another approver may');

  await gate.revokeRole('tenant-a', 'supervisor-2', 'supervisor', 'test');
  t.same(await codes(gate, two, sup('supervisor-2')), ['permission_denied'], 'a revoked approver role decides nothing');
  t.match(await gate.approve(two, hash, reviewer('supervisor-2')), { ok: false, error: 'permission_denied' });
});

t.test('the approval: switched off, stale, expired, final', async (t) => {
  const { gate, pool } = await gateFixture(t);
  const id = await request(gate, 's-state');
  await gate.engageKillSwitch('tenant-a', 'update_document', 'ops', 'incident 7');
  t.same(await gate.approvals.blockers(id, sup()), [
    {
      code: 'tool_disabled',
      message: 'a kill switch holds update_document (incident 7)',
      details: { reason: 'incident 7' },
    },
  ]);
  await gate.liftKillSwitch('tenant-a', 'update_document', 'ops');

  await pool.query("UPDATE shop.documents SET version = 8 WHERE doc_id = 'DOC-1'");
  t.same(await gate.approvals.blockers(id, sup()), [
    {
      code: 'reapproval_required',
      message: 'what this approval binds no longer holds (stale_resource); the requester must ask again',
      details: {
        reason: 'stale_resource',
        resources: [{ type: 'document', id: 'DOC-1', approved_version: '7', current_version: '8' }],
      },
    },
  ]);
  const hash = (await gate.approvals.show(id, { tenant_id: 'tenant-a' })).envelope_sha256;
  t.match(await gate.approve(id, hash, reviewer('supervisor-1')), { ok: false, error: 'reapproval_required' });
  t.match(await gate.approvals.blockers(id, sup()), [
    { code: 'invalid_state_transition', details: { status: 'invalidated', reason: 'stale_resource' } },
  ]);
  await pool.query("UPDATE shop.documents SET version = 7 WHERE doc_id = 'DOC-1'");

  const late = await request(gate, 's-late');
  await pool.query(
    `UPDATE actionledger.gate_approvals SET created_at = now() - interval '2 hours', expires_at = now() - interval '1 hour'
     WHERE approval_id = $1`,
    [late],
  );
  t.same(await codes(gate, late, sup()), ['approval_expired']);
  t.equal(
    (
      await pool.query<{ status: string }>('SELECT status FROM actionledger.gate_approvals WHERE approval_id = $1', [
        late,
      ])
    ).rows[0]?.status,
    'pending',
    'reading the blockers writes nothing, not even the expiry',
  );
});

t.test('approved already and waiting to be executed is a blocker of its own', async (t) => {
  const { gate, pool } = await gateFixture(t);
  const id = await request(gate, 's-approved');
  await pool.query("UPDATE actionledger.gate_approvals SET status = 'approved' WHERE approval_id = $1", [id]);
  t.match(await gate.approvals.blockers(id, sup()), [
    { code: 'invalid_state_transition', details: { status: 'approved' } },
  ]);
});

t.test('an envelope that does not hash to its record cannot be approved', async (t) => {
  const { gate, pool } = await gateFixture(t);
  const id = await request(gate, 's-hash');
  await pool.query(
    `UPDATE actionledger.gate_approvals SET envelope_json = jsonb_set(envelope_json, '{effect}', '"something else"')
     WHERE approval_id = $1`,
    [id],
  );
  t.match(await gate.approvals.blockers(id, sup()), [
    { code: 'approval_hash_mismatch', details: { recorded: /^[0-9a-f]{64}$/, computed: /^[0-9a-f]{64}$/ } },
  ]);
});

t.test('hidden characters are a requirement, not a blocker; other tenants see nothing', async (t) => {
  const note = { type: 'string', maxLength: 200 };
  const { gate } = await gateFixture(t, {
    gate: {
      tools: {
        issue_refund: {
          schema: {
            type: 'object',
            additionalProperties: false,
            required: ['order_id', 'amount', 'currency'],
            properties: {
              order_id: { type: 'string', pattern: '^O-[0-9]{1,10}$' },
              amount: { type: 'number', exclusiveMinimum: 0, maximum: 10000 },
              currency: { type: 'string', enum: ['GBP'] },
              note,
            },
          },
          limits: { per_conversation: { max_count: 10, max_value: 5000 } },
        },
      },
    },
  });
  const id = pending(
    await gate.call(gctx({ workflow_step_id: 's-hidden' }), 'issue_refund', {
      order_id: 'O-1',
      amount: 900,
      currency: 'GBP',
      note: 'refund of \u202e0057\u202c GBP',
    }),
  );
  t.same(await gate.approvals.blockers(id, sup()), [], 'no blocker');
  const hash = (await gate.approvals.show(id, { tenant_id: 'tenant-a' })).envelope_sha256;
  t.match(
    await gate.approve(id, hash, reviewer('supervisor-1')),
    { ok: false, error: 'hidden_characters' },
    'but approving takes the acknowledgement',
  );
  await t.rejects(gate.approvals.blockers(id, { ...sup(), tenant_id: 'tenant-b' }), { code: 'not_found' });
  await t.rejects(gate.approvals.blockers('not-a-uuid', sup()), { code: 'not_found' });
});
