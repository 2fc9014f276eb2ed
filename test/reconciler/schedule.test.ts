import t, { type Test } from 'tap';
import { createServer, connect, type Socket } from 'node:net';
import { Writable } from 'node:stream';
import PgBoss from 'pg-boss';
import { createLogger } from '../../core/log.js';
import { LEGACY_RECONCILE_QUEUE, RECONCILE_QUEUE, ReconcileSchedule } from '../../reconciler/index.js';
import { createTestDatabase } from '../helpers/db.js';
import { throughPort } from '../helpers/net.js';

const silent = createLogger({ level: 'silent', name: 'test' });

async function until(what: string, ok: () => boolean, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

function schedule(
  url: string,
  run: (signal: AbortSignal) => Promise<unknown>,
  extra: { log?: ReturnType<typeof createLogger>; stopDeadlineMs?: number } = {},
): ReconcileSchedule {
  return new ReconcileSchedule({
    databaseUrl: url,
    schema: 'actionledger',
    cron: '*/5 * * * *',
    log: extra.log ?? silent,
    run,
    ...(extra.stopDeadlineMs === undefined ? {} : { stopDeadlineMs: extra.stopDeadlineMs }),
  });
}

t.test('the pg-boss schedule: cron registered once, every queued pass runs in either fleet', async (t) => {
  const url = await createTestDatabase(t);
  let runs = 0;
  const run = (): Promise<object> => {
    runs++;
    return Promise.resolve({ ok: true });
  };
  const a = schedule(url, run);
  const b = schedule(url, run);
  t.teardown(async () => {
    await a.stop();
    await b.stop();
  });
  await Promise.all([a.start(), b.start()]);
  t.same(
    await a.schedules(),
    [{ name: RECONCILE_QUEUE, cron: '*/5 * * * *' }],
    'one schedule, however many fleets register it',
  );
  for (let i = 0; i < 2; i++) {
    await a.runNow();
    await b.runNow();
  }
  await until('4 passes', () => runs >= 4);
  t.equal(runs, 4, 'every queued pass ran');
});

t.test(
  'a deployment with the legacy singleton queue wedged by a dead pass: its schedule and waiting jobs are removed, passes run',
  async (t) => {
    const url = await createTestDatabase(t);
    const old = new PgBoss({
      connectionString: url,
      schema: 'actionledger_pgboss',
      supervise: false,
      schedule: false,
      max: 1,
    });
    await old.start();
    await old.createQueue(LEGACY_RECONCILE_QUEUE, { name: LEGACY_RECONCILE_QUEUE, policy: 'singleton', retryLimit: 0 });
    await old.schedule(LEGACY_RECONCILE_QUEUE, '* * * * *', {}, { tz: 'UTC' });
    await old.send(LEGACY_RECONCILE_QUEUE, {});
    t.equal(
      (await old.fetch(LEGACY_RECONCILE_QUEUE)).length,
      1,
      'a pass took the job and its process died: the job stays active',
    );
    await old.send(LEGACY_RECONCILE_QUEUE, {});
    await old.stop({ graceful: false, close: true });

    let runs = 0;
    const s = schedule(url, () => Promise.resolve(++runs));
    t.teardown(() => s.stop());
    await s.start();
    t.same(await s.schedules(), [{ name: RECONCILE_QUEUE, cron: '*/5 * * * *' }], 'the legacy schedule is gone');
    await s.runNow();
    await until('a pass', () => runs >= 1);
    t.equal(runs, 1);
    const check = new PgBoss({
      connectionString: url,
      schema: 'actionledger_pgboss',
      supervise: false,
      schedule: false,
      migrate: false,
      max: 1,
    });
    await check.start();
    t.equal(
      await check.getQueueSize(LEGACY_RECONCILE_QUEUE),
      0,
      'no job waits behind the dead one in the legacy queue',
    );
    t.match(await check.getQueue(RECONCILE_QUEUE), { policy: 'standard', retryLimit: 0 });
    await check.stop({ graceful: false, close: true });
  },
);

t.test(
  'stop() before start() and repeated; start() after stop() restarts; start() while running is refused',
  async (t) => {
    const url = await createTestDatabase(t);
    let runs = 0;
    const s = schedule(url, () => Promise.resolve(++runs));
    t.teardown(() => s.stop());
    await s.stop();
    await s.stop();
    t.equal(s.lifecycle, 'idle');
    await t.rejects(s.runNow(), { code: 'internal' }, 'no job can be queued on a stopped schedule');

    await s.start();
    t.equal(s.start(), s.start(), 'a second start() is the same start, not a second pg-boss');
    await s.start();
    await s.runNow();
    await until('the first pass', () => runs >= 1);
    await s.stop();
    await s.stop();
    t.equal(s.lifecycle, 'idle');
    await t.rejects(s.runNow(), { code: 'internal' });

    await s.start();
    t.equal(s.lifecycle, 'running', 'restarted');
    await s.runNow();
    await until('a pass after the restart', () => runs >= 2);
    t.equal(runs, 2);
    await s.stop();
  },
);

t.test('every stop() call resolves only after the pass in progress finished', async (t) => {
  const url = await createTestDatabase(t);
  const events: string[] = [];
  let release = (): void => undefined;
  let started = false;
  const s = schedule(url, async () => {
    started = true;
    await new Promise<void>((r) => (release = r));
    events.push('pass finished');
  });
  await s.start();
  await s.runNow();
  await until('the pass to start', () => started);
  const stops = [s.stop().then(() => events.push('stopped')), s.stop().then(() => events.push('stopped'))];
  setTimeout(() => release(), 300);
  await Promise.all(stops);
  t.same(events, ['pass finished', 'stopped', 'stopped']);
  t.equal(s.lifecycle, 'idle');
});

t.test('a pass still running at the stop deadline is aborted and stop() returns', async (t) => {
  const url = await createTestDatabase(t);
  let signal: AbortSignal | undefined;
  let finished = false;
  const s = schedule(
    url,
    async (sig) => {
      signal = sig;
      await new Promise((r) => sig.addEventListener('abort', r, { once: true }));
      finished = true;
    },
    { stopDeadlineMs: 500 },
  );
  await s.start();
  await s.runNow();
  await until('the pass to start', () => signal !== undefined);
  await s.stop();
  t.equal(signal?.aborted, true, 'the pass was told to take no new work');
  t.equal(s.lifecycle, 'idle');
  await until('the abandoned pass to return', () => finished);
  await s.start();
  t.equal(s.lifecycle, 'running', 'and the schedule can start again');
  await s.stop();
});

/** A TCP proxy to the database that can be cut, as a database host that goes away. */
async function cuttableProxy(t: Test, url: string): Promise<{ url: string; cut(): Promise<void> }> {
  const target = new URL(url);
  const sockets = new Set<Socket>();
  const server = createServer((client) => {
    const upstream = connect(Number(target.port || 5432), target.hostname);
    sockets.add(client).add(upstream);
    client.pipe(upstream).pipe(client);
    const end = (): void => {
      client.destroy();
      upstream.destroy();
    };
    client.on('error', end).on('close', end);
    upstream.on('error', end).on('close', end);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const address = server.address() as { port: number };
  const cut = async (): Promise<void> => {
    for (const s of sockets) s.destroy();
    await new Promise((r) => server.close(r));
  };
  t.teardown(() => (server.listening ? cut() : undefined));
  return { url: throughPort(url, address.port), cut };
}

t.test(
  'the database goes away while the schedule runs and stops: one log line per failure code, no unhandled rejection',
  async (t) => {
    const url = await createTestDatabase(t);
    const proxy = await cuttableProxy(t, url);
    const lines: Record<string, unknown>[] = [];
    const sink = new Writable({
      write(chunk: Buffer, _enc, done) {
        for (const l of chunk
          .toString()
          .split('\n')
          .filter((x) => x !== ''))
          lines.push(JSON.parse(l) as Record<string, unknown>);
        done();
      },
    });
    const log = createLogger({ level: 'info', name: 'test', destination: sink });
    const rejections: unknown[] = [];
    const onRejection = (err: unknown): void => void rejections.push(err);
    process.on('unhandledRejection', onRejection);
    t.teardown(() => void process.off('unhandledRejection', onRejection));

    let runs = 0;
    const s = schedule(proxy.url, () => Promise.resolve(++runs), { log });
    await s.start();
    await s.runNow();
    await until('a pass', () => runs >= 1);
    await proxy.cut();
    await until('pg-boss to notice', () => lines.some((l) => l.msg === 'reconciliation schedule: pg-boss error'));
    // Polls go on against the dead database for a while.
    await new Promise((r) => setTimeout(r, 5000));
    await s.stop();
    t.equal(s.lifecycle, 'idle', 'stop() resolves with the database gone');
    t.same(rejections, [], 'no unhandled rejection');
    const failures = lines.filter((l) => l.msg === 'reconciliation schedule: pg-boss error');
    const codes = failures.map((l) => l.code);
    t.same(codes, [...new Set(codes)], `one line per failure code within the interval (${codes.join(', ')})`);
    t.notOk(
      failures.some((l) => 'repeated' in l),
      'no repeat line within the 30 s interval',
    );
  },
);
