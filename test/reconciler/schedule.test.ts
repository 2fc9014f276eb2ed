import t from 'tap';
import { createLogger } from '../../core/log.js';
import { ReconcileSchedule } from '../../reconciler/index.js';
import { createTestDatabase } from '../helpers/db.js';

t.test('the pg-boss schedule: cron registered once, passes from two fleets never overlap', async (t) => {
  const url = await createTestDatabase(t);
  const log = createLogger({ level: 'silent', name: 'test' });
  let running = 0;
  let maxRunning = 0;
  let runs = 0;
  const run = async (): Promise<object> => {
    running++;
    maxRunning = Math.max(maxRunning, running);
    await new Promise((r) => setTimeout(r, 300));
    running--;
    runs++;
    return { ok: true };
  };
  const a = new ReconcileSchedule({ databaseUrl: url, schema: 'actionledger', cron: '*/5 * * * *', log, run });
  const b = new ReconcileSchedule({ databaseUrl: url, schema: 'actionledger', cron: '*/5 * * * *', log, run });
  t.teardown(async () => {
    await a.stop();
    await b.stop();
  });
  await Promise.all([a.start(), b.start()]);
  t.same(await a.schedules(), [{ name: 'actionledger-reconcile', cron: '*/5 * * * *' }], 'one schedule, however many fleets register it');
  for (let i = 0; i < 2; i++) {
    await a.runNow();
    await b.runNow();
  }
  const deadline = Date.now() + 30_000;
  while (runs < 4 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
  t.equal(runs, 4, 'every queued pass ran');
  t.equal(maxRunning, 1, 'one at a time across both fleets (singleton queue)');
});
