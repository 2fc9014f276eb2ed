/**
 * The fleet's reconciliation schedule on pg-boss 10: a cron schedule (UTC) sends one job per due minute to
 * a `singleton` queue (pg-boss's cron monitor inserts it under a per-minute singleton key, so however many
 * fleets run the schedule, each due minute yields one job, and the queue runs one job at a time). The pass
 * itself also takes the reconciler's advisory lock, so a fleet's pass and a CronJob's `reconcile --once`
 * never run at once either.
 */
import PgBoss from 'pg-boss';
import type { Logger } from '../core/log.js';

export const RECONCILE_QUEUE = 'actionledger-reconcile';

export interface ReconcileScheduleOptions {
  databaseUrl: string;
  /** The actionledger schema; pg-boss keeps its tables in `<schema>_pgboss`. */
  schema: string;
  cron: string;
  log: Logger;
  run(): Promise<unknown>;
}

export class ReconcileSchedule {
  readonly #o: ReconcileScheduleOptions;
  #boss: PgBoss | undefined;

  constructor(options: ReconcileScheduleOptions) {
    this.#o = options;
  }

  get bossSchema(): string {
    return `${this.#o.schema}_pgboss`;
  }

  async start(): Promise<void> {
    const boss = new PgBoss({
      connectionString: this.#o.databaseUrl,
      schema: this.bossSchema,
      application_name: 'actionledger:reconcile-schedule',
      max: 3,
      // A pass that outlives this is stuck: fail the job so the next minute's can run.
      expireInSeconds: 15 * 60,
      retryLimit: 0,
    });
    boss.on('error', (err: Error) => this.#o.log.warn({ err }, 'pg-boss error'));
    this.#boss = boss;
    await boss.start();
    await createQueueOnce(boss);
    await boss.schedule(RECONCILE_QUEUE, this.#o.cron, {}, { tz: 'UTC' });
    await boss.work(RECONCILE_QUEUE, { pollingIntervalSeconds: 2, batchSize: 1 }, async () => {
      const summary = await this.#o.run();
      return summary as object;
    });
    this.#o.log.info({ cron: this.#o.cron, queue: RECONCILE_QUEUE, schema: this.bossSchema }, 'reconciliation scheduled');
  }

  /** Queues a pass now (operators, tests); the singleton queue still runs one at a time. */
  async runNow(): Promise<string | null> {
    if (this.#boss === undefined) throw new Error('schedule not started');
    return this.#boss.send(RECONCILE_QUEUE, {});
  }

  /** The schedules pg-boss holds, for status and tests. */
  async schedules(): Promise<{ name: string; cron: string }[]> {
    if (this.#boss === undefined) return [];
    return (await this.#boss.getSchedules()).map((s) => ({ name: s.name, cron: s.cron }));
  }

  async stop(): Promise<void> {
    const boss = this.#boss;
    this.#boss = undefined;
    await boss?.stop({ graceful: true, wait: true, timeout: 30_000 });
  }
}

/**
 * pg-boss 10's create_queue inserts the queue row and creates its partition in one statement; two fleets
 * starting at the same moment can deadlock there (40P01, seen in the tests). The loser retries and then finds
 * the queue made.
 */
async function createQueueOnce(boss: PgBoss): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    try {
      if ((await boss.getQueue(RECONCILE_QUEUE)) !== null) return;
      await boss.createQueue(RECONCILE_QUEUE, { name: RECONCILE_QUEUE, policy: 'singleton', retryLimit: 0 });
      return;
    } catch (err) {
      const code = (err as { code?: string }).code;
      if ((code !== '40P01' && code !== '23505') || attempt >= 5) throw err;
      await new Promise((r) => setTimeout(r, 50 + Math.random() * 200));
    }
  }
}
