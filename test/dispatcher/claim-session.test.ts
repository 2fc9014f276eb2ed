/**
 * The claim connection (dispatcher/claim-session.ts): the claim is planned once, its plan stays the index plan
 * over a small analyzed queue (where a generic plan on an ordinary session is hash joins over sequential
 * scans), a lost connection or a lost named statement costs no claim, and the session's settings never reach
 * another statement of the pool.
 */
import t from 'tap';
import { bindQueries, createPool, isConnectionError, prepared, type Pool, type PoolClient } from '../../core/db.js';
import { ClaimSession } from '../../dispatcher/claim-session.js';
import { dispatcherQueries } from '../../dispatcher/queries.js';
import { loadOperations } from '../../bench/claim-scaling.js';
import { createTestDatabase } from '../helpers/db.js';

const q = bindQueries(dispatcherQueries, '"actionledger"');
const statement = prepared(q.outboxClaimBatch);

interface PlanNode {
  'Node Type': string;
  'Relation Name'?: string;
  Plans?: PlanNode[];
}

/** Every node of a plan as "Node Type" or "Node Type on relation". */
function nodes(plan: PlanNode): string[] {
  const here =
    plan['Relation Name'] === undefined ? plan['Node Type'] : `${plan['Node Type']} on ${plan['Relation Name']}`;
  return [here, ...(plan.Plans ?? []).flatMap(nodes)];
}

/** The plan `client`'s session runs the named claim with, in a transaction rolled back (nothing is claimed). */
async function namedClaimPlan(client: PoolClient): Promise<string[]> {
  await client.query('BEGIN');
  try {
    const { rows } = await client.query<{ 'QUERY PLAN': { Plan: PlanNode }[] }>(
      `EXPLAIN (FORMAT JSON) EXECUTE ${statement.name}(32, 'test-worker')`,
    );
    return nodes(rows[0]!['QUERY PLAN'][0]!.Plan);
  } finally {
    await client.query('ROLLBACK');
  }
}

/** A pool whose connections the test can reach: `last()` is the client `connect` handed out last. */
function watchedPool(url: string): { pool: Pool; last: () => PoolClient } {
  const pool = createPool(url, { max: 3, statementTimeoutMs: 30_000, applicationName: 'test-claim-session' });
  let last: PoolClient | undefined;
  pool.on('acquire', (client: PoolClient) => {
    last = client;
  });
  return { pool, last: () => last! };
}

const SCANS_AND_JOINS = /^(Seq Scan|Bitmap Heap Scan|Hash Join|Merge Join) on |^(Hash Join|Merge Join|Sort)$/;

t.test('the claim is planned once, and its plan over a small analyzed queue is the index plan', async (t) => {
  const url = await createTestDatabase(t);
  const { pool, last } = watchedPool(url);
  t.teardown(() => pool.end());
  await loadOperations(pool, 200, 'pending');
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

  const session = new ClaimSession<{ operation_id: string }>(pool, q.claimSessionSettings, statement);
  t.teardown(() => session.close());
  const claimed = new Set<string>();
  for (let i = 0; i < 6; i++) for (const row of await session.claim([5, 'test-worker'])) claimed.add(row.operation_id);
  t.equal(claimed.size, 30, 'six claims of five, each operation once');
  const client = last();
  const { rows } = await client.query<{ generic_plans: string; custom_plans: string }>(
    'SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = $1',
    [statement.name],
  );
  t.same(rows, [{ generic_plans: '6', custom_plans: '0' }], 'one plan, built once and reused by every claim');
  const plan = await namedClaimPlan(client);
  t.same(
    plan.filter((n) => SCANS_AND_JOINS.test(n)),
    [],
    `no sequential or bitmap scan, hash or merge join, or sort: ${plan.join(', ')}`,
  );
  t.ok(plan.includes('Index Scan on outbox'), 'the queue is read through its index');
  t.ok(plan.includes('Index Scan on operations'), 'operations are found by key');
});

t.test('a lost connection or a lost named statement costs no claim', async (t) => {
  const url = await createTestDatabase(t);
  const { pool, last } = watchedPool(url);
  t.teardown(() => pool.end());
  await loadOperations(pool, 20, 'pending');
  const session = new ClaimSession<{ operation_id: string }>(pool, q.claimSessionSettings, statement);
  t.teardown(() => session.close());
  t.equal((await session.claim([2, 'test-worker'])).length, 2);

  // The session's backend ends (a restart, an administrator). A claim sent before the client noticed fails with
  // the connection error; the next one runs on a new connection.
  const first = last();
  const pid = (await first.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
  await pool.query('SELECT pg_terminate_backend($1)', [pid]);
  const afterLoss = await session.claim([2, 'test-worker']).catch(async (err: unknown) => {
    t.ok(isConnectionError(err), `only a connection error: ${(err as Error).message}`);
    return session.claim([2, 'test-worker']);
  });
  t.equal(afterLoss.length, 2, 'claimed on a new connection');
  const second = last();
  t.not(second, first);

  // The named statement is gone from the session (DEALLOCATE, a pooler that moved it): SQLSTATE 26000, which
  // ran nothing; the claim is sent again on a new connection.
  await second.query('DEALLOCATE ALL');
  t.equal((await session.claim([2, 'test-worker'])).length, 2, 'claimed after the named statement was lost');
  t.not(last(), second, 'on a new connection');
  const { rows } = await pool.query<{ status: string; n: number }>(
    'SELECT status, count(*)::int AS n FROM actionledger.operations GROUP BY status ORDER BY status',
  );
  t.same(rows, [
    { status: 'executing', n: 6 },
    { status: 'pending', n: 14 },
  ]);
  t.equal(
    (await pool.query('SELECT 1 FROM actionledger.outbox')).rowCount,
    14,
    'every claimed operation left the outbox, every other stayed',
  );
});

t.test("the session's settings never reach another statement, and close ends the connection", async (t) => {
  const url = await createTestDatabase(t);
  const pool = createPool(url, { max: 1, statementTimeoutMs: 30_000, applicationName: 'test-claim-session' });
  t.teardown(() => pool.end());
  await loadOperations(pool, 5, 'pending');
  const session = new ClaimSession<{ operation_id: string }>(pool, q.claimSessionSettings, statement);
  const claiming = session.claim([1, 'test-worker']);
  const closed = session.close();
  t.equal((await claiming).length, 1, 'a claim in flight at close lands');
  await closed;
  const { rows } = await pool.query<{ seqscan: string; mode: string; named: number }>(
    `SELECT current_setting('enable_seqscan') AS seqscan, current_setting('plan_cache_mode') AS mode,
            (SELECT count(*)::int FROM pg_prepared_statements) AS named`,
  );
  t.same(rows, [{ seqscan: 'on', mode: 'auto', named: 0 }], "the pool's only connection is a new one, unpinned");
  t.equal((await session.claim([1, 'test-worker'])).length, 1, 'a claim after close opens a connection again');
  await session.close();
  await session.close();
});
