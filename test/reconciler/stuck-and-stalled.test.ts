/**
 * The reconciler, compensator and verifier on hostile answers and unexpected errors: no case may leave an
 * operation stuck, stall every pass, or let the verifier miss (or invent) a discrepancy.
 */
import t, { type Test } from 'tap';
import { ctx, dispatchEnv, passUntilResolved, patchProvider, settled, type DispatchEnv } from '../helpers/fleet.js';
import { loadDispatchIdentity } from '../../runtime/identity.js';
import { EffectKeyer } from '../../ledger/effect-key.js';
import { verifyLedger } from '../../reconciler/index.js';

async function row(
  e: DispatchEnv,
  id: string,
): Promise<{ status: string; review_reason: string | null; reconcile_attempts: number }> {
  const { rows } = await e.pool.query(
    'SELECT status, review_reason, reconcile_attempts FROM actionledger.operations WHERE operation_id = $1',
    [id],
  );
  return rows[0] as never;
}
async function compensationOf(e: DispatchEnv, id: string): Promise<string> {
  const { rows } = await e.pool.query<{ compensation_operation_id: string }>(
    'SELECT compensation_operation_id FROM actionledger.compensations WHERE original_operation_id = $1',
    [id],
  );
  return rows[0]?.compensation_operation_id as string;
}
async function verifier(t: Test, e: DispatchEnv) {
  const id = await loadDispatchIdentity(e.runtime, e.env);
  const agent = id.agent();
  t.teardown(() => agent.close());
  return () =>
    verifyLedger({
      config: e.config,
      pool: e.pool,
      keyer: new EffectKeyer(e.runtime.effectKeys),
      provider: { agent, profile: id.profile, credentials: id.credentials },
    });
}

t.test('a readback answer with a NUL character neither stalls the passes nor the compensator', async (t) => {
  const e = await dispatchEnv(
    t,
    {},
    { reconciler: { concurrency: 1, backoff_initial_ms: 50, backoff_max_ms: 50, max_attempts: 3 } },
  );
  const s1 = await e.ledger.reserve(ctx('step-1', { task_id: 'trip' }), 'issue_refund', {
    order_id: 'c1',
    amount: 1,
    currency: 'EUR',
  });
  const s2 = await e.ledger.reserve(ctx('step-2', { task_id: 'trip' }), 'issue_refund', {
    order_id: 'c2',
    amount: 2,
    currency: 'EUR',
  });
  const poison = await e.ledger.reserve(ctx('poison'), 'issue_refund', { order_id: 'p', amount: 3, currency: 'EUR' });
  e.provider.inject({ kind: 'status', status: 422 }, { when: (k) => k === s2.effect_key });
  e.provider.inject({ kind: 'resetBeforeCommit' }, { when: (k) => k === poison.effect_key });
  patchProvider(e.provider, (orig) => async (req, res) => {
    if (req.method === 'GET' && (req.url ?? '').includes(`/by-key/${encodeURIComponent(poison.effect_key)}`)) {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"state":"\\u0000"}');
      return;
    }
    return orig(req, res);
  });
  await e.dispatcher(2);
  t.equal((await settled(e.pool, s2.operation_id)).status, 'failed');
  t.equal((await settled(e.pool, poison.operation_id)).status, 'unknown');
  const kit = await e.reconciler();
  const first = await kit.pass();
  t.match(
    first.reconcile,
    { examined: 1, still_unknown: 1, provider_errors: 1, errors: 0 },
    'a malformed answer is a failing readback, not a crash',
  );
  t.equal(first.compensate.minted, 1, 'the compensator still ran');
  t.equal((await row(e, s1.operation_id)).status, 'compensating');
  for (let i = 0; i < 10 && (await row(e, poison.operation_id)).status === 'unknown'; i++) {
    await new Promise((r) => setTimeout(r, 80));
    await kit.pass();
  }
  t.match(await row(e, poison.operation_id), { status: 'needs_review', review_reason: 'reconcile_attempts_exhausted' });
});

t.test('no operation stays executing under a live worker after an unexpected error', async (t) => {
  const e = await dispatchEnv(t);
  // An authorizer answer with a field named "\u0000": refused as invalid JSON, before anything is stored.
  const nul = await e.ledger.reserve(ctx('nul-auth'), 'issue_refund', { order_id: 'n', amount: 4, currency: 'EUR' });
  e.authorizer.inject(
    { kind: 'extraField', name: '\u0000', value: 'x' },
    { when: (r) => r.operation_id === nul.operation_id },
  );
  // A one-off error that is not a transient one (those are retried) while recording one operation's evidence.
  const blip = await e.ledger.reserve(ctx('blip'), 'issue_refund', { order_id: 'b', amount: 1, currency: 'EUR' });
  await e.pool.query(`CREATE SEQUENCE public.fail_once`);
  await e.pool.query(`
    CREATE FUNCTION public.fail_once() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF NEW.operation_id = '${blip.operation_id}'::uuid AND nextval('public.fail_once') = 1 THEN
        RAISE EXCEPTION 'injected internal error' USING ERRCODE = 'XX000';
      END IF;
      RETURN NEW;
    END $$`);
  await e.pool.query(
    `CREATE TRIGGER fail_once BEFORE INSERT ON actionledger.authorization_evidence FOR EACH ROW EXECUTE FUNCTION public.fail_once()`,
  );
  const d = await e.dispatcher(2);
  t.match(await settled(e.pool, nul.operation_id), {
    status: 'needs_review',
    review_reason: 'authorization:authorization_invalid',
  });
  t.match(
    await settled(e.pool, blip.operation_id),
    { status: 'needs_review', review_reason: 'internal:XX000' },
    'sent to review, provider never called',
  );
  // The row settles when the failure is recorded; the dispatch slot is freed just after, so wait for it.
  for (let i = 0; i < 100 && d.inFlight > 0; i++) await new Promise((r) => setTimeout(r, 20));
  t.equal(d.inFlight, 0, 'the slot is freed');
  t.equal(e.provider.requestsFor(blip.effect_key), 0);
  const kit = await e.reconciler();
  await kit.review.retry(blip.operation_id, { actor: 'alice', reason: 'the database error is understood and gone' });
  t.equal((await settled(e.pool, blip.operation_id)).status, 'succeeded', 'a reviewed retry is safe and goes through');
});

t.test(
  'a compensation briefly unknown: the original goes to review, then to compensated when it succeeds',
  async (t) => {
    const e = await dispatchEnv(t, {}, { reconciler: { backoff_initial_ms: 100, backoff_max_ms: 100 } });
    const s1 = await e.ledger.reserve(ctx('step-1', { task_id: 'trip' }), 'issue_refund', {
      order_id: 'o1',
      amount: 100,
      currency: 'EUR',
    });
    const s2 = await e.ledger.reserve(ctx('step-2', { task_id: 'trip' }), 'issue_refund', {
      order_id: 'o2',
      amount: 200,
      currency: 'EUR',
    });
    e.provider.inject({ kind: 'status', status: 422 }, { when: (k) => k === s2.effect_key });
    await e.dispatcher(2);
    t.equal((await settled(e.pool, s1.operation_id)).status, 'succeeded');
    t.equal((await settled(e.pool, s2.operation_id)).status, 'failed');
    const originals = new Set([s1.effect_key, s2.effect_key]);
    e.provider.inject({ kind: 'commitThenReset' }, { when: (k) => !originals.has(k) });
    e.provider.inject({ kind: 'readbackFailing' }, { when: (k) => !originals.has(k) });
    const kit = await e.reconciler();
    t.equal((await kit.pass()).compensate.minted, 1);
    const c = await compensationOf(e, s1.operation_id);
    t.equal((await settled(e.pool, c)).status, 'unknown');
    await kit.pass(); // readback 503: the compensation stays unknown; the original goes to review
    t.match(await row(e, s1.operation_id), { status: 'needs_review', review_reason: 'compensation_unknown' });
    await new Promise((r) => setTimeout(r, 150));
    const p3 = await kit.pass(); // readback: applied
    t.equal((await row(e, c)).status, 'succeeded');
    t.equal(p3.compensate.completed, 1);
    t.match(await row(e, s1.operation_id), { status: 'compensated', review_reason: null });
    const { rows } = await e.pool.query(
      'SELECT from_status, to_status FROM actionledger.operation_history WHERE operation_id = $1 ORDER BY id',
      [s1.operation_id],
    );
    t.same(
      rows.slice(-3),
      [
        { from_status: 'compensating', to_status: 'needs_review' },
        { from_status: 'needs_review', to_status: 'compensating' },
        { from_status: 'compensating', to_status: 'compensated' },
      ],
      'a legal path',
    );
    const verify = await verifier(t, e);
    t.same((await verify()).discrepancies, []);
  },
);

t.test('a compensation operation is never compensated itself', async (t) => {
  const e = await dispatchEnv(t);
  const o = await e.ledger.reserve(ctx('x'), 'issue_refund', { order_id: 'x', amount: 1, currency: 'EUR' });
  await e.dispatcher(1);
  t.equal((await settled(e.pool, o.operation_id)).status, 'succeeded');
  const kit = await e.reconciler();
  await kit.review.compensate(o.operation_id, { actor: 'bob', reason: 'undo' });
  const c = await compensationOf(e, o.operation_id);
  t.equal((await settled(e.pool, c)).status, 'succeeded');
  await t.rejects(kit.review.compensate(c, { actor: 'bob', reason: 'undo the undo' }), {
    code: 'invalid_state_transition',
  });
  await kit.pass();
  t.equal((await row(e, o.operation_id)).status, 'compensated');
});

t.test(
  'the verifier: an effect on an operation in review as never sent is flagged; a running fleet gives no false missing effect',
  async (t) => {
    const e = await dispatchEnv(t);
    const op = await e.ledger.reserve(ctx('late-effect'), 'issue_refund', {
      order_id: 'le',
      amount: 7,
      currency: 'EUR',
    });
    e.provider.inject({ kind: 'commitThenReset' }, { when: (k) => k === op.effect_key });
    let lie = true;
    let raced: string | undefined;
    patchProvider(e.provider, (orig) => async (req, res) => {
      if (lie && req.method === 'GET' && (req.url ?? '').includes('/by-key/')) {
        res.writeHead(404, { 'content-type': 'application/json' });
        res.end('{"state":"no_effect"}');
        return;
      }
      if (!lie && raced === undefined && req.method === 'GET' && (req.url ?? '').startsWith('/v1/effects')) {
        // While the listing is being produced, the fleet finishes one more operation.
        const late = await e.ledger.reserve(ctx('during-listing'), 'issue_refund', {
          order_id: 'dl',
          amount: 9,
          currency: 'EUR',
        });
        raced = late.operation_id;
        await settled(e.pool, late.operation_id);
      }
      return orig(req, res);
    });
    await e.dispatcher(1);
    t.equal((await settled(e.pool, op.operation_id)).status, 'unknown');
    const kit = await e.reconciler();
    await passUntilResolved(e.pool, kit, op.operation_id);
    t.match(
      await row(e, op.operation_id),
      { status: 'needs_review', review_reason: 'no_effect_confirmed' },
      'a wrong readback',
    );
    lie = false;
    e.authorizer.inject({ kind: 'deny' }, { when: (r) => r.operation_id === op.operation_id });
    await kit.review.retry(op.operation_id, { actor: 'alice', reason: 'readback said no effect' });
    t.match(await settled(e.pool, op.operation_id), {
      status: 'needs_review',
      review_reason: 'authorization:authorization_denied',
    });
    const verify = await verifier(t, e);
    const report = await verify();
    t.same(
      report.discrepancies.map((d) => `${d.kind}:${d.operation_id}`),
      [`provider_effect_contradicts_ledger:${op.operation_id}`],
      'flagged, and no false missing effect for the operation that finished mid-listing',
    );
    t.equal((await row(e, raced as string)).status, 'succeeded');
  },
);

t.test(
  'a transient serialization failure while recording evidence is retried and the operation goes through',
  async (t) => {
    const e = await dispatchEnv(t);
    const op = await e.ledger.reserve(ctx('serialization'), 'issue_refund', {
      order_id: 's',
      amount: 1,
      currency: 'EUR',
    });
    await e.pool.query(`CREATE SEQUENCE public.serialize_once`);
    await e.pool.query(`
    CREATE FUNCTION public.serialize_once() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF nextval('public.serialize_once') = 1 THEN
        RAISE EXCEPTION 'could not serialize access' USING ERRCODE = '40001';
      END IF;
      RETURN NEW;
    END $$`);
    await e.pool.query(
      `CREATE TRIGGER serialize_once BEFORE INSERT ON actionledger.authorization_evidence FOR EACH ROW EXECUTE FUNCTION public.serialize_once()`,
    );
    await e.dispatcher(1);
    t.equal((await settled(e.pool, op.operation_id)).status, 'succeeded');
    const { rows } = await e.pool.query(`SELECT last_value::int AS n FROM public.serialize_once`);
    t.equal((rows[0] as { n: number }).n, 2, 'the evidence insert ran twice: failed once, then recorded');
    t.equal(e.provider.requestsFor(op.effect_key), 1);
  },
);
