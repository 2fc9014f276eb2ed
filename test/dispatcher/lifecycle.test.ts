/**
 * A dispatcher's start and stop: it can be stopped and started again, opened again on the same runtime, and a
 * stop resolves only once the worker has stopped, however many times it is called. Real PostgreSQL, the
 * sandbox provider and authorizer over mTLS, dispatchers built by openDispatcher.
 */
import t from 'tap';
import { createPool } from '../../db/db.js';
import { dispatcherPoolFloor, FLOOR_REOPEN_INTERVAL_MS, openDispatcher } from '../../dispatcher/index.js';
import { ctx, dispatchEnv, settled } from '../helpers/fleet.js';

const args = (n: number) => ({ order_id: `ord-${n}`, amount: 100 + n, currency: 'EUR' });

t.test('a dispatcher stopped and opened again on the same runtime dispatches again', async (t) => {
  const e = await dispatchEnv(t);
  const first = await openDispatcher(e.runtime, e.env, { concurrency: 2 });
  t.teardown(() => first.stop(5000));
  await first.start();
  const a = await e.ledger.reserve(ctx('a'), 'issue_refund', args(1));
  t.equal((await settled(e.pool, a.operation_id)).status, 'succeeded');
  await first.stop(5000);

  const second = await openDispatcher(e.runtime, e.env, { concurrency: 2 });
  t.teardown(() => second.stop(5000));
  await second.start();
  const b = await e.ledger.reserve(ctx('b'), 'issue_refund', args(2));
  t.equal(
    (await settled(e.pool, b.operation_id)).status,
    'succeeded',
    'the second dispatcher on the same runtime works',
  );
  const claims = await e.runtime.metrics.registry.getSingleMetric('actionledger_claims_total')?.get();
  t.equal(claims?.values[0]?.value, 2, 'both count on the one registered metric');
});

t.test("start() opens the worker's pool floor", async (t) => {
  const e = await dispatchEnv(t);
  await e.dispatcher(8);
  t.ok(e.pool.totalCount >= dispatcherPoolFloor(8), `the floor, opened at start (${e.pool.totalCount})`);
  t.equal(
    dispatcherPoolFloor(8),
    7,
    "LISTEN, the openings of two providers' dispatch batchers, a quarter of the slots",
  );
  t.equal(dispatcherPoolFloor(32), 13);
});

t.test('a worker whose pool lost its connections opens its floor again once the database answers', async (t) => {
  const e = await dispatchEnv(t);
  const floor = dispatcherPoolFloor(8);
  const name = 'floor-reopened';
  const pool = createPool(e.url, { max: 20, min: floor, statementTimeoutMs: 30_000, applicationName: name });
  const d = await openDispatcher({ ...e.runtime, pool }, e.env, { concurrency: 8 });
  t.teardown(async () => {
    await d.stop(5000);
    await pool.end();
  });
  const sessions = async (): Promise<number> =>
    (
      await e.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1', [
        name,
      ])
    ).rows[0]!.n;
  await d.start();
  t.ok((await sessions()) >= floor, 'the floor, opened at start');
  // Every session of the worker's pool is ended by the server, as a restart or failover would.
  await e.pool.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1', [name]);
  for (const deadline = Date.now() + 10_000; pool.totalCount >= floor && Date.now() < deadline;)
    await new Promise((r) => setTimeout(r, 20));
  t.ok(pool.totalCount < floor, `the pool dropped the dead connections (${pool.totalCount} left)`);
  // Nothing is dispatched meanwhile: only the heartbeat (every 500 ms) and the LISTEN reconnect ask for
  // connections, which alone would leave the pool at two. The wait outlasts one reopening interval: an attempt
  // that caught clients whose sessions were still ending is wasted.
  let open = 0;
  for (const deadline = Date.now() + 2 * FLOOR_REOPEN_INTERVAL_MS + 5_000; open < floor && Date.now() < deadline;) {
    await new Promise((r) => setTimeout(r, 50));
    open = await sessions();
  }
  t.ok(open >= floor, `the floor is open again on the server (${open} of ${floor})`);
  const a = await e.ledger.reserve(ctx('after'), 'issue_refund', args(1));
  t.equal((await settled(e.pool, a.operation_id)).status, 'succeeded', 'and it dispatches');
});

t.test('start() after stop() runs the worker again', async (t) => {
  const e = await dispatchEnv(t);
  const d = await e.dispatcher(2);
  const a = await e.ledger.reserve(ctx('a'), 'issue_refund', args(1));
  t.equal((await settled(e.pool, a.operation_id)).status, 'succeeded');
  await d.stop(5000);
  const { rows: stopped } = await e.pool.query<{ stopped: boolean }>(
    'SELECT stopped_at IS NOT NULL AS stopped FROM actionledger.workers',
  );
  t.same(stopped, [{ stopped: true }], 'marked stopped');

  await d.start();
  const { rows: live } = await e.pool.query<{ stopped: boolean }>(
    'SELECT stopped_at IS NOT NULL AS stopped FROM actionledger.workers',
  );
  t.same(live, [{ stopped: false }], 'live again');
  const b = await e.ledger.reserve(ctx('b'), 'issue_refund', args(2));
  t.equal(
    (await settled(e.pool, b.operation_id)).status,
    'succeeded',
    'an operation reserved after the restart is dispatched',
  );
  t.equal(e.provider.requestsFor(b.effect_key), 1);
});

t.test('stop() before start() does nothing and start() still works', async (t) => {
  const e = await dispatchEnv(t);
  const d = await openDispatcher({ ...e.runtime }, e.env, { concurrency: 2 });
  t.teardown(() => d.stop(5000));
  await d.stop(5000);
  await d.stop(5000);
  const { rows } = await e.pool.query('SELECT 1 FROM actionledger.workers');
  t.equal(rows.length, 0, 'nothing was registered');
  await d.start();
  const a = await e.ledger.reserve(ctx('a'), 'issue_refund', args(1));
  t.equal((await settled(e.pool, a.operation_id)).status, 'succeeded');
});

t.test('every concurrent stop() resolves only once the worker has stopped', async (t) => {
  const e = await dispatchEnv(t);
  const slow = await e.ledger.reserve(ctx('slow'), 'issue_refund', args(1));
  // Answered only after the client's 1 s timeout: the stop has an operation in flight to wait for.
  e.provider.inject({ kind: 'hangHeaders', commit: true }, { when: (key) => key === slow.effect_key });
  const d = await e.dispatcher(2);
  const deadline = Date.now() + 10_000;
  while (e.provider.requestsFor(slow.effect_key) === 0 && Date.now() < deadline)
    await new Promise((r) => setTimeout(r, 10));
  t.equal(d.inFlight, 1, 'one operation in flight');
  const seen: { inFlight: number; stopped: boolean }[] = [];
  const observe = async (): Promise<void> => {
    const { rows } = await e.pool.query<{ stopped: boolean }>(
      'SELECT stopped_at IS NOT NULL AS stopped FROM actionledger.workers',
    );
    seen.push({ inFlight: d.inFlight, stopped: rows[0]?.stopped === true });
  };
  await Promise.all([d.stop(10_000).then(observe), d.stop(10_000).then(observe), d.stop(10_000).then(observe)]);
  t.same(
    seen,
    [
      { inFlight: 0, stopped: true },
      { inFlight: 0, stopped: true },
      { inFlight: 0, stopped: true },
    ],
    'each call resolved after the in-flight operation finished and the worker was marked stopped',
  );
  t.equal(
    (await settled(e.pool, slow.operation_id)).status,
    'unknown',
    'its outcome was recorded before the stop returned',
  );
});

t.test('a stop called while another drains resolves after it; stop after stop resolves at once', async (t) => {
  const e = await dispatchEnv(t);
  const slow = await e.ledger.reserve(ctx('slow-2'), 'issue_refund', args(3));
  e.provider.inject({ kind: 'hangHeaders', commit: true }, { when: (key) => key === slow.effect_key });
  const d = await e.dispatcher(2);
  const deadline = Date.now() + 10_000;
  while (e.provider.requestsFor(slow.effect_key) === 0 && Date.now() < deadline)
    await new Promise((r) => setTimeout(r, 10));
  t.equal(d.inFlight, 1, 'one operation in flight');
  const order: string[] = [];
  const first = d.stop(10_000).then(() => void order.push(`first:${d.inFlight}`));
  // Called while the first drains: it must not overtake it.
  await new Promise((r) => setTimeout(r, 50));
  const second = d.stop(10_000).then(() => void order.push(`second:${d.inFlight}`));
  await Promise.all([first, second]);
  t.same(order, ['first:0', 'second:0'], 'the second stop resolved after the first, with nothing in flight');
  await d.stop(10_000);
  t.pass('a stop after stop resolves');
  const { rows } = await e.pool.query<{ stopped: boolean }>(
    'SELECT stopped_at IS NOT NULL AS stopped FROM actionledger.workers',
  );
  t.same(rows, [{ stopped: true }], 'the worker is marked stopped');
});

t.test("a batch statement retrying a conflict gives up at the stop's deadline and sends nothing", async (t) => {
  const e = await dispatchEnv(t);
  // Every evidence statement fails with a serialization failure, a conflict the batch retries (100 ms, doubling),
  // and counts its tries.
  await e.pool.query(`
    CREATE SEQUENCE public.evidence_tries;
    CREATE FUNCTION public.conflict() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      PERFORM nextval('public.evidence_tries');
      RAISE EXCEPTION 'simulated conflict' USING ERRCODE = '40001';
    END $$;
    CREATE TRIGGER conflict BEFORE INSERT ON actionledger.authorization_evidence
      FOR EACH ROW EXECUTE FUNCTION public.conflict();`);
  // The count survives the failed statement's rollback: sequences are not transactional.
  const tries = async () =>
    (
      await e.pool.query<{ n: string }>(
        'SELECT CASE WHEN is_called THEN last_value ELSE 0 END AS n FROM public.evidence_tries',
      )
    ).rows[0]!.n;
  const op = await e.ledger.reserve(ctx('retrying'), 'issue_refund', args(1));
  const d = await openDispatcher(e.runtime, e.env, { concurrency: 1 });
  t.teardown(() => d.stop(5000));
  await d.start();
  const deadline = Date.now() + 10_000;
  while ((await tries()) === '0' && Date.now() < deadline) await new Promise((r) => setTimeout(r, 5));
  t.ok(Number(await tries()) >= 1, 'the first evidence statement failed, and the batch retries');
  await d.stop(50);
  const atStop = await tries();
  // Longer than every wait the policy has left (100 + 200 + 400 + 800 ms).
  await new Promise((r) => setTimeout(r, 2_000));
  t.equal(await tries(), atStop, 'no evidence statement ran after the stop returned');
  const { rows } = await e.pool.query<{ status: string }>(
    'SELECT status FROM actionledger.operations WHERE operation_id = $1',
    [op.operation_id],
  );
  t.equal(rows[0]?.status, 'executing', 'the claim stays executing for the reconciler');
  t.equal(e.provider.requestsFor(op.effect_key), 0, 'nothing was sent');
});

t.test('stop, start, stop asked for in a row: the last one wins, the dispatcher ends stopped', async (t) => {
  const e = await dispatchEnv(t);
  const d = await openDispatcher(e.runtime, e.env, { concurrency: 2 });
  t.teardown(() => d.stop(2000));
  await d.start();
  const first = d.stop(2000);
  const again = d.start();
  const last = d.stop(2000);
  await Promise.all([first, again, last]);
  t.equal(d.lifecycle, 'idle', 'stopped once the last stop resolved');
  const op = await e.ledger.reserve(ctx('after-the-last-stop'), 'issue_refund', args(99));
  await new Promise((r) => setTimeout(r, 1500));
  const { rows } = await e.pool.query<{ status: string }>(
    `SELECT status FROM ${e.config.schemaQuoted}.operations WHERE operation_id = $1`,
    [op.operation_id],
  );
  t.equal(rows[0]?.status, 'pending', 'nothing claims after it');
  const worker = await e.pool.query<{ stopped: boolean }>(
    `SELECT stopped_at IS NOT NULL AS stopped FROM ${e.config.schemaQuoted}.workers WHERE worker_id = $1`,
    [d.workerId],
  );
  t.same(worker.rows, [{ stopped: true }], 'its worker row says stopped');
});
