/**
 * The claim commits asynchronously (dispatcher/queries.ts): a PostgreSQL crash before its WAL is written takes
 * the claim back, and the operation is pending again, as if never claimed; a later synchronous commit (as the
 * evidence statement before any send is) writes and flushes it. On a private cluster, the WAL writer is
 * stopped (SIGSTOP) before the claim, so that nothing writes the claim's WAL on its own, and then killed
 * (SIGKILL): PostgreSQL treats that as a crash, stops every backend at once and recovers from the WAL on disk.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { bindQueries, createPool, type Pool } from '../../db/db.js';
import { openEmbeddedDatabase, type EmbeddedDatabase } from '../../embedded/embedded.js';
import { migrate } from '../../db/migrate.js';
import { dispatcherQueries } from '../../dispatcher/queries.js';
import { Ledger } from '../../ledger/index.js';
import { ctx, testConfig, testKeyer } from '../helpers/db.js';
import { freePort } from '../helpers/net.js';

const q = bindQueries(dispatcherQueries, '"actionledger"');

/** The operation the claim statement took first, if any. */
async function claimOne(pool: Pool, worker: string): Promise<string | undefined> {
  return (await pool.query<{ operation_id: string }>(q.outboxClaimBatch, [10, worker])).rows[0]?.operation_id;
}

interface Cluster {
  readonly db: EmbeddedDatabase;
  pool: Pool;
}

async function open(dataDir: string, port: number): Promise<Cluster> {
  const db = await openEmbeddedDatabase({ dataDir, port });
  return { db, pool: createPool(db.url, { max: 4, statementTimeoutMs: 30_000, applicationName: 'test' }) };
}

/**
 * Stops the WAL writer: from now on a commit's WAL is written only by a synchronous commit. It is stopped only
 * while it sleeps between rounds (its wait event `WalWriterMain`): stopped in the middle of a round, it could
 * hold the lock every WAL write takes, and the synchronous commit below would wait for it forever.
 */
async function holdWalWriter(pool: Pool): Promise<number> {
  const { rows } = await pool.query<{ pid: number }>(
    "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'",
  );
  const pid = rows[0]!.pid;
  for (let i = 0; ; i++) {
    process.kill(pid, 'SIGSTOP');
    // A stopped process's wait event is where it stopped: read from shared memory, not from a report it sends.
    const { rows: now } = await pool.query<{ wait_event: string | null }>(
      'SELECT wait_event FROM pg_stat_activity WHERE pid = $1',
      [pid],
    );
    if (now[0]?.wait_event === 'WalWriterMain') return pid;
    process.kill(pid, 'SIGCONT');
    if (i > 500) throw new Error(`the WAL writer was never caught asleep (last: ${now[0]?.wait_event})`);
    await new Promise((r) => setTimeout(r, 5 + (i % 7)));
  }
}

/** Kills the held WAL writer: PostgreSQL's crash and recovery. Resolves once the server answers again. */
async function crash(c: Cluster, walWriter: number): Promise<Pool> {
  await c.pool.end().catch(() => undefined);
  process.kill(walWriter, 'SIGKILL');
  // The postmaster notices, ends every backend and recovers; until then, connections are refused or cut.
  for (let i = 0; ; i++) {
    const pool = createPool(c.db.url, { max: 4, statementTimeoutMs: 30_000, applicationName: 'test' });
    try {
      const { rows } = await pool.query<{ pid: number }>(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'",
      );
      if (rows[0] !== undefined && rows[0].pid !== walWriter) return pool;
    } catch (err) {
      if (i > 300) throw err;
    }
    await pool.end().catch(() => undefined);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function statusOf(pool: Pool, operationId: string): Promise<{ status: string; outbox: number }> {
  const { rows } = await pool.query<{ status: string; outbox: number }>(
    `SELECT status, (SELECT count(*)::int FROM actionledger.outbox WHERE operation_id = $1) AS outbox
       FROM actionledger.operations WHERE operation_id = $1`,
    [operationId],
  );
  return rows[0]!;
}

t.test('a crash before the WAL flush takes the claim back; a later synchronous commit keeps it', async (t) => {
  const dataDir = mkdtempSync(join(tmpdir(), 'al-claim-crash-'));
  const port = await freePort();
  const c = await open(dataDir, port);
  t.teardown(async () => {
    await c.pool.end().catch(() => undefined);
    await c.db.stop().catch(() => undefined);
    rmSync(dataDir, { recursive: true, force: true });
  });
  const client = await c.pool.connect();
  await migrate(client, 'actionledger', '"actionledger"');
  client.release();
  const config = testConfig(c.db.url);
  const reserve = async (step: string): Promise<string> => {
    const ledger = new Ledger(config, c.pool, testKeyer());
    try {
      const r = await ledger.reserve(ctx({ workflow_step_id: step }), 'issue_refund', {
        order_id: step,
        amount: 5,
        currency: 'EUR',
      });
      return r.operation_id;
    } finally {
      ledger.stop();
    }
  };

  // Claimed, then the server crashes before anything else commits: the claim is gone.
  const lost = await reserve('lost');
  let walWriter = await holdWalWriter(c.pool);
  t.equal(await claimOne(c.pool, 'w-crash'), lost);
  t.same(await statusOf(c.pool, lost), { status: 'executing', outbox: 0 }, 'claimed before the crash');
  c.pool = await crash(c, walWriter);
  t.same(await statusOf(c.pool, lost), { status: 'pending', outbox: 1 }, 'pending again, its outbox row back');
  t.equal(await claimOne(c.pool, 'w-after'), lost, 'and claimed again by the next claim');

  // Claimed, then a synchronous commit (as the evidence statement is, before any send): the claim survives.
  const kept = await reserve('kept');
  walWriter = await holdWalWriter(c.pool);
  t.equal(await claimOne(c.pool, 'w-crash'), kept);
  await c.pool.query('CREATE TABLE synchronous_marker (id int)');
  c.pool = await crash(c, walWriter);
  t.same(await statusOf(c.pool, kept), { status: 'executing', outbox: 0 }, 'the later commit flushed the claim');

  // With a synchronous standby named, the claim keeps the server's setting: it waits for the standby too.
  await reserve('standby');
  await c.pool.query("ALTER SYSTEM SET synchronous_standby_names = 'a_standby'");
  await c.pool.query('SELECT pg_reload_conf()');
  const session = await c.pool.connect();
  try {
    // A reload reaches each backend as a signal it handles between commands: wait until this one has it.
    for (let i = 0; ; i++) {
      const { rows: now } = await session.query<{ s: string }>(
        "SELECT current_setting('synchronous_standby_names') AS s",
      );
      if (now[0]?.s === 'a_standby') break;
      if (i > 200) throw new Error('the reloaded setting never reached the session');
      await new Promise((r) => setTimeout(r, 10));
    }
    await session.query('BEGIN');
    t.equal((await session.query(q.outboxClaimBatch, [10, 'w-standby'])).rowCount, 1);
    const { rows } = await session.query<{ s: string }>("SELECT current_setting('synchronous_commit') AS s");
    t.equal(rows[0]?.s, 'on', 'not asynchronous with a synchronous standby');
    await session.query('ROLLBACK');
  } finally {
    session.release();
  }
  await c.pool.query('ALTER SYSTEM RESET synchronous_standby_names');
  await c.pool.query('SELECT pg_reload_conf()');
});
