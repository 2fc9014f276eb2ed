import t from 'tap';
import { Metrics } from '../../core/metrics.js';
import { openDispatcher } from '../../dispatcher/index.js';
import { DispatchMetrics } from '../../dispatcher/metrics.js';
import { ctx, dispatchEnv, settled } from '../helpers/fleet.js';

t.test('each written outcome observes its enqueue-to-outcome time, once, by provider and outcome', async (t) => {
  const e = await dispatchEnv(t);
  const metrics = new Metrics({ defaultMetrics: false, ledger: false });
  const before = (await e.pool.query<{ now: Date }>('SELECT now()')).rows[0]?.now as Date;
  const ops = [];
  for (let i = 0; i < 3; i++)
    ops.push(
      await e.ledger.reserve(ctx(`lat-${i}`), 'issue_refund', { order_id: `o-${i}`, amount: 5, currency: 'EUR' }),
    );
  const d = await openDispatcher({ ...e.runtime, metrics }, e.env);
  await d.start();
  t.teardown(() => d.stop());
  for (const op of ops) t.equal((await settled(e.pool, op.operation_id)).status, 'succeeded');
  const after = (await e.pool.query<{ now: Date }>('SELECT now()')).rows[0]?.now as Date;

  const h = (await DispatchMetrics.on(metrics.registry).enqueueToOutcome.get()).values;
  const count = h.find((v) => v.metricName?.endsWith('_count'))!;
  const sum = h.find((v) => v.metricName?.endsWith('_sum'))!;
  t.same(count.labels, { provider: 'billing-test', outcome: 'succeeded' });
  t.equal(count.value, 3, 'one observation per outcome');
  // Each is at least zero and at most the time from the first reservation to the last outcome.
  t.ok(sum.value >= 0 && sum.value <= 3 * ((after.getTime() - before.getTime()) / 1000 + 1), `sum ${sum.value}`);
});
