import t from 'tap';
import { Metrics } from '../../core/metrics.js';
import { openReconciler, readFleetHealth, ReconcileSchedule } from '../../reconciler/index.js';
import { RECONCILE_QUEUE } from '../../reconciler/schedule.js';

import { dispatchEnv } from '../helpers/fleet.js';

const S = '"actionledger"';

t.test(
  'the schedule’s last completed pass and the workers’ heartbeats: read from the database, exposed as gauges at scrape time',
  async (t) => {
    const e = await dispatchEnv(t);
    const m = new Metrics({ defaultMetrics: false });
    const scrape = async (): Promise<string> => {
      await m.readLedger(async () => ({
        ...(await e.ledger.status()),
        fleet: await readFleetHealth(e.pool, 'actionledger', S),
      }));
      return m.exposition();
    };

    const never = await readFleetHealth(e.pool, 'actionledger', S);
    t.same(never, { schedule: null, workers: [] }, 'no schedule started here, no worker yet');
    t.notMatch(
      await scrape(),
      /^actionledger_reconcile_schedule_last_completed_timestamp_seconds\{/m,
      'no schedule: the gauge has no sample',
    );

    const kit = await openReconciler(e.runtime, e.env);
    t.teardown(() => kit.close());
    const schedule = new ReconcileSchedule({
      databaseUrl: e.url,
      schema: 'actionledger',
      cron: '0 0 1 1 *', // never due in the test: its passes are the ones runNow() asks for
      log: e.runtime.log,
      run: (signal) => kit.pass(signal),
    });
    t.teardown(() => schedule.stop());
    await schedule.start();
    const created = await readFleetHealth(e.pool, 'actionledger', S);
    const { rows: sched } = await e.pool.query<{ at: number }>(
      `SELECT extract(epoch FROM created_on)::float8 AS at FROM actionledger_pgboss.schedule WHERE name = $1`,
      [RECONCILE_QUEUE],
    );
    t.same(
      created.schedule,
      { queue: RECONCILE_QUEUE, last_completed_at_s: sched[0]?.at },
      'no pass completed yet: the schedule’s creation stands in',
    );

    const id = await schedule.runNow();
    // The job completes once its pass has run; wait for that (the loop polls every 2 s).
    let state: string | undefined;
    for (let i = 0; i < 300 && state !== 'completed'; i++) {
      if (i > 0) await new Promise((r) => setTimeout(r, 100));
      const { rows } = await e.pool.query<{ state: string }>(
        `SELECT state FROM actionledger_pgboss.job WHERE id = $1`,
        [id],
      );
      state = rows[0]?.state;
    }
    t.equal(state, 'completed', 'the pass completed its job');
    const { rows: jobs } = await e.pool.query<{ at: number | null }>(
      `SELECT extract(epoch FROM max(completed_on))::float8 AS at FROM actionledger_pgboss.job
       WHERE name = $1 AND state = 'completed'`,
      [RECONCILE_QUEUE],
    );
    const after = await readFleetHealth(e.pool, 'actionledger', S);
    t.equal(after.schedule?.last_completed_at_s, jobs[0]?.at);
    t.ok((after.schedule?.last_completed_at_s ?? 0) >= (created.schedule?.last_completed_at_s ?? Infinity));
    t.match(
      await scrape(),
      new RegExp(
        `^actionledger_reconcile_schedule_last_completed_timestamp_seconds\\{queue="${RECONCILE_QUEUE}"\\} ${jobs[0]?.at}$`,
        'm',
      ),
    );
    await schedule.stop();

    // Workers: one heartbeating, one silent for 90 s (hung or killed), one that stopped, one silent for two
    // hours (long dead: its claims were taken; it no longer counts).
    await e.pool.query(
      `INSERT INTO ${S}.workers (worker_id, pid, host, heartbeat_at, stopped_at) VALUES
         ('h:1:live', 1, 'h', now(), NULL),
         ('h:2:silent', 2, 'h', now() - interval '90 seconds', NULL),
         ('h:3:stopped', 3, 'h', now() - interval '90 seconds', now() - interval '90 seconds'),
         ('h:4:gone', 4, 'h', now() - interval '2 hours', NULL)`,
    );
    const health = await readFleetHealth(e.pool, 'actionledger', S);
    t.same(
      health.workers.map((w) => w.worker),
      ['h:1:live', 'h:2:silent'],
    );
    const age = (id: string): number => health.workers.find((w) => w.worker === id)?.heartbeat_age_s ?? NaN;
    t.ok(age('h:1:live') >= 0 && age('h:1:live') < 60, `live: ${age('h:1:live')}`);
    t.ok(age('h:2:silent') >= 90 && age('h:2:silent') < 3600, `silent: ${age('h:2:silent')}`);
    const gauges = await scrape();
    t.match(gauges, /^actionledger_worker_heartbeat_age_seconds\{worker="h:2:silent"\} 9\d(\.\d+)?$/m);
    t.notMatch(gauges, /worker="h:3:stopped"|worker="h:4:gone"/, 'stopped and long-dead workers are left out');

    // The silent worker says it stopped: it leaves the next scrape (the gauge is reset, not left at its last value).
    await e.pool.query(`UPDATE ${S}.workers SET stopped_at = now() WHERE worker_id = 'h:2:silent'`);
    t.notMatch(await scrape(), /worker="h:2:silent"/);
  },
);
