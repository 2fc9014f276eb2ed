/**
 * withTransaction against a real PostgreSQL: a connection cut from another session in the middle of a
 * transaction rejects the call with a coded error, the process survives, and the pool goes on working. And the
 * pool's floor: `warmPool` opens connections, `min` keeps them open while idle.
 */
import t, { type Test } from 'tap';
import { createPool, warmPool, withTransaction } from '../../core/db.js';
import { isActionLedgerError } from '../../core/errors.js';
import { createTestDatabase } from '../helpers/db.js';

/** A test database, a pool of `max` on it, and the uncaught exceptions seen until the test ends. */
async function poolWatchingUncaught(t: Test, max: number) {
  const url = await createTestDatabase(t);
  const pool = createPool(url, { max, statementTimeoutMs: 30_000, applicationName: 'db-test' });
  t.teardown(() => pool.end());
  const uncaught: unknown[] = [];
  const onUncaught = (err: unknown): void => void uncaught.push(err);
  process.on('uncaughtException', onUncaught);
  t.teardown(() => void process.off('uncaughtException', onUncaught));
  return { url, pool, uncaught };
}

t.test('a connection cut mid-transaction rejects with database_unavailable and the process survives', async (t) => {
  const { url, pool, uncaught } = await poolWatchingUncaught(t, 2);

  for (const where of ['idle in the transaction', 'in a statement'] as const) {
    let pidSeen!: (pid: number) => void;
    const pid = new Promise<number>((r) => (pidSeen = r));
    let proceed!: () => void;
    const cut = new Promise<void>((r) => (proceed = r));
    // Its rejection is taken at once: the cut may land while this test still waits for the killer.
    const outcome = withTransaction(pool, async (c) => {
      const { rows } = await c.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
      pidSeen(rows[0]!.pid);
      if (where === 'in a statement') await c.query('SELECT pg_sleep(30)');
      else await cut;
      await c.query('SELECT 1');
    }).then(
      () => undefined,
      (e: unknown) => e,
    );
    const killer = createPool(url, { max: 1, statementTimeoutMs: 30_000, applicationName: 'db-test-killer' });
    const { rows } = await killer.query<{ ok: boolean }>('SELECT pg_terminate_backend($1) AS ok', [await pid]);
    await killer.end();
    t.same(rows, [{ ok: true }], `the backend was terminated (${where})`);
    // Let the socket's end (and pg's 'error' event) arrive before the transaction goes on.
    await new Promise((r) => setTimeout(r, 200));
    proceed();
    const err = await outcome;
    t.ok(isActionLedgerError(err, 'database_unavailable'), `rejected with database_unavailable (${where})`);
  }
  await new Promise((r) => setTimeout(r, 100));
  t.same(uncaught, [], 'no uncaught error event');
  const { rows } = await withTransaction(pool, (c) => c.query<{ n: number }>('SELECT 1 AS n'));
  t.same(rows, [{ n: 1 }], 'the pool still serves transactions');
});

t.test("a checked-out client's error with no listener of its own does not end the process", async (t) => {
  const { url, pool, uncaught } = await poolWatchingUncaught(t, 1);
  // Held idle, as a lock connection is across a pass, with no 'error' listener of the caller's.
  const held = await pool.connect();
  const { rows } = await held.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
  const ended = new Promise<void>((r) => held.once('end', () => r()));
  const killer = createPool(url, { max: 1, statementTimeoutMs: 30_000, applicationName: 'db-test-killer' });
  await killer.query('SELECT pg_terminate_backend($1)', [rows[0]!.pid]);
  await killer.end();
  await ended;
  t.same(uncaught, [], 'no uncaught error event');
  await t.rejects(held.query('SELECT 1'), /not queryable|Connection terminated/, 'the held client is not queryable');
  held.release();
  const again = await pool.query<{ n: number }>('SELECT 1 AS n');
  t.same(again.rows, [{ n: 1 }], 'the pool discarded it and serves on a new connection');
});

t.test('warmPool opens connections up to its count and the pool max; min keeps them open while idle', async (t) => {
  const url = await createTestDatabase(t);
  const watcher = createPool(url, { max: 1, statementTimeoutMs: 30_000, applicationName: 'db-test-watcher' });
  t.teardown(() => watcher.end());
  const backends = async (name: string): Promise<number> => {
    const { rows } = await watcher.query<{ n: number }>(
      'SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1',
      [name],
    );
    return rows[0]!.n;
  };
  await backends('warm the watcher');
  for (const [name, min, kept] of [
    ['db-test-min', 3, 3],
    ['db-test-no-min', undefined, 0],
  ] as const) {
    const pool = createPool(url, {
      max: 6,
      ...(min === undefined ? {} : { min }),
      statementTimeoutMs: 30_000,
      applicationName: name,
    });
    t.teardown(() => pool.end());
    // pg-pool closes an idle connection above `min` after this long (10 s unless set); shortened for the test.
    (pool.options as { idleTimeoutMillis?: number }).idleTimeoutMillis = 1_000;
    t.equal(await warmPool(pool, 5), 5, `${name}: five connections open`);
    t.equal(pool.idleCount, 5, `${name}: all given back`);
    t.equal(await backends(name), 5, `${name}: five server sessions`);
    const deadline = Date.now() + 10_000;
    while (pool.totalCount > kept && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    await new Promise((r) => setTimeout(r, 1_300));
    t.equal(pool.totalCount, kept, `${name}: ${kept} left open after the idle timeout`);
    t.equal(await backends(name), kept, `${name}: ${kept} server sessions`);
  }
});

t.test('warmPool counts the clients others hold toward its count: it tops the pool up, never past it', async (t) => {
  const url = await createTestDatabase(t);
  const pool = createPool(url, { max: 8, statementTimeoutMs: 30_000, applicationName: 'db-test-top-up' });
  t.teardown(() => pool.end());
  const held = [await pool.connect(), await pool.connect()];
  t.equal(await warmPool(pool, 5), 5, 'two held elsewhere: three more opened, five in all');
  t.equal(pool.idleCount, 3, 'the three given back; the slots left stay free for callers');
  t.equal(await warmPool(pool, 5), 5, 'at its count already: nothing opened');
  for (const c of held) c.release();
});

t.test("warmPool never waits for another caller's client", async (t) => {
  const url = await createTestDatabase(t);
  const pool = createPool(url, { max: 3, statementTimeoutMs: 30_000, applicationName: 'db-test-busy' });
  t.teardown(() => pool.end());
  const a = await pool.connect();
  const b = await pool.connect();
  t.equal(await warmPool(pool, 5), 3, 'two held elsewhere: it opens the one left, and returns at once');
  t.equal(pool.idleCount, 1, 'and gives it back');
  const c = await pool.connect();
  // A wait here would last the 60 s given, past the test's timeout.
  t.equal(await warmPool(pool, 5, 60_000), 3, 'all three held: nothing to open, no wait');
  const waiter = pool.connect();
  t.equal(pool.waitingCount, 1, 'a caller waits for a client');
  t.equal(await warmPool(pool, 5, 60_000), 3, 'it does not queue beside that caller');
  a.release();
  (await waiter).release();
  b.release();
  c.release();
  t.equal(await warmPool(pool, 5), 3, 'all idle: it stops at the max');
});
