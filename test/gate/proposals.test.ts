/**
 * Confirmation by the user: token returned once and stored only as its sha256, same-turn refusal,
 * replayed confirm, TTL = min(requested, configured) with lazy, final expiry, cancel, idempotent execute from
 * the stored proposal, the $10 -> $10,000 params_mismatch, and a proposal that only its own principal
 * confirms, executes or cancels (anyone else: proposal_not_found, as for an unknown one).
 */
import t from 'tap';
import { sha256Hex } from '../../core/json.js';
import type { GateResult } from '../../gate/index.js';
import { auditRows, count, gateFixture, gctx } from '../helpers/gate.js';

const confirmRefunds = { gate: { tools: { issue_refund: { approval: { mode: 'confirm' } } } } };
const email = { to: 'customer@example.com', subject: 'Your refund', body: 'private words' };

function held(r: GateResult): { id: string; token: string } {
  if (r.ok || r.error !== 'confirmation_required' || r.request_id === undefined || r.confirm_token === undefined)
    throw new Error(`expected confirmation_required, got ${JSON.stringify(r)}`);
  return { id: r.request_id, token: r.confirm_token };
}

t.test('propose -> confirm next turn -> execute; token stored only as its sha256; execute is idempotent', async (t) => {
  const { gate, pool } = await gateFixture(t);
  const p = held(await gate.call(gctx(), 'send_email', email));
  t.equal(await count(pool, 'actionledger.operations'), 0, 'nothing reserved by a proposal');
  const row = (
    await pool.query<{ arguments_json: Record<string, unknown>; text: string; token_sha256: string }>(
      'SELECT p::text AS text, token_sha256, status, arguments_json FROM actionledger.gate_proposals p',
    )
  ).rows[0]!;
  t.equal(row.token_sha256, sha256Hex(p.token));
  t.notMatch(row.text, p.token, 'the raw token is not stored anywhere in the row');
  t.same(row.arguments_json, email, 'the exact arguments are stored');
  t.notMatch(
    JSON.stringify((await pool.query('SELECT * FROM actionledger.gate_audit')).rows),
    p.token,
    'nor in the audit log',
  );

  t.match(await gate.confirm(p.token, gctx({ turn_id: 'turn-2' })), {
    ok: true,
    status: 'confirmed',
    request_id: p.id,
  });
  const first = await gate.executeProposal(p.id, gctx({ turn_id: 'turn-2' }));
  const again = await gate.executeProposal(p.id, gctx({ turn_id: 'turn-3' }));
  t.match(first, { ok: true, status: 'reserved', created: true });
  t.match(again, { ok: true, status: 'reserved', created: false });
  t.equal(
    first.ok && again.ok && first.operation_id === again.operation_id && first.effect_key === again.effect_key,
    true,
    'the same operation',
  );
  t.equal(await count(pool, 'actionledger.operations'), 1);
  const op = (
    await pool.query<{ arguments_json: Record<string, unknown>; current_approval_id: string | null }>(
      'SELECT arguments_json, current_approval_id, current_policy_version FROM actionledger.operations',
    )
  ).rows[0]!;
  t.same(op.arguments_json, email, 'the payload is the stored proposal');
  t.equal(op.current_approval_id, `proposal:${p.id}`);
  t.same(
    (await auditRows(pool, "action IN ('confirm','execute')")).map((r) => [r.action, r.outcome]),
    [
      ['confirm', 'confirmed'],
      ['execute', 'reserved'],
      ['execute', 'reserved'],
    ],
  );
});

t.test('replayed confirm, same-turn confirm, unknown and other-tenant tokens', async (t) => {
  const { gate, pool } = await gateFixture(t);
  const p = held(await gate.call(gctx(), 'send_email', email));
  t.match(
    await gate.confirm(p.token, gctx()),
    { ok: false, error: 'proposal_same_turn_confirm' },
    'same user turn refused',
  );
  t.equal(
    (await pool.query<{ status: string }>('SELECT status FROM actionledger.gate_proposals')).rows[0]?.status,
    'proposed',
    'still proposed',
  );
  t.match(await gate.confirm('not-a-token', gctx({ turn_id: 'turn-2' })), { ok: false, error: 'proposal_not_found' });
  const otherTenant = await gate.confirm(p.token, gctx({ tenant_id: 'tenant-b', turn_id: 'turn-2' }));
  t.same(
    otherTenant,
    await gate.confirm('not-a-token', gctx({ turn_id: 'turn-2' })),
    'other tenant looks exactly like unknown',
  );
  const otherPrincipal = await gate.confirm(p.token, gctx({ turn_id: 'turn-2', principal_id: 'agent-2' }));
  t.same(
    otherPrincipal,
    await gate.confirm('not-a-token', gctx({ turn_id: 'turn-2' })),
    "another principal of the tenant is refused exactly like an unknown token: it is not that principal's",
  );
  t.match(
    await gate.confirm(p.token, gctx({ turn_id: 'turn-2' })),
    { ok: true, status: 'confirmed' },
    'its own principal confirms',
  );
  t.equal(
    (await pool.query<{ actor_mismatch: boolean }>('SELECT actor_mismatch FROM actionledger.gate_proposals')).rows[0]
      ?.actor_mismatch,
    false,
    'the confirmer is always the proposer',
  );
  t.match(
    await gate.confirm(p.token, gctx({ turn_id: 'turn-3' })),
    { ok: false, error: 'invalid_state_transition' },
    'a replayed confirm is refused',
  );
  t.equal(await count(pool, 'actionledger.operations'), 0, 'confirming reserves nothing');
  t.same(
    (await auditRows(pool, "action = 'confirm'")).map((r) => r.outcome),
    [
      'proposal_same_turn_confirm',
      'proposal_not_found',
      'proposal_not_found',
      'proposal_not_found',
      'proposal_not_found',
      'proposal_not_found',
      'confirmed',
      'invalid_state_transition',
    ],
  );
});

t.test("another principal of the tenant cannot confirm, execute or cancel a principal's proposal", async (t) => {
  const { gate, pool } = await gateFixture(t);
  const mine = (over = {}) => gctx({ task_id: 'refund-42', ...over });
  const theirs = (over = {}) => mine({ principal_id: 'agent-2', turn_id: 'turn-2', ...over });
  const unknown = 'no such proposal';
  const state = async (id: string) =>
    (
      await pool.query<{ status: string; confirmed_by: string | null; ended_at: Date | null }>(
        'SELECT status, confirmed_by, ended_at FROM actionledger.gate_proposals WHERE proposal_id = $1',
        [id],
      )
    ).rows[0];
  const notFound = { ok: false, error: 'proposal_not_found', message: unknown };
  const random = '6f1c2b9e-0d4a-4c52-9a57-3e0f1b2c4d5e';

  const p = held(await gate.call(mine(), 'send_email', email));
  t.same(await gate.confirm(p.token, theirs()), notFound, 'confirm: as for an unknown token');
  t.same(await gate.cancelProposal(p.id, theirs()), notFound, 'cancel while proposed: as for an unknown id');
  t.same(await gate.cancelProposal(random, theirs()), notFound, 'the unknown id it looks like');
  t.same(await state(p.id), { status: 'proposed', confirmed_by: null, ended_at: null }, 'untouched');

  t.match(await gate.confirm(p.token, mine({ turn_id: 'turn-2' })), { ok: true, status: 'confirmed' });
  t.same(await gate.executeProposal(p.id, theirs()), notFound, 'execute: as for an unknown id');
  t.same(await gate.cancelProposal(p.id, theirs()), notFound, 'cancel while confirmed');
  t.same(await gate.executeProposal(p.id, theirs({ tenant_id: 'tenant-b', principal_id: 'agent-1' })), notFound);
  t.match(await state(p.id), { status: 'confirmed', confirmed_by: 'agent-1', ended_at: null }, 'still confirmed');
  t.equal(await count(pool, 'actionledger.operations'), 0, 'nothing reserved by the others');

  const done = await gate.executeProposal(p.id, mine({ turn_id: 'turn-2' }));
  t.match(done, { ok: true, status: 'reserved', created: true }, 'its own principal executes');
  t.same(await gate.executeProposal(p.id, theirs()), notFound, 'an executed one is not replayed to another either');

  // An expired proposal is not expired by another principal's touch (it would answer proposal_expired).
  const late = held(await gate.call(mine({ workflow_step_id: 'late' }), 'send_email', email, { ttl_s: 1 }));
  await pool.query(
    "UPDATE actionledger.gate_proposals SET expires_at = created_at + interval '1 millisecond' WHERE proposal_id = $1",
    [late.id],
  );
  t.same(await gate.cancelProposal(late.id, theirs()), notFound);
  t.same(await state(late.id), { status: 'proposed', confirmed_by: null, ended_at: null }, 'not even expired');

  const refusals = await auditRows(pool, "principal_id = 'agent-2' OR tenant_id = 'tenant-b'");
  t.same(
    refusals.map((r) => [r.action, r.outcome, r.subject_id, r.detail]),
    [
      ['confirm', 'proposal_not_found', p.id, { not_owner: true }],
      ['cancel', 'proposal_not_found', p.id, { not_owner: true }],
      ['cancel', 'proposal_not_found', null, {}],
      ['execute', 'proposal_not_found', p.id, { not_owner: true }],
      ['cancel', 'proposal_not_found', p.id, { not_owner: true }],
      ['execute', 'proposal_not_found', null, {}],
      ['execute', 'proposal_not_found', p.id, { not_owner: true }],
      ['cancel', 'proposal_not_found', late.id, { not_owner: true }],
    ],
    'each attempt audited as the refusal, naming the proposal it aimed at when it exists in the tenant',
  );
});

t.test('$10 proposed, confirmed, executed with a $10,000 payload: params_mismatch, nothing reserved', async (t) => {
  const { gate, pool } = await gateFixture(t, confirmRefunds);
  const args = { order_id: 'O-1', amount: 10, currency: 'GBP' };
  const p = held(await gate.call(gctx(), 'issue_refund', args));
  t.match(await gate.confirm(p.token, gctx({ turn_id: 'turn-2' })), { ok: true });
  const tampered = await gate.executeProposal(p.id, gctx({ turn_id: 'turn-2' }), { args: { ...args, amount: 10000 } });
  t.match(tampered, { ok: false, error: 'params_mismatch' });
  t.equal(await count(pool, 'actionledger.operations'), 0, 'nothing reserved');
  t.equal(
    (await pool.query<{ status: string }>('SELECT status FROM actionledger.gate_proposals')).rows[0]?.status,
    'confirmed',
    'proposal untouched',
  );
  const same = await gate.executeProposal(p.id, gctx({ turn_id: 'turn-2' }), {
    args: { currency: 'GBP', amount: 10.0, order_id: 'O-1' },
  });
  t.match(same, { ok: true, status: 'reserved' }, 'the same arguments (any key order) execute');
  t.equal(
    (
      await pool.query<{ arguments_json: Record<string, unknown> }>(
        'SELECT arguments_json FROM actionledger.operations',
      )
    ).rows[0]?.arguments_json.amount,
    10,
  );
  t.match(
    await gate.executeProposal(p.id, gctx(), { args: { ...args, amount: 10000 } }),
    { ok: false, error: 'params_mismatch' },
    'also after execution',
  );
  // The cap was held by the proposal and moved to the operation: 10 of 500 used.
  t.equal(
    (
      await pool.query<{ used_value: string }>(
        "SELECT used_value::text FROM actionledger.gate_counters WHERE scope = 'conversation'",
      )
    ).rows[0]?.used_value,
    '10',
  );
});

t.test('TTL is min(requested, configured); expiry is lazy, final, never revivable, and releases the cap', async (t) => {
  const { gate, pool } = await gateFixture(t, confirmRefunds);
  const long = held(
    await gate.call(
      gctx({ workflow_step_id: 'long' }),
      'issue_refund',
      { order_id: 'O-2', amount: 5, currency: 'GBP' },
      { ttl_s: 100000 },
    ),
  );
  const ttl = (
    await pool.query<{ s: number }>(
      'SELECT extract(epoch FROM expires_at - created_at)::int AS s FROM actionledger.gate_proposals WHERE proposal_id = $1',
      [long.id],
    )
  ).rows[0]?.s;
  t.equal(ttl, 900, 'a caller cannot extend the configured 900 s');
  const short = held(
    await gate.call(
      gctx({ workflow_step_id: 'short' }),
      'issue_refund',
      { order_id: 'O-1', amount: 10, currency: 'GBP' },
      { ttl_s: 1 },
    ),
  );
  t.equal(
    (
      await pool.query<{ used_value: string }>(
        "SELECT used_value::text FROM actionledger.gate_counters WHERE scope = 'conversation'",
      )
    ).rows[0]?.used_value,
    '15',
    'both proposals hold their value',
  );
  await new Promise((r) => setTimeout(r, 1200));
  t.equal(
    (
      await pool.query<{ status: string }>('SELECT status FROM actionledger.gate_proposals WHERE proposal_id = $1', [
        short.id,
      ])
    ).rows[0]?.status,
    'proposed',
    'expiry is lazy: untouched until the next use',
  );
  t.match(await gate.confirm(short.token, gctx({ turn_id: 'turn-2' })), { ok: false, error: 'proposal_expired' });
  t.equal(
    (
      await pool.query<{ status: string }>('SELECT status FROM actionledger.gate_proposals WHERE proposal_id = $1', [
        short.id,
      ])
    ).rows[0]?.status,
    'expired',
    'marked expired on that touch',
  );
  t.equal(
    (
      await pool.query<{ used_value: string }>(
        "SELECT used_value::text FROM actionledger.gate_counters WHERE scope = 'conversation'",
      )
    ).rows[0]?.used_value,
    '5',
    'its hold released',
  );
  t.match(
    await gate.confirm(short.token, gctx({ turn_id: 'turn-3' })),
    { ok: false, error: 'invalid_state_transition' },
    'still not confirmable',
  );
  t.match(await gate.executeProposal(short.id, gctx()), { ok: false, error: 'invalid_state_transition' });
  await t.rejects(
    pool.query(
      "UPDATE actionledger.gate_proposals SET status = 'proposed', expires_at = now() + interval '1 hour' WHERE proposal_id = $1",
      [short.id],
    ),
    /final/,
    'even SQL cannot revive it',
  );
  t.equal(await count(pool, 'actionledger.operations'), 0);
});

t.test('cancel from proposed or confirmed; cancelled is final', async (t) => {
  const { gate, pool } = await gateFixture(t);
  const a = held(await gate.call(gctx({ workflow_step_id: 'a' }), 'send_email', email));
  const b = held(await gate.call(gctx({ workflow_step_id: 'b' }), 'send_email', email));
  t.match(await gate.cancelProposal(a.id, gctx()), { ok: true, status: 'cancelled' });
  await gate.confirm(b.token, gctx({ turn_id: 'turn-2' }));
  t.match(await gate.cancelProposal(b.id, gctx()), { ok: true, status: 'cancelled' }, 'from confirmed');
  t.match(await gate.cancelProposal(b.id, gctx()), { ok: false, error: 'invalid_state_transition' });
  t.match(await gate.confirm(a.token, gctx({ turn_id: 'turn-2' })), { ok: false, error: 'invalid_state_transition' });
  t.match(await gate.executeProposal(b.id, gctx()), { ok: false, error: 'invalid_state_transition' });
  t.match(await gate.cancelProposal(a.id, gctx({ tenant_id: 'tenant-b' })), { ok: false, error: 'proposal_not_found' });
  t.equal(await count(pool, 'actionledger.operations'), 0);
});
