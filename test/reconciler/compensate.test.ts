import t from 'tap';
import { ctx, dispatchEnv, settled, VOID_PATH, type DispatchEnv } from '../helpers/fleet.js';
import { compareSteps, nextToCompensate, resolvePointer } from '../../compensator/index.js';

async function status(e: DispatchEnv, id: string): Promise<{ status: string; review_reason: string | null }> {
  const { rows } = await e.pool.query(
    'SELECT status, review_reason FROM actionledger.operations WHERE operation_id = $1',
    [id],
  );
  return rows[0] as never;
}

async function compensationOf(e: DispatchEnv, id: string): Promise<string | undefined> {
  const { rows } = await e.pool.query<{ compensation_operation_id: string }>(
    'SELECT compensation_operation_id FROM actionledger.compensations WHERE original_operation_id = $1',
    [id],
  );
  return rows[0]?.compensation_operation_id;
}

const voids = (e: DispatchEnv) => e.provider.requests().filter((r) => r.method === 'POST' && r.path === VOID_PATH);

t.test('step order is natural; the next to compensate is the newest succeeded step before the failure', (t) => {
  t.same(['step-10', 'step-2', 'step-1'].sort(compareSteps), ['step-1', 'step-2', 'step-10']);
  const s = (id: string, step: string, st: string) => ({ operation_id: id, workflow_step_id: step, status: st });
  t.same(nextToCompensate([s('a', '1', 'succeeded'), s('b', '2', 'succeeded'), s('c', '3', 'failed')]), {
    target: 'b',
    failedStep: '3',
  });
  t.same(nextToCompensate([s('a', '1', 'succeeded'), s('b', '2', 'compensated'), s('c', '3', 'failed')]), {
    target: 'a',
    failedStep: '3',
  });
  t.equal(
    nextToCompensate([s('a', '1', 'succeeded'), s('b', '2', 'compensating'), s('c', '3', 'failed')]),
    null,
    'one undo at a time',
  );
  t.equal(
    nextToCompensate([s('a', '1', 'succeeded'), s('b', '2', 'needs_review'), s('c', '3', 'failed')]),
    null,
    'a step in review stops the chain',
  );
  t.equal(nextToCompensate([s('a', '1', 'failed'), s('b', '2', 'succeeded')]), null, 'nothing before the failure');
  t.equal(resolvePointer({ a: [{ 'b/c': 1 }] }, '/a/0/b~1c'), 1);
  t.equal(resolvePointer({ a: 1 }, '/b'), undefined);
  t.end();
});

t.test('three-step task, step 3 definitively fails: compensations for steps 2 then 1, each once', async (t) => {
  const e = await dispatchEnv(t);
  const task = { task_id: 'trip-1' };
  const steps = [];
  for (const [i, amount] of [
    [1, 100],
    [2, 200],
    [3, 300],
  ] as const) {
    steps.push(
      await e.ledger.reserve(ctx(`step-${i}`, task), 'issue_refund', {
        order_id: `trip-o${i}`,
        amount,
        currency: 'EUR',
      }),
    );
  }
  const [s1, s2, s3] = steps as [(typeof steps)[0], (typeof steps)[0], (typeof steps)[0]];
  e.provider.inject({ kind: 'status', status: 422 }, { when: (k) => k === s3.effect_key });
  await e.dispatcher(4);
  t.equal((await settled(e.pool, s1.operation_id)).status, 'succeeded');
  t.equal((await settled(e.pool, s2.operation_id)).status, 'succeeded');
  t.equal((await settled(e.pool, s3.operation_id)).status, 'failed');
  const kit = await e.reconciler();

  const p1 = await kit.pass();
  t.equal(p1.compensate.minted, 1);
  t.equal((await status(e, s2.operation_id)).status, 'compensating', 'step 2 first (newest)');
  t.equal((await status(e, s1.operation_id)).status, 'succeeded', 'step 1 waits');
  const c2 = await compensationOf(e, s2.operation_id);
  t.ok(c2);
  t.equal((await settled(e.pool, c2 as string)).status, 'succeeded', 'the compensation went through the dispatcher');

  const p2 = await kit.pass();
  t.match(p2.compensate, { completed: 1, minted: 1 });
  t.equal((await status(e, s2.operation_id)).status, 'compensated');
  const c1 = await compensationOf(e, s1.operation_id);
  t.equal((await settled(e.pool, c1 as string)).status, 'succeeded');
  const p3 = await kit.pass();
  t.match(p3.compensate, { completed: 1, minted: 0 });
  t.equal((await status(e, s1.operation_id)).status, 'compensated');
  t.match(await kit.pass(), { compensate: { minted: 0, completed: 0, escalated: 0 } }, 'nothing more to do');

  const sent = voids(e);
  t.equal(sent.length, 2, 'two compensation requests, each once');
  const { rows: comps } = await e.pool.query<{ operation_id: string }>(
    'SELECT operation_id, effect_key, workflow_step_id, tool_name, arguments_json, current_approval_id FROM actionledger.operations WHERE operation_id = ANY($1::uuid[])',
    [[c1, c2]],
  );
  const byId = new Map(comps.map((c) => [c.operation_id, c as Record<string, unknown>]));
  t.same(
    sent.map((r) => r.key),
    [byId.get(c2 as string)?.effect_key, byId.get(c1 as string)?.effect_key],
    'step 2 undone before step 1, each with its own effect key',
  );
  const receipt2 = e.provider.allEffects().find((x) => x.key === s2.effect_key)?.operationId;
  t.match(byId.get(c2 as string), {
    tool_name: 'void_refund',
    workflow_step_id: `compensation:${s2.operation_id}`,
    current_approval_id: `compensation:${s2.operation_id}`,
    arguments_json: { refund_id: receipt2, order_id: 'trip-o2', amount: 200, reason: 'compensation' },
  });
  const evidence = await e.pool.query(
    'SELECT count(*)::int AS n FROM actionledger.authorization_evidence WHERE operation_id = ANY($1::uuid[])',
    [[c1, c2]],
  );
  t.equal((evidence.rows[0] as { n: number }).n, 2, 'each compensation passed a fresh authorization');
  const h = await e.pool.query(
    'SELECT from_status, to_status, reason FROM actionledger.operation_history WHERE operation_id = $1 ORDER BY id',
    [s2.operation_id],
  );
  t.match(h.rows.slice(-2), [
    { from_status: 'succeeded', to_status: 'compensating', reason: 'step_failed:step-3' },
    { from_status: 'compensating', to_status: 'compensated', reason: 'compensation_succeeded' },
  ]);
});

t.test(
  'a failed compensation puts the original in needs_review; no mapping goes to review without inventing one',
  async (t) => {
    const e = await dispatchEnv(t);
    const a = await e.ledger.reserve(ctx('1', { task_id: 'trip-2' }), 'issue_refund', {
      order_id: 'x1',
      amount: 1,
      currency: 'EUR',
    });
    const b = await e.ledger.reserve(ctx('2', { task_id: 'trip-2' }), 'issue_refund', {
      order_id: 'x2',
      amount: 2,
      currency: 'EUR',
    });
    const originals = new Set([a.effect_key, b.effect_key]);
    e.provider.inject({ kind: 'status', status: 422 }, { when: (k) => k === b.effect_key });
    e.provider.inject({ kind: 'status', status: 422 }, { when: (k) => !originals.has(k), times: Infinity });
    await e.dispatcher(2);
    t.equal((await settled(e.pool, a.operation_id)).status, 'succeeded');
    t.equal((await settled(e.pool, b.operation_id)).status, 'failed');
    const kit = await e.reconciler();
    t.equal((await kit.pass()).compensate.minted, 1);
    const c = await compensationOf(e, a.operation_id);
    t.equal((await settled(e.pool, c as string)).status, 'failed', 'the provider rejected the compensation');
    t.equal((await kit.pass()).compensate.escalated, 1);
    t.same(await status(e, a.operation_id), { status: 'needs_review', review_reason: 'compensation_failed' });
    t.equal((await kit.pass()).compensate.minted, 0, 'a failed compensation is not retried on its own');

    // The reviewer's compensate on a tool that declares no inverse: review, never an invented inverse.
    const e2 = await dispatchEnv(t, {}, { issueRefund: { compensation: null } });
    const o = await e2.ledger.reserve(ctx('solo'), 'issue_refund', { order_id: 'y1', amount: 5, currency: 'EUR' });
    await e2.dispatcher(1);
    t.equal((await settled(e2.pool, o.operation_id)).status, 'succeeded');
    const kit2 = await e2.reconciler();
    await t.rejects(kit2.review.compensate(o.operation_id, { actor: 'dave', reason: '' }), { code: 'invalid_review' });
    const r = await kit2.review.compensate(o.operation_id, { actor: 'dave', reason: 'customer cancelled' });
    t.match(r, { ok: true, from: 'succeeded', to: 'needs_review', compensation: 'escalated' });
    t.same(await status(e2, o.operation_id), {
      status: 'needs_review',
      review_reason: 'compensation_refused:compensation_unmapped',
    });
    t.equal(voids(e2).length, 0);
    await t.rejects(kit2.review.compensate('00000000-0000-4000-8000-000000000000', { actor: 'dave', reason: 'x' }), {
      code: 'not_found',
    });
    const failed = await kit2.review.resolveFailed(o.operation_id, {
      actor: 'dave',
      reason: 'refund voided by phone with the bank',
    });
    t.match(failed, { from: 'needs_review', to: 'failed' });
    await t.rejects(
      kit2.review.resolveSucceeded(o.operation_id, { actor: 'dave', reason: 'x', receipt: 'r1' }),
      { code: 'invalid_state_transition' },
      'failed is an end',
    );
  },
);

t.test('a reviewer compensates a succeeded operation: minted, dispatched, compensated', async (t) => {
  const e = await dispatchEnv(t);
  const o = await e.ledger.reserve(ctx('manual'), 'issue_refund', { order_id: 'z1', amount: 7, currency: 'EUR' });
  await e.dispatcher(1);
  t.equal((await settled(e.pool, o.operation_id)).status, 'succeeded');
  const kit = await e.reconciler();
  const r = await kit.review.compensate(o.operation_id, { actor: 'erin', reason: 'duplicate order' });
  t.match(r, { to: 'compensating', compensation: 'minted' });
  await t.rejects(
    kit.review.compensate(o.operation_id, { actor: 'erin', reason: 'again' }),
    { code: 'invalid_state_transition' },
    'once',
  );
  const c = await compensationOf(e, o.operation_id);
  t.equal((await settled(e.pool, c as string)).status, 'succeeded');
  t.equal((await kit.pass()).compensate.completed, 1);
  t.equal((await status(e, o.operation_id)).status, 'compensated');
  const h = await e.pool.query(
    `SELECT actor, reason FROM actionledger.operation_history WHERE operation_id = $1 AND to_status = 'compensating'`,
    [o.operation_id],
  );
  t.same(h.rows, [{ actor: 'erin', reason: 'review:compensate: duplicate order' }]);
});
