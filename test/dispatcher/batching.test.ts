/**
 * The dispatcher's batches (dispatcher/batcher.ts): operations in flight together share the evidence statement
 * and the dispatch transaction, yet each keeps its own fate. Real PostgreSQL, the sandbox provider and
 * authorizer over mTLS, a real Dispatcher.
 */
import t from 'tap';
import { Metrics } from '../../core/metrics.js';
import { openDispatcher } from '../../dispatcher/index.js';
import { ctx, dispatchEnv, settled } from '../helpers/fleet.js';

const args = (n: number) => ({ order_id: `ord-${n}`, amount: 100 + n, currency: 'EUR' });

interface Bucketed {
  values: { labels: Record<string, string>; value: number; metricName?: string }[];
}

async function batchStats(metrics: Metrics, stage: string): Promise<{ batches: number; operations: number }> {
  const m = (await metrics.registry.getSingleMetric('actionledger_dispatch_batch_operations')?.get()) as Bucketed | undefined;
  const pick = (suffix: string) => m?.values.find((v) => v.metricName === `actionledger_dispatch_batch_operations_${suffix}` && v.labels.stage === stage)?.value ?? 0;
  return { batches: pick('count'), operations: pick('sum') };
}

t.test('operations in flight together share batches, and each is sent exactly once', async (t) => {
  const e = await dispatchEnv(t);
  const reserved = [];
  for (let i = 0; i < 24; i++) reserved.push(await e.ledger.reserve(ctx(`batch-${i}`), 'issue_refund', args(i)));
  const metrics = new Metrics({ defaultMetrics: false, ledger: false });
  const d = await openDispatcher({ ...e.runtime, metrics }, e.env, { concurrency: 24 });
  t.teardown(() => d.stop(5000));
  await d.start();
  for (const r of reserved) {
    const done = await settled(e.pool, r.operation_id);
    t.equal(done.status, 'succeeded', r.operation_id);
    t.equal(e.provider.requestsFor(r.effect_key), 1, 'one request for its key');
  }
  const evidence = await batchStats(metrics, 'evidence');
  const dispatch = await batchStats(metrics, 'dispatch');
  t.equal(evidence.operations, 24, 'every operation went through an evidence batch');
  t.equal(dispatch.operations, 24, 'every operation went through a dispatch batch');
  t.ok(evidence.batches + dispatch.batches < 48, `some batch held more than one operation (evidence ${evidence.batches}, dispatch ${dispatch.batches} batches)`);
  const ev = await e.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM actionledger.authorization_evidence');
  t.equal(ev.rows[0]?.n, 24, 'one evidence row each');
});

t.test("a batch-mate whose policy rotated after its evidence was recorded is refused at the final check; the others are sent", async (t) => {
  const e = await dispatchEnv(t);
  // Rotates the policy of the marked operations inside the very statement that records their evidence: the
  // evidence commits under the old version, so only the dispatch batch's final check can catch it.
  await e.pool.query(`
    CREATE TABLE public.rotate_after_evidence (operation_id uuid PRIMARY KEY);
    CREATE FUNCTION public.rotate_after_evidence() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      UPDATE actionledger.operations SET current_policy_version = 'policy-2'
      WHERE operation_id = NEW.operation_id AND operation_id IN (SELECT operation_id FROM public.rotate_after_evidence);
      RETURN NEW;
    END $$;
    CREATE TRIGGER rotate_after_evidence AFTER INSERT ON actionledger.authorization_evidence
      FOR EACH ROW EXECUTE FUNCTION public.rotate_after_evidence();`);
  const reserved = [];
  for (let i = 0; i < 12; i++) reserved.push(await e.ledger.reserve(ctx(`rotate-${i}`), 'issue_refund', args(i)));
  const rotated = reserved.filter((_, i) => i % 3 === 1);
  for (const r of rotated) await e.pool.query('INSERT INTO public.rotate_after_evidence VALUES ($1)', [r.operation_id]);
  await e.dispatcher(12);
  for (const r of reserved) {
    const done = await settled(e.pool, r.operation_id);
    if (rotated.includes(r)) {
      t.equal(done.status, 'needs_review', 'rotated: needs_review');
      t.equal(done.review_reason, 'final_check:authorization_stale', 'rotated: refused at the final check');
      t.equal(e.provider.requestsFor(r.effect_key), 0, 'rotated: never sent');
    } else {
      t.equal(done.status, 'succeeded', 'unchanged: succeeded');
      t.equal(e.provider.requestsFor(r.effect_key), 1, 'unchanged: sent once');
    }
  }
});

t.test('a revocation issued while a batch is at the provider waits for its outcome', async (t) => {
  const e = await dispatchEnv(t);
  const slow = await e.ledger.reserve(ctx('slow'), 'issue_refund', args(1));
  const mate = await e.ledger.reserve(ctx('mate'), 'issue_refund', args(2));
  // The slow one is applied and never answered: the client times out after the profile's 1 s.
  e.provider.inject({ kind: 'hangHeaders', commit: true }, { when: (key) => key === slow.effect_key });
  await e.dispatcher(4);
  const deadline = Date.now() + 10_000;
  while (e.provider.requestsFor(slow.effect_key) === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
  t.equal(e.provider.requestsFor(slow.effect_key), 1, 'the request reached the provider');
  // A revocation (the policy rotated) issued now must not commit while the request is out.
  const revoked = await e.pool.query<{ status: string }>("UPDATE actionledger.operations SET current_policy_version = 'policy-2' WHERE operation_id = $1 RETURNING status", [slow.operation_id]);
  t.equal(revoked.rows[0]?.status, 'unknown', 'the revocation waited until the outcome had committed');
  t.equal((await settled(e.pool, slow.operation_id)).status, 'unknown');
  t.equal((await settled(e.pool, mate.operation_id)).status, 'succeeded', 'its batch-mate succeeded');
  t.equal(e.provider.requestsFor(mate.effect_key), 1);
});
