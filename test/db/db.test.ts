/**
 * withTransaction against a real PostgreSQL: a connection cut from another session in the middle of a
 * transaction rejects the call with a coded error, the process survives, and the pool goes on working. The
 * pool's floor: `warmPool` opens connections, `min` keeps them open while idle. And the node-postgres adapter
 * (db/pg-adapter.ts): `queryThenCommit`, a statement and its COMMIT in one write (plain: two), the COMMIT skipped
 * when the statement fails, each case run with the shortcut and with the plain path.
 */
import pg from 'pg';
import t, { type Test } from 'tap';
import { createRequire } from 'node:module';
import { CommitFailed, createPool, queryThenCommit, sqlState, warmPool, withTransaction } from '../../db/db.js';
import { parseConnectionString, PG_ADAPTER, PG_PINNED } from '../../db/pg-adapter.js';
import { isActionLedgerError } from '../../core/errors.js';
import { createTestDatabase, recordSocketWrites } from '../helpers/db.js';

/**
 * The client's transaction status once the server's ReadyForQuery has arrived: the shortcut settles after it,
 * the plain path may settle just before it.
 */
async function statusOf(
  client: pg.ClientBase & { getTransactionStatus(): string | null },
  want: string,
): Promise<string | null> {
  for (let i = 0; i < 200 && client.getTransactionStatus() !== want; i++) await new Promise((r) => setTimeout(r, 5));
  return client.getTransactionStatus();
}

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

t.test('the shortcuts run here: node-postgres is the pinned version and has what they use', (t) => {
  t.equal(PG_ADAPTER.installed, PG_PINNED, 'package.json pins the version the adapter was written against');
  t.equal(PG_ADAPTER.mode, 'tricks');
  t.end();
});

t.test('parseConnectionString is the copy node-postgres itself loads, and reads a URL as it does', (t) => {
  const own = createRequire(createRequire(import.meta.url).resolve('pg'))('pg-connection-string') as {
    parse: unknown;
  };
  t.equal(parseConnectionString, own.parse, "pg's own copy");
  const parsed = parseConnectionString('postgres://u:p@db.example:5433/ledger?application_name=x');
  t.match(parsed, { user: 'u', password: 'p', host: 'db.example', port: '5433', database: 'ledger' });
  t.end();
});

for (const mode of ['tricks', 'plain'] as const)
  t.test(
    `queryThenCommit (${mode}): the statement and its COMMIT commit together, in ${mode === 'tricks' ? 'one write' : 'two round trips'}`,
    async (t) => {
      const { pool, uncaught } = await poolWatchingUncaught(t, 2);
      const writes = recordSocketWrites(pool);
      await pool.query('CREATE TABLE then_commit (id int PRIMARY KEY)');
      const client = await pool.connect();
      try {
        await client.query('BEGIN');
        writes.length = 0;
        const r = await queryThenCommit<{ id: number }>(
          client,
          { text: 'INSERT INTO then_commit VALUES ($1) RETURNING id', values: [1] },
          mode,
        );
        t.same(r.rows, [{ id: 1 }], "the statement's result");
        if (mode === 'tricks') {
          t.equal(writes.length, 1, 'one write');
          t.match(writes[0], /INSERT INTO then_commit[^]*COMMIT/, 'the statement, then COMMIT');
        } else {
          t.equal(writes.length, 2, 'two writes');
          t.match(writes[0], /INSERT INTO then_commit/, 'the statement');
          t.match(writes[1], /COMMIT/, 'then COMMIT');
        }
        t.equal(client.getTransactionStatus(), 'I', 'the transaction is over');
        const again = await client.query<{ n: number }>('SELECT 41 + 1 AS n');
        t.equal(again.rows[0]?.n, 42, 'the connection answers the next statement');
      } finally {
        client.release();
      }
      t.same(
        (await pool.query('SELECT id FROM then_commit')).rows,
        [{ id: 1 }],
        'committed, seen from another session',
      );
      t.same(uncaught, []);
    },
  );

for (const mode of ['tricks', 'plain'] as const)
  t.test(
    `queryThenCommit (${mode}): a failed statement leaves its transaction open with its locks; a failed COMMIT ends it`,
    async (t) => {
      const { pool, uncaught } = await poolWatchingUncaught(t, 3);
      await pool.query('CREATE TABLE then_commit (id int PRIMARY KEY, n int NOT NULL)');
      await pool.query('CREATE TABLE then_commit_ref (id int REFERENCES then_commit DEFERRABLE INITIALLY DEFERRED)');
      await pool.query('INSERT INTO then_commit VALUES (1, 0)');
      const client = await pool.connect();
      const other = await pool.connect();
      try {
        await client.query('BEGIN');
        await client.query('SELECT id FROM then_commit WHERE id = 1 FOR UPDATE');
        await client.query('SAVEPOINT s');
        const err: unknown = await queryThenCommit(
          client,
          { text: 'UPDATE then_commit SET n = n / $1 RETURNING id', values: [0] },
          mode,
        ).catch((e: unknown) => e);
        t.equal(sqlState(err), '22012', "rejected with the statement's own error (division by zero)");
        t.notOk(err instanceof CommitFailed);
        t.equal(
          mode === 'tricks' ? client.getTransactionStatus() : await statusOf(client, 'E'),
          'E',
          'the transaction is open and failed: its COMMIT never ran',
        );
        const locked: unknown = await other
          .query('SELECT id FROM then_commit WHERE id = 1 FOR UPDATE NOWAIT')
          .catch((e: unknown) => e);
        t.equal(sqlState(locked), '55P03', 'its row lock is still held');
        await client.query('ROLLBACK TO SAVEPOINT s');
        await client.query('UPDATE then_commit SET n = 1 WHERE id = 1');
        await client.query('COMMIT');
        t.same(
          (await pool.query('SELECT n FROM then_commit')).rows,
          [{ n: 1 }],
          'it went on under the lock and committed',
        );

        await client.query('BEGIN');
        const failed: unknown = await queryThenCommit(
          client,
          { text: 'INSERT INTO then_commit_ref VALUES ($1)', values: [99] },
          mode,
        ).catch((e: unknown) => e);
        t.ok(failed instanceof CommitFailed, 'the statement ran and its COMMIT failed (a deferred foreign key)');
        t.equal(sqlState((failed as CommitFailed).cause), '23503');
        t.equal(
          mode === 'tricks' ? client.getTransactionStatus() : await statusOf(client, 'I'),
          'I',
          'the transaction is over',
        );
        t.same((await pool.query('SELECT id FROM then_commit_ref')).rows, [], 'nothing of it committed');

        await client.query('BEGIN');
        const unbound: unknown = await queryThenCommit(
          client,
          {
            text: 'INSERT INTO then_commit VALUES ($1, $2)',
            values: [
              2,
              {
                toPostgres: () => {
                  throw new Error('a value that cannot be bound');
                },
              },
            ],
          },
          mode,
        ).catch((e: unknown) => e);
        t.match(unbound, { message: 'a value that cannot be bound' }, 'a value that cannot be bound rejects');
        t.equal(client.getTransactionStatus(), 'T', 'nothing ran: the transaction is open and well');
        await client.query('ROLLBACK');
        const after = await client.query<{ n: number }>('SELECT 41 + 1 AS n');
        t.equal(after.rows[0]?.n, 42, 'and the connection still answers');
      } finally {
        client.release();
        other.release();
      }
      t.same(uncaught, []);
    },
  );

t.test('queryThenCommit on a client that can no longer query rejects at once', async (t) => {
  const url = await createTestDatabase(t);
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  await client.end();
  for (const mode of ['tricks', 'plain'] as const) {
    const err: unknown = await queryThenCommit(client, { text: 'SELECT 1', values: [] }, mode).catch((e: unknown) => e);
    t.match(
      err,
      { message: /not queryable/ },
      `${mode}: node-postgres's refusal, not a wait for a reply that never comes`,
    );
  }
});
