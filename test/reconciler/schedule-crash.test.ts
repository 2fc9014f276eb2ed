import t from 'tap';
import { spawn, type ChildProcess } from 'node:child_process';
import PgBoss from 'pg-boss';
import { createLogger } from '../../core/log.js';
import { RECONCILE_QUEUE, ReconcileSchedule } from '../../reconciler/index.js';
import { BIN } from '../helpers/cli.js';
import { ctx, dispatchEnv, settled, type DispatchEnv } from '../helpers/fleet.js';
import { nodeCommand } from '../helpers/node-child.js';

function exited(child: ChildProcess): Promise<{ code: number | null; signal: string | null }> {
  return new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
}

/** A process armed to SIGKILL itself at `crashAt`, running `actionledger` with `args`. */
function armed(e: DispatchEnv, args: string[], crashAt: string): ChildProcess {
  return spawn(...nodeCommand([BIN, ...args]), {
    env: {
      PATH: process.env.PATH,
      ...e.env,
      LOG_LEVEL: 'info',
      ACTIONLEDGER_CRASH_POINTS_ENABLED: '1',
      ACTIONLEDGER_CRASH_AT: crashAt,
    },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
}

function logged(child: ChildProcess, pattern: RegExp): Promise<void> {
  return new Promise((resolve, reject) => {
    let seen = '';
    child.stderr?.on('data', (c: Buffer) => {
      seen += c.toString();
      if (pattern.test(seen)) resolve();
    });
    child.once('exit', () => reject(new Error(`exited before logging ${pattern}: ${seen}`)));
  });
}

t.test(
  'a scheduled pass SIGKILLed mid-run does not hold back the next: the next scheduled pass resolves the orphan',
  async (t) => {
    const e = await dispatchEnv(t);
    const r = await e.ledger.reserve(ctx('pass-killed'), 'issue_refund', {
      order_id: 'o-k',
      amount: 100,
      currency: 'EUR',
    });
    const worker = await exited(armed(e, ['dispatcher', '--concurrency', '1'], 'after_response_before_outcome'));
    t.equal(
      worker.signal,
      'SIGKILL',
      'the worker died after the provider applied the effect: an orphaned executing operation',
    );

    // The schedule in another process, armed to die right after its pass read the orphan back.
    const first = armed(e, ['reconcile'], 'reconcile_after_readback');
    const firstExit = exited(first);
    await logged(first, /reconciliation scheduled/);
    // Jobs as pg-boss's cron sends them, until a pass finds the orphan (once its worker's heartbeat is stale).
    const sender = new PgBoss({
      connectionString: e.url,
      schema: 'actionledger_pgboss',
      supervise: false,
      schedule: false,
      migrate: false,
      max: 1,
    });
    await sender.start();
    let died: { code: number | null; signal: string | null } | undefined;
    void firstExit.then((x) => (died = x));
    for (let i = 0; i < 60 && died === undefined; i++) {
      await sender.send(RECONCILE_QUEUE, {});
      await Promise.race([firstExit, new Promise((res) => setTimeout(res, 1000))]);
    }
    await sender.stop({ graceful: false, close: true });
    t.equal((await firstExit).signal, 'SIGKILL', 'the pass died mid-run');
    const checks = await e.pool.query<{ n: number }>(
      'SELECT count(*)::int AS n FROM actionledger.reconciliation_checks WHERE operation_id = $1',
      [r.operation_id],
    );
    t.equal(checks.rows[0]!.n, 0, 'its check was never committed');
    const { rows } = await e.pool.query<{ status: string }>(
      'SELECT status FROM actionledger.operations WHERE operation_id = $1',
      [r.operation_id],
    );
    t.equal(rows[0]!.status, 'executing', 'the orphan is still unresolved');

    // The next schedule (as a restarted fleet would start it) gets a job; its pass must run and resolve the orphan.
    const kit = await e.reconciler();
    const next = new ReconcileSchedule({
      databaseUrl: e.url,
      schema: 'actionledger',
      cron: '0 0 1 1 *',
      log: createLogger({ level: 'silent', name: 'test' }),
      run: (signal) => kit.pass(signal),
    });
    t.teardown(() => next.stop());
    await next.start();
    await next.runNow();
    // 30 s is the test's patience, far below the 15-minute job expiry a singleton queue waited for.
    const after = await settled(e.pool, r.operation_id, 30_000);
    t.equal(after.status, 'succeeded', 'the next pass read the effect back');
    t.equal(e.provider.requestsFor(r.effect_key), 1, 'the provider saw exactly one request');
  },
);
