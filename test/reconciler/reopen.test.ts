import t from 'tap';
import { spawn } from 'node:child_process';
import { openReconciler, ReconcileSchedule } from '../../reconciler/index.js';
import { BIN } from '../helpers/cli.js';
import { ctx, dispatchEnv, settled } from '../helpers/fleet.js';
import { nodeCommand } from '../helpers/node-child.js';

t.test(
  'a reconciler reopened on the same runtime: metrics registered once and reused, close() repeatable, a closed kit refuses passes',
  async (t) => {
    const e = await dispatchEnv(t);
    const first = await openReconciler(e.runtime, e.env);
    t.equal((await first.pass()).reconcile.ran, true);
    first.close();
    first.close();
    await t.rejects(first.pass(), { code: 'internal' }, 'a closed reconciler does not pretend to run');

    const second = await openReconciler(e.runtime, e.env);
    t.teardown(() => second.close());
    t.equal(second.metrics, first.metrics, 'the metrics registered the first time');
    const names = (await e.runtime.metrics.registry.getMetricsAsJSON())
      .map((m) => m.name)
      .filter((n) => n.startsWith('actionledger_reconcile') || n === 'actionledger_compensations_total');
    t.same([...names].sort(), [...new Set(names)].sort(), 'no metric twice');
    t.equal(names.length, 5);

    // The reopened reconciler, on a schedule stopped and started again, resolves an orphan: a worker SIGKILLed
    // after the provider applied the effect, before its outcome write.
    const r = await e.ledger.reserve(ctx('reopened'), 'issue_refund', { order_id: 'o-r', amount: 5, currency: 'EUR' });
    const worker = spawn(...nodeCommand([BIN, 'dispatcher', '--concurrency', '1']), {
      env: {
        PATH: process.env.PATH,
        ...e.env,
        ACTIONLEDGER_CRASH_POINTS_ENABLED: '1',
        ACTIONLEDGER_CRASH_AT: 'after_response_before_outcome',
      },
      stdio: 'ignore',
    });
    const died = await new Promise<string | null>((resolve) => worker.once('exit', (_code, signal) => resolve(signal)));
    t.equal(died, 'SIGKILL');
    const s = new ReconcileSchedule({
      databaseUrl: e.url,
      schema: 'actionledger',
      cron: '0 0 1 1 *',
      log: e.runtime.log,
      run: (signal) => second.pass(signal),
    });
    t.teardown(() => s.stop());
    await s.start();
    await s.stop();
    await s.start();
    // Passes until one finds the orphan (its worker's heartbeat must first go stale).
    let after = await settled(e.pool, r.operation_id, 1).catch(() => null);
    for (let i = 0; i < 30 && after === null; i++) {
      await s.runNow();
      after = await settled(e.pool, r.operation_id, 1000).catch(() => null);
    }
    t.equal(after?.status, 'succeeded', 'the pass read the effect back');
    const checks = (
      await e.runtime.metrics.registry.getSingleMetricAsString('actionledger_reconcile_checks_total')
    ).match(/outcome="applied"\} (\d+)/);
    t.equal(checks?.[1], '1', 'counted on the reused counter');
  },
);
