/**
 * The fleet's reconciliation schedule on pg-boss 10: pg-boss's cron (UTC) sends one job per due minute to a
 * standard queue (its cron monitor inserts the job under a per-minute singleton key, so however many fleets
 * run the schedule, each due minute yields one job), and each fleet fetches jobs from it one at a time.
 *
 * One pass at a time is the pass's own business: it takes the reconciler's advisory lock on its own
 * connection (a second pass returns at once, `ran: false`), so a fleet's pass and a CronJob's
 * `reconcile --once` never run at once either. The queue is deliberately not `singleton`: pg-boss keeps a
 * singleton job `active` until its expiry (15 minutes, found by its maintenance, every 2 minutes), so a pass
 * whose process died blocked every later one for up to 17 minutes. PostgreSQL releases an advisory lock when
 * its connection closes, which for a process that died is at once; for a host that vanished it is bounded by
 * the lock connection's TCP keepalives (60 s, see `passLock`). So the next pass after a dead one runs at the
 * first due cron minute after that: within about 2 minutes (a minute of cron, the cron monitor's 30 s, the
 * 5 s cron worker, this loop's 2 s poll, and up to 60 s of keepalive for a vanished host).
 *
 * States of one run (start() to stop()):
 *   stopped -> starting -> running: idle (polling every 2 s) <-> passing (one job) -> stopping -> stopped
 * stop() waits for a pass in progress up to its deadline, then aborts it (the pass stops taking candidates)
 * and returns; the abandoned pass's writes stay fenced as every pass's are. start() after stop() starts a new
 * run; start() on a schedule that is not stopped throws `already_running`.
 */
import PgBoss from 'pg-boss';
import { ActionLedgerError } from '../core/errors.js';
import { RepeatedFailureLog, type Logger } from '../core/log.js';
import { retry } from '../core/retry.js';
import { SQLSTATE, sqlState } from '../core/sqlstate.js';
import { Service } from '../core/service.js';

export const RECONCILE_QUEUE = 'actionledger-reconcile-pass';
/** The queue earlier versions created with the `singleton` policy; removed (with its schedule) at start. */
export const LEGACY_RECONCILE_QUEUE = 'actionledger-reconcile';

/** How often an idle schedule asks for a job. */
const POLL_MS = 2000;
/**
 * pg-boss fails an `active` job this long after it started (its maintenance runs every 2 minutes). Nothing
 * waits on it any more (the queue is standard); it only keeps the job table honest about a dead pass.
 */
const JOB_EXPIRE_SECONDS = 5 * 60;
export const STOP_DEADLINE_MS = 30_000;

export interface ReconcileScheduleOptions {
  databaseUrl: string;
  /** The actionledger schema; pg-boss keeps its tables in `<schema>_pgboss`. */
  schema: string;
  cron: string;
  log: Logger;
  /** One pass. `signal` is aborted when stop() gives up waiting for it: take no new work after that. */
  run(signal: AbortSignal): Promise<unknown>;
  /** How long stop() waits for a pass in progress before abandoning it; default 30 s. */
  stopDeadlineMs?: number;
}

/** One start()-to-stop() run: its own pg-boss instance, loop and abort signal. */
interface Run {
  boss: PgBoss;
  abort: AbortController;
  stopping: boolean;
  wake: () => void;
  loop: Promise<void>;
}

export class ReconcileSchedule extends Service {
  readonly #o: ReconcileScheduleOptions;
  readonly #passFailures: RepeatedFailureLog;
  readonly #bossFailures: RepeatedFailureLog;
  #run: Run | undefined;

  constructor(options: ReconcileScheduleOptions) {
    super();
    this.#o = options;
    this.#passFailures = new RepeatedFailureLog(options.log, 'reconciliation pass failed');
    this.#bossFailures = new RepeatedFailureLog(options.log, 'reconciliation schedule: pg-boss error');
  }

  get bossSchema(): string {
    return `${this.#o.schema}_pgboss`;
  }

  /**
   * Creates the queue and schedule (idempotent across fleets), removes the legacy singleton queue, and starts
   * fetching jobs. Throws pg errors when the database cannot be reached (the schedule is then stopped again and
   * may be started later).
   */
  protected async onStart(): Promise<void> {
    const boss = new PgBoss({
      connectionString: this.#o.databaseUrl,
      schema: this.bossSchema,
      application_name: 'actionledger:reconcile-schedule',
      max: 3,
      expireInSeconds: JOB_EXPIRE_SECONDS,
      retryLimit: 0,
    });
    // A dead database makes the cron and maintenance monitors fail every few seconds: one line per interval.
    boss.on('error', (err: Error) => this.#bossFailures.fail(err));
    try {
      await boss.start();
      await createQueueOnce(boss);
      await boss.updateQueue(RECONCILE_QUEUE, {
        name: RECONCILE_QUEUE,
        policy: 'standard',
        retryLimit: 0,
        expireInSeconds: JOB_EXPIRE_SECONDS,
      });
      await boss.schedule(RECONCILE_QUEUE, this.#o.cron, {}, { tz: 'UTC' });
      await this.#removeLegacyQueue(boss);
    } catch (err) {
      await closeBoss(boss, this.#bossFailures);
      throw err;
    }
    let wake = (): void => undefined;
    const run: Run = {
      boss,
      abort: new AbortController(),
      stopping: false,
      wake: () => wake(),
      loop: Promise.resolve(),
    };
    const sleep = (): Promise<void> =>
      new Promise((resolve) => {
        const timer = setTimeout(resolve, POLL_MS);
        wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    run.loop = this.#poll(run, sleep);
    this.#run = run;
    this.#o.log.info(
      { cron: this.#o.cron, queue: RECONCILE_QUEUE, schema: this.bossSchema },
      'reconciliation scheduled',
    );
  }

  /**
   * Deployments before the standard queue made `actionledger-reconcile` a singleton queue. Its schedule is
   * removed (so the cron stops feeding it) and its waiting jobs purged; a dead pass's `active` job there blocks
   * nothing any more and pg-boss expires it. pg-boss deletes a queue only once its table holds no job at all
   * (its foreign key is ON DELETE RESTRICT; finished jobs stay until archived, 12 hours by default), so the
   * queue row itself goes at a later start. A fleet still on the old version recreates the schedule when it
   * restarts; both then run passes and the advisory lock keeps them apart.
   */
  async #removeLegacyQueue(boss: PgBoss): Promise<void> {
    try {
      if ((await boss.getQueue(LEGACY_RECONCILE_QUEUE)) === null) return;
      await boss.unschedule(LEGACY_RECONCILE_QUEUE);
      await boss.purgeQueue(LEGACY_RECONCILE_QUEUE);
      try {
        await boss.deleteQueue(LEGACY_RECONCILE_QUEUE);
        this.#o.log.info({ queue: LEGACY_RECONCILE_QUEUE }, 'removed the legacy singleton reconciliation queue');
      } catch (err) {
        if (sqlState(err) !== SQLSTATE.foreignKeyViolation) throw err;
        this.#o.log.info(
          { queue: LEGACY_RECONCILE_QUEUE },
          'unscheduled the legacy singleton reconciliation queue; it is deleted once pg-boss has archived its jobs',
        );
      }
    } catch (err) {
      // Another fleet cleaning up at the same moment, or a database hiccup: the next start tries again.
      this.#o.log.warn({ err, queue: LEGACY_RECONCILE_QUEUE }, 'could not remove the legacy reconciliation queue');
    }
  }

  async #poll(run: Run, sleep: () => Promise<void>): Promise<void> {
    while (!run.stopping) {
      // pg-boss's fetch answers [] when the database cannot be reached (it swallows the error).
      const [job] = await run.boss.fetch(RECONCILE_QUEUE, { batchSize: 1 }).catch((err: unknown) => {
        this.#bossFailures.fail(err);
        return [];
      });
      if (job === undefined) {
        await sleep();
        continue;
      }
      if (run.stopping) {
        await run.boss
          .fail(RECONCILE_QUEUE, job.id, { message: 'schedule stopping' })
          .catch((err: unknown) => this.#bossFailures.fail(err));
        break;
      }
      let summary: unknown;
      try {
        summary = await this.#o.run(run.abort.signal);
        this.#passFailures.ok();
      } catch (err) {
        this.#passFailures.fail(err);
        await run.boss
          .fail(RECONCILE_QUEUE, job.id, { message: (err as Error).message })
          .catch((e: unknown) => this.#bossFailures.fail(e));
        continue;
      }
      const output = typeof summary === 'object' && summary !== null ? summary : {};
      await run.boss.complete(RECONCILE_QUEUE, job.id, output).catch((err: unknown) => this.#bossFailures.fail(err));
    }
  }

  /**
   * Queues a pass now (operators, tests), as the cron would. Throws `internal` when the schedule is not
   * running, pg errors when the database cannot be reached.
   */
  async runNow(): Promise<string | null> {
    const run = this.#run;
    if (this.lifecycle !== 'running' || run === undefined)
      throw new ActionLedgerError('internal', `the reconciliation schedule is ${this.lifecycle}`, {
        details: { state: this.lifecycle },
      });
    const id = await run.boss.send(RECONCILE_QUEUE, {});
    run.wake();
    return id;
  }

  /** The schedules pg-boss holds, for status and tests. */
  async schedules(): Promise<{ name: string; cron: string }[]> {
    const run = this.#run;
    if (run === undefined) return [];
    return (await run.boss.getSchedules()).map((s) => ({ name: s.name, cron: s.cron }));
  }

  /**
   * Stops fetching, waits for a pass in progress up to the deadline (then aborts it and leaves it), and closes
   * pg-boss. Never throws: a database that is gone is logged.
   */
  protected async onStop(): Promise<void> {
    const run = this.#run;
    if (run === undefined) return;
    run.stopping = true;
    run.wake();
    const deadlineMs = this.#o.stopDeadlineMs ?? STOP_DEADLINE_MS;
    let timer: NodeJS.Timeout | undefined;
    const finished = await Promise.race([
      run.loop.then(() => true),
      new Promise<false>((resolve) => {
        timer = setTimeout(() => resolve(false), deadlineMs);
      }),
    ]);
    clearTimeout(timer);
    if (!finished) {
      run.abort.abort();
      this.#o.log.warn(
        { deadline_ms: deadlineMs },
        'reconciliation pass still running at the stop deadline; abandoned (it takes no new work)',
      );
    }
    await closeBoss(run.boss, this.#bossFailures);
    this.#run = undefined;
  }
}

/** Stops pg-boss and closes its pool; a database that is gone is logged, never thrown. */
async function closeBoss(boss: PgBoss, failures: RepeatedFailureLog): Promise<void> {
  try {
    await boss.stop({ graceful: true, wait: true, close: true, timeout: 5000 });
  } catch (err) {
    failures.fail(err);
  }
  // A pg-boss whose start() failed half-way counts as stopped and leaves its pool open.
  const db = boss.getDb() as { opened?: boolean; close?: () => Promise<void> };
  if (db.opened === true) await db.close?.().catch((err: unknown) => failures.fail(err));
}

/**
 * pg-boss 10's create_queue inserts the queue row and creates its partition in one statement; two fleets
 * starting at the same moment can deadlock there (40P01, seen in the tests). The loser retries and then finds
 * the queue made.
 */
async function createQueueOnce(boss: PgBoss): Promise<void> {
  const lostRace = (err: unknown): boolean =>
    sqlState(err) === SQLSTATE.deadlockDetected || sqlState(err) === SQLSTATE.uniqueViolation;
  await retry(
    async () => {
      if ((await boss.getQueue(RECONCILE_QUEUE)) !== null) return;
      await boss.createQueue(RECONCILE_QUEUE, {
        name: RECONCILE_QUEUE,
        policy: 'standard',
        retryLimit: 0,
        expireInSeconds: JOB_EXPIRE_SECONDS,
      });
    },
    { tries: 6, baseDelayMs: 100, maxDelayMs: 400, jitter: 0.75, retryOn: lostRace },
  );
}
