/**
 * The claim connection (dispatcher/claim-session.ts): the claim runs on a connection of its own whose startup
 * settings keep its generic plan the index plan over a small analyzed queue (where a generic plan on an ordinary
 * session is hash joins over sequential scans); a lost connection or a lost named statement costs no claim;
 * `close()` never waits for a claim in flight; the settings never reach the pool; and a dispatcher's claims run
 * there.
 */
import * as net from 'node:net';
import pg from 'pg';
import t, { type Test } from 'tap';
import { bindQueries, createPool, isConnectionError, prepared, type Pool } from '../../db/db.js';
import { Metrics } from '../../core/metrics.js';
import { ClaimSession, openClaimConnection } from '../../dispatcher/claim-session.js';
import { openDispatcher } from '../../dispatcher/index.js';
import { dispatcherQueries } from '../../dispatcher/queries.js';
import { loadOperations } from '../../bench/claim-scaling.js';
import { createTestDatabase } from '../helpers/db.js';
import { ctx, dispatchEnv, settled } from '../helpers/fleet.js';

const q = bindQueries(dispatcherQueries, '"actionledger"');
const statement = prepared(q.outboxClaimBatch);

interface PlanNode {
  'Node Type': string;
  'Relation Name'?: string;
  'Index Name'?: string;
  Plans?: PlanNode[];
}

/** Every node of a plan as "Node Type", "Node Type on relation" or "Node Type on relation using index". */
function nodes(plan: PlanNode): string[] {
  let here = plan['Node Type'];
  if (plan['Relation Name'] !== undefined) here += ` on ${plan['Relation Name']}`;
  if (plan['Index Name'] !== undefined) here += ` using ${plan['Index Name']}`;
  return [here, ...(plan.Plans ?? []).flatMap(nodes)];
}

/** The plan `client`'s session runs the named claim with, in a transaction rolled back (nothing is claimed). */
async function namedClaimPlan(client: pg.ClientBase, name = statement.name): Promise<string[]> {
  await client.query('BEGIN');
  try {
    const { rows } = await client.query<{ 'QUERY PLAN': { Plan: PlanNode }[] }>(
      `EXPLAIN (FORMAT JSON) EXECUTE ${name}(32, 'test-worker')`,
    );
    return nodes(rows[0]!['QUERY PLAN'][0]!.Plan);
  } finally {
    await client.query('ROLLBACK');
  }
}

const SCANS_AND_JOINS =
  /^(Seq Scan|Bitmap Heap Scan|Hash Join|Merge Join) on |^(Hash Join|Merge Join|Sort|Materialize)$/;

/** A claim session on `pool`'s server whose connections the test can reach (`opened`, oldest first). */
function session(pool: Pool): { claims: ClaimSession<{ operation_id: string }>; opened: pg.Client[] } {
  const opened: pg.Client[] = [];
  const claims = new ClaimSession<{ operation_id: string }>(async () => {
    const connection = await openClaimConnection(pool);
    opened.push(connection.client);
    return connection;
  }, statement);
  return { claims, opened };
}

/** Resolves when `client`'s connection has ended (an 'error' event before it is the session's to handle). */
function ends(client: pg.Client): Promise<void> {
  return new Promise((resolve) => client.once('end', () => resolve()));
}

/** Claim connections of this file's pools into this test's database. */
async function claimBackends(pool: Pool, name = 'test-claim-session:claims'): Promise<number> {
  const { rows } = await pool.query<{ n: number }>(
    `SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`,
    [name],
  );
  return rows[0]!.n;
}

async function backendPid(client: pg.Client): Promise<number> {
  return (await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
}

/** Waits until `n` claim connections are left (connections close asynchronously). */
async function claimBackendsDownTo(pool: Pool, n: number, name?: string): Promise<void> {
  for (let i = 0; (await claimBackends(pool, name)) > n; i++) {
    if (i > 500) throw new Error('a claim connection was never closed');
    await new Promise((r) => setTimeout(r, 10));
  }
}

async function openPool(t: Test, operations: number): Promise<Pool> {
  const pool = createPool(await createTestDatabase(t), {
    max: 3,
    statementTimeoutMs: 30_000,
    applicationName: 'test-claim-session',
  });
  t.teardown(() => pool.end());
  await loadOperations(pool, operations, 'pending');
  return pool;
}

t.test('every claim runs the one generic plan, and over a small analyzed queue it is the index plan', async (t) => {
  const pool = await openPool(t, 200);
  await pool.query('ANALYZE');

  // The premise: on an ordinary session, the generic plan of the same statement over this ledger reads outbox
  // and operations whole.
  const plain = await pool.connect();
  try {
    await plain.query('SET plan_cache_mode = force_generic_plan');
    await plain.query({ ...statement, values: [0, 'nobody'] });
    const ordinary = await namedClaimPlan(plain);
    t.ok(
      ordinary.some((n) => SCANS_AND_JOINS.test(n)),
      `an ordinary session's generic plan scans or hash-joins: ${ordinary.join(', ')}`,
    );
  } finally {
    plain.release(true);
  }

  const { claims, opened } = session(pool);
  t.teardown(() => claims.close());
  const claimed = new Set<string>();
  for (let i = 0; i < 6; i++) for (const row of await claims.claim([5, 'test-worker'])) claimed.add(row.operation_id);
  t.equal(claimed.size, 30, 'six claims of five, each operation once');
  t.equal(opened.length, 1, 'all on one connection');
  const client = opened[0]!;
  const { rows } = await client.query<{ generic_plans: string; custom_plans: string; app: string }>(
    `SELECT generic_plans, custom_plans, current_setting('application_name') AS app
     FROM pg_prepared_statements WHERE name = $1`,
    [statement.name],
  );
  t.same(
    rows,
    [{ generic_plans: '6', custom_plans: '0', app: 'test-claim-session:claims' }],
    'every claim ran the generic plan, none was planned for its own values',
  );
  const plan = await namedClaimPlan(client);
  t.same(
    plan.filter((n) => SCANS_AND_JOINS.test(n)),
    [],
    `no sequential or bitmap scan, hash or merge join, or sort: ${plan.join(', ')}`,
  );
  t.ok(plan.includes('Index Scan on outbox using outbox_available_idx'), 'the queue is read through its index');
  t.ok(plan.includes('Index Scan on operations using operations_pkey'), 'operations are found by key');
});

t.test('a plan built over an empty, never analyzed ledger stays the index plan as the queue grows', async (t) => {
  const pool = await openPool(t, 0);
  // No ANALYZE behind the test's back: the plan must outlive the growth, as it would between two autovacuum runs.
  await pool.query('ALTER TABLE actionledger.operations SET (autovacuum_enabled = off)');
  await pool.query('ALTER TABLE actionledger.outbox SET (autovacuum_enabled = off)');
  const { claims, opened } = session(pool);
  t.teardown(() => claims.close());
  t.same(await claims.claim([32, 'test-worker']), [], 'the first claim, on the empty ledger, builds the plan');
  await loadOperations(pool, 5_000, 'pending');
  t.equal((await claims.claim([32, 'test-worker'])).length, 32, 'the same session claims from the grown queue');
  const plan = await namedClaimPlan(opened[0]!);
  t.same(
    plan.filter((n) => SCANS_AND_JOINS.test(n)),
    [],
    `no scans or joins but by index: ${plan.join(', ')}`,
  );
});

t.test('a lost connection or a lost named statement costs no claim', async (t) => {
  const pool = await openPool(t, 20);
  const { claims, opened } = session(pool);
  t.teardown(() => claims.close());
  t.equal((await claims.claim([2, 'test-worker'])).length, 2);

  // The backend ends while the session is idle: its client hears it, and the next claim opens a new connection.
  const idle = opened.at(-1)!;
  const ended = ends(idle);
  await pool.query('SELECT pg_terminate_backend($1)', [await backendPid(idle)]);
  await ended;
  t.equal((await claims.claim([2, 'test-worker'])).length, 2, 'claimed on a new connection');
  t.equal(opened.length, 2);

  // The backend ends during a claim (held behind a lock on the outbox): that claim fails with the connection
  // error, and the next one opens a new connection.
  const pid = await backendPid(opened.at(-1)!);
  const blocker = await pool.connect();
  await blocker.query('BEGIN');
  await blocker.query('LOCK TABLE actionledger.outbox IN ACCESS EXCLUSIVE MODE');
  const blocked = claims.claim([2, 'test-worker']);
  const outcome = blocked.then(
    () => 'claimed',
    (err: unknown) => (isConnectionError(err) ? 'connection error' : String(err)),
  );
  for (let i = 0; ; i++) {
    const { rows } = await pool.query("SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'", [
      pid,
    ]);
    if (rows.length > 0) break;
    if (i > 500) throw new Error('the claim never waited for the lock');
    await new Promise((r) => setTimeout(r, 10));
  }
  await pool.query('SELECT pg_terminate_backend($1)', [pid]);
  t.equal(await outcome, 'connection error', 'the claim in flight fails with the connection');
  await blocker.query('ROLLBACK');
  blocker.release();
  t.equal((await claims.claim([2, 'test-worker'])).length, 2, 'the next claim runs on a new connection');
  t.equal(opened.length, 3);

  // The named statement is gone from the session (DEALLOCATE, a pooler that moved it): SQLSTATE 26000, which
  // ran nothing; the claim is sent again on a new connection.
  await opened.at(-1)!.query('DEALLOCATE ALL');
  t.equal((await claims.claim([2, 'test-worker'])).length, 2, 'claimed after the named statement was lost');
  t.equal(opened.length, 4, 'on a new connection');
  const { rows } = await pool.query<{ status: string; n: number }>(
    'SELECT status, count(*)::int AS n FROM actionledger.operations GROUP BY status ORDER BY status',
  );
  t.same(
    rows,
    [
      { status: 'executing', n: 8 },
      { status: 'pending', n: 12 },
    ],
    'the failed claim took nothing',
  );
  t.equal((await pool.query('SELECT 1 FROM actionledger.outbox')).rowCount, 12, 'the others are still queued');
  claims.close();
  await claimBackendsDownTo(pool, 0);
});

t.test('close never waits for a claim in flight, and the settings never reach the pool', async (t) => {
  const pool = await openPool(t, 5);
  const { claims, opened } = session(pool);
  const blocker = await pool.connect();
  await blocker.query('BEGIN');
  await blocker.query('LOCK TABLE actionledger.outbox IN ACCESS EXCLUSIVE MODE');
  const claiming = claims.claim([1, 'test-worker']);
  while (opened.length === 0) await new Promise((r) => setTimeout(r, 10));
  const ended = ends(opened[0]!);
  claims.close();
  t.equal(await claimBackends(pool), 1, 'close returned with the claim still waiting on its connection');
  await blocker.query('ROLLBACK');
  blocker.release();
  t.equal((await claiming).length, 1, 'the claim in flight lands');
  await ended;
  t.equal(await claimBackends(pool), 0, 'and then its connection is closed');

  const settings = await pool.query<{ seqscan: string; mode: string }>(
    "SELECT current_setting('enable_seqscan') AS seqscan, current_setting('plan_cache_mode') AS mode",
  );
  t.same(settings.rows, [{ seqscan: 'on', mode: 'auto' }], 'the pool runs with the server settings');
  t.equal((await claims.claim([1, 'test-worker'])).length, 1, 'a claim after close opens a connection again');
  t.equal(opened.length, 2);
  const pinned = await opened[1]!.query<{ seqscan: string; mode: string }>(
    "SELECT current_setting('enable_seqscan') AS seqscan, current_setting('plan_cache_mode') AS mode",
  );
  t.same(pinned.rows, [{ seqscan: 'off', mode: 'force_generic_plan' }], 'the claim connection runs with its own');
  claims.close();
  claims.close();
});

t.test("a dispatcher's claims run on the claim connection, which its stop closes", async (t) => {
  const e = await dispatchEnv(t);
  // The dispatcher's pool makes its clients with a class the test sees: the claim connection is one of them.
  const made: pg.Client[] = [];
  class Recorded extends pg.Client {
    constructor(config?: string | pg.ClientConfig) {
      super(config);
      made.push(this);
    }
  }
  const pool = new pg.Pool({ connectionString: e.url, max: 10, application_name: 'test-dispatcher', Client: Recorded });
  pool.on('error', () => undefined);
  t.teardown(() => pool.end());
  const d = await openDispatcher(
    { ...e.runtime, pool, metrics: new Metrics({ defaultMetrics: false, ledger: false }) },
    e.env,
  );
  await d.start();
  const op = await e.ledger.reserve(ctx('claim-connection'), 'issue_refund', {
    order_id: 'o-claim',
    amount: 5,
    currency: 'EUR',
  });
  t.equal((await settled(e.pool, op.operation_id, 20_000)).status, 'succeeded');
  const claimConnections = [];
  for (const client of made) {
    const { rows } = await client
      .query<{ app: string; seqscan: string; mode: string; named: number }>(
        `SELECT current_setting('application_name') AS app, current_setting('enable_seqscan') AS seqscan,
                current_setting('plan_cache_mode') AS mode,
                (SELECT count(*)::int FROM pg_prepared_statements WHERE name = $1) AS named`,
        [prepared(bindQueries(dispatcherQueries, e.config.schemaQuoted).outboxClaimBatch).name],
      )
      .catch(() => ({ rows: [] }));
    if (rows[0]?.app === 'test-dispatcher:claims') claimConnections.push(rows[0]);
    else if (rows[0] !== undefined)
      t.same([rows[0].seqscan, rows[0].mode], ['on', 'auto'], 'a pool connection runs with the server settings');
  }
  t.same(
    claimConnections,
    [{ app: 'test-dispatcher:claims', seqscan: 'off', mode: 'force_generic_plan', named: 1 }],
    'one claim connection, with the settings and the named claim',
  );
  await d.stop();
  await claimBackendsDownTo(e.pool, 0, 'test-dispatcher:claims');
  t.pass('stop closed it');
});

t.test("the claim settings follow the URL's own options and application name", async (t) => {
  const url = new URL(await createTestDatabase(t));
  url.searchParams.set('options', '-c work_mem=8MB');
  url.searchParams.set('application_name', 'billing-fleet');
  const pool = createPool(url.toString(), { max: 1, statementTimeoutMs: 30_000, applicationName: 'ignored' });
  t.teardown(() => pool.end());
  const { client, pinned } = await openClaimConnection(pool);
  t.teardown(() => client.end());
  const { rows } = await client.query<{ app: string; work_mem: string; seqscan: string }>(
    `SELECT current_setting('application_name') AS app, current_setting('work_mem') AS work_mem,
            current_setting('enable_seqscan') AS seqscan`,
  );
  t.same(
    rows,
    [{ app: 'billing-fleet:claims', work_mem: '8MB', seqscan: 'off' }],
    "the URL's settings, then the claim's",
  );
  t.equal(pinned, true);
  const pooled = await pool.query<{ app: string; work_mem: string }>(
    "SELECT current_setting('application_name') AS app, current_setting('work_mem') AS work_mem",
  );
  t.same(pooled.rows, [{ app: 'billing-fleet', work_mem: '8MB' }], 'as the pool has them');
});

t.test('where the settings did not take, the claim runs unnamed', async (t) => {
  const pool = await openPool(t, 10);
  await pool.query('ANALYZE');
  const opened: pg.Client[] = [];
  let unpinned = 0;
  // A connection without the settings, as a pooler that drops startup parameters would leave it.
  const claims = new ClaimSession<{ operation_id: string }>(
    async () => {
      const client = new pg.Client({ connectionString: pool.options.connectionString });
      client.on('error', () => undefined);
      await client.connect();
      opened.push(client);
      return { client, pinned: false };
    },
    statement,
    () => unpinned++,
  );
  t.teardown(() => claims.close());
  for (let i = 0; i < 3; i++) t.equal((await claims.claim([2, 'test-worker'])).length, 2);
  t.equal(unpinned, 1, 'reported once, for the one connection');
  const { rows } = await opened[0]!.query<{ n: number }>('SELECT count(*)::int AS n FROM pg_prepared_statements');
  t.equal(rows[0]!.n, 0, 'no named statement on a session with the server settings');
});

type PoolerMode = 'refuse' | 'refuse other' | 'strip' | 'strip one';

/**
 * A stand-in for a pooler in front of `url`'s server, on a port of its own, for startup packets that name
 * `options`: `refuse` answers with the error a pooler that does not take them sends; `refuse other` answers with
 * an error of the same SQLSTATE about something else (no free client slot); `strip` takes `options` out of the
 * packet, and `strip one` takes only `-c enable_material=off` out of its value, before relaying it. `offered`
 * collects the `options` values it saw.
 */
async function standInPooler(t: Test, url: string, mode: PoolerMode): Promise<{ url: string; offered: string[] }> {
  const target = new URL(url);
  const offered: string[] = [];
  const fail = (socket: net.Socket, message: string): void => {
    const body = Buffer.from(`SFATAL\0C08P01\0M${message}\0\0`, 'latin1');
    const head = Buffer.alloc(5);
    head.write('E', 0, 'latin1');
    head.writeInt32BE(body.length + 4, 1);
    socket.end(Buffer.concat([head, body]));
  };
  const server = net.createServer((socket) => {
    socket.on('error', () => undefined);
    let buffered = Buffer.alloc(0);
    const onData = (chunk: Buffer): void => {
      buffered = Buffer.concat([buffered, chunk]);
      // The startup packet: its length, the protocol version, then name\0value\0 pairs and a final \0.
      if (buffered.length < 4 || buffered.length < buffered.readInt32BE(0)) return;
      socket.off('data', onData);
      const length = buffered.readInt32BE(0);
      const first = buffered.subarray(0, length);
      const after = buffered.subarray(length);
      const pairs = first
        .subarray(8, first.length - 1)
        .toString('latin1')
        .split('\0');
      pairs.pop();
      const at = pairs.findIndex((p, k) => k % 2 === 0 && p === 'options');
      let packet = first;
      if (at >= 0) {
        offered.push(pairs[at + 1] ?? '');
        if (mode === 'refuse') return fail(socket, 'unsupported startup parameter: options');
        if (mode === 'refuse other') return fail(socket, 'no more connections allowed (max_client_conn)');
        if (mode === 'strip') pairs.splice(at, 2);
        else pairs[at + 1] = (pairs[at + 1] ?? '').replace('-c enable_material=off', '');
        const rest = Buffer.from(pairs.map((p) => `${p}\0`).join('') + '\0', 'latin1');
        packet = Buffer.alloc(8 + rest.length);
        packet.writeInt32BE(packet.length, 0);
        first.copy(packet, 4, 4, 8);
        rest.copy(packet, 8);
      }
      const upstream = net.connect(Number(target.port), target.hostname, () => {
        upstream.write(Buffer.concat([packet, after]));
        socket.pipe(upstream).pipe(socket);
      });
      upstream.on('error', () => socket.destroy());
      socket.on('error', () => upstream.destroy());
    };
    socket.on('data', onData);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  const relayed = new URL(target);
  relayed.port = String((server.address() as net.AddressInfo).port);
  return { url: relayed.toString(), offered };
}

for (const mode of ['refuse', 'strip', 'strip one'] as const)
  t.test(
    `a pooler that ${mode === 'refuse' ? 'refuses' : mode === 'strip' ? 'drops' : 'drops one of'} the settings: the connection says it is not pinned`,
    async (t) => {
      const pool = await openPool(t, 4);
      const pooler = await standInPooler(t, pool.options.connectionString!, mode);
      const viaPooler = createPool(pooler.url, {
        max: 1,
        statementTimeoutMs: 30_000,
        applicationName: 'test-claim-session',
      });
      t.teardown(() => viaPooler.end());
      const { client, pinned } = await openClaimConnection(viaPooler);
      t.teardown(() => client.end());
      t.equal(pooler.offered.length, 1, 'the settings were offered once');
      t.match(pooler.offered[0], /enable_material=off/);
      t.equal(pinned, false, 'read back from the session: not pinned');
      const { rows } = await client.query<{ material: string }>(
        "SELECT current_setting('enable_material') AS material",
      );
      t.same(rows, [{ material: 'on' }]);
    },
  );

t.test("a pooler's error about something else is not taken for a refusal of the settings", async (t) => {
  const pool = await openPool(t, 0);
  const pooler = await standInPooler(t, pool.options.connectionString!, 'refuse other');
  const viaPooler = createPool(pooler.url, {
    max: 1,
    statementTimeoutMs: 30_000,
    applicationName: 'test-claim-session',
  });
  t.teardown(() => viaPooler.end());
  await t.rejects(openClaimConnection(viaPooler), /max_client_conn/, 'the error is thrown, the claim fails for now');
  t.equal(pooler.offered.length, 1, 'no second connection without the settings');
});

t.test('PGOPTIONS, as the pool connections get it, comes before the claim settings', async (t) => {
  const pool = await openPool(t, 0);
  const before = process.env.PGOPTIONS;
  process.env.PGOPTIONS = '-c work_mem=9MB';
  let opened: Awaited<ReturnType<typeof openClaimConnection>>;
  try {
    opened = await openClaimConnection(pool);
  } finally {
    if (before === undefined) delete process.env.PGOPTIONS;
    else process.env.PGOPTIONS = before;
  }
  t.teardown(() => opened.client.end());
  const { rows } = await opened.client.query<{ work_mem: string; seqscan: string }>(
    "SELECT current_setting('work_mem') AS work_mem, current_setting('enable_seqscan') AS seqscan",
  );
  t.same(rows, [{ work_mem: '9MB', seqscan: 'off' }]);
  t.equal(opened.pinned, true);
});
