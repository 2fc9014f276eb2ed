/**
 * Statements written together (pg's pipeline mode on every pool db/db.ts makes): a dispatch batch's evidence
 * statement, BEGIN, row locks, final check and savepoint reach PostgreSQL before the reply to the first of them,
 * through a proxy that holds that reply back, and leave the dispatcher's socket in one write. Real PostgreSQL, the
 * sandbox provider and authorizer over mTLS, a real Dispatcher.
 */
import t, { type Test } from 'tap';
import pg from 'pg';
import { Metrics } from '../../core/metrics.js';
import { bindQueries, createPool, inOneWrite, prepared } from '../../db/db.js';
import { recordSocketWrites } from '../helpers/db.js';
import { openDispatcher } from '../../dispatcher/index.js';
import { dispatcherQueries } from '../../dispatcher/queries.js';
import {
  ctx,
  dispatchEnv,
  dispatcherThroughProxy,
  PROXIED_DISPATCHER,
  settled,
  type ProxiedDispatcher,
} from '../helpers/fleet.js';
import { proxyTo } from '../helpers/net.js';

t.test(
  'a pool client writes a statement issued while the one before it is out without waiting for its reply',
  async (t) => {
    const e = await dispatchEnv(t);
    const { proxy, url } = await proxyTo(e.url, ['SELECT 41 + 1']);
    t.teardown(() => proxy.close());
    const pool = createPool(url, { max: 1, statementTimeoutMs: 10_000, applicationName: 'pipeline-test' });
    t.teardown(() => pool.end());
    const client = await pool.connect();
    try {
      const [, answer] = await Promise.all([
        client.query('BEGIN'),
        client.query('SELECT 41 + 1 AS n'),
        client.query('COMMIT'),
      ]);
      t.equal((answer.rows[0] as { n: number }).n, 42, 'answered in order');
    } finally {
      client.release();
    }
    t.same(
      proxy.holds,
      [{ pipelined: true, seen: ['SELECT 41 + 1'] }],
      'the SELECT reached the server before BEGIN was answered',
    );
  },
);

t.test(
  'statements issued in inOneWrite leave the socket in one write; issued alone or on its plain path, in one write each',
  async (t) => {
    const e = await dispatchEnv(t);
    const pool = createPool(e.url, { max: 1, statementTimeoutMs: 10_000, applicationName: 'one-write-test' });
    t.teardown(() => pool.end());
    const writes = recordSocketWrites(pool);
    const client = await pool.connect();
    try {
      const statements = (): Promise<unknown>[] => [
        client.query('BEGIN'),
        client.query({ text: 'SELECT $1::int + 1 AS n', values: [41] }),
        client.query('COMMIT'),
      ];
      writes.length = 0;
      await Promise.all(inOneWrite(client, statements));
      t.equal(writes.length, 1, 'one write');
      t.match(writes[0], /BEGIN[^]*SELECT \$1::int \+ 1[^]*COMMIT/, 'with all three, in order');
      writes.length = 0;
      await Promise.all(statements());
      t.equal(writes.length, 3, 'without it: one write per statement');
      writes.length = 0;
      const answers = (await Promise.all(inOneWrite(client, statements, 'plain'))) as { rows: unknown[] }[];
      t.equal(writes.length, 3, 'its plain path: one write per statement');
      t.same(answers[1]?.rows, [{ n: 42 }], 'with the same answers');
    } finally {
      client.release();
    }
  },
);

t.test(
  'a dispatch batch opens in one write (evidence, BEGIN, locks, final check, savepoint) and ends in one (outcomes, COMMIT)',
  async (t) => {
    const e = await dispatchEnv(t);
    const q = bindQueries(dispatcherQueries, e.config.schemaQuoted);
    const names = [q.evidenceRecordBatch, q.operationLockForDispatchBatch, q.operationFinalCheckBatch].map(
      (text) => prepared(text).name,
    );
    const outcomeName = prepared(q.operationCompleteBatch).name;
    const pool = createPool(e.url, { max: 20, statementTimeoutMs: 30_000, applicationName: 'one-write-dispatcher' });
    const writes = recordSocketWrites(pool);
    const d = await openDispatcher(
      { ...e.runtime, pool, metrics: new Metrics({ defaultMetrics: false, ledger: false }) },
      e.env,
      { concurrency: 4 },
    );
    t.teardown(async () => {
      await d.stop(5000);
      await pool.end();
    });
    await d.start();
    const r = await e.ledger.reserve(ctx('one-write'), 'issue_refund', {
      order_id: 'ord-1w',
      amount: 120,
      currency: 'EUR',
    });
    t.equal((await settled(e.pool, r.operation_id)).status, 'succeeded');
    const batch = writes.filter((w) => w.includes(names[0]!));
    t.equal(batch.length, 1, 'one write carried the evidence statement');
    const at = (marker: string): number => batch[0]?.indexOf(marker) ?? -1;
    const order = [names[0]!, 'BEGIN', names[1]!, names[2]!, 'SAVEPOINT outcomes'].map(at);
    t.ok(
      order.every((p, i) => p >= 0 && (i === 0 || p > order[i - 1]!)),
      `and, in order, BEGIN, the locks, the final check and the savepoint (${order.join(', ')})`,
    );
    const outcome = writes.filter((w) => w.includes(outcomeName));
    t.equal(outcome.length, 1, 'one write carried the outcome statement');
    t.ok(
      (outcome[0]?.indexOf('COMMIT') ?? -1) > (outcome[0]?.indexOf(outcomeName) ?? 0),
      'and the COMMIT behind it (db/db.ts queryThenCommit)',
    );
  },
);

/** A started dispatcher behind a proxy watching `watchBatch`, once it has dispatched one operation reserved for `step`. */
async function dispatchOneThroughProxy(
  t: Test,
  step: string,
  watchBatch: true | 'evidence',
): Promise<ProxiedDispatcher> {
  const proxied = await dispatcherThroughProxy(t, { watchBatch });
  const { e, d } = proxied;
  await d.start();
  const r = await e.ledger.reserve(ctx(step), 'issue_refund', {
    order_id: `ord-${step}`,
    amount: 120,
    currency: 'EUR',
  });
  t.equal((await settled(e.pool, r.operation_id)).status, 'succeeded');
  t.equal(e.provider.requestsFor(r.effect_key), 1, 'sent once');
  return proxied;
}

t.test('a dispatch batch writes BEGIN, its locks, its final check and its savepoint in one round trip', async (t) => {
  const { proxy, lockName, checkName } = await dispatchOneThroughProxy(t, 'pipelined', true);
  t.ok(proxy.holds.length >= 1, `the dispatcher began a transaction (${proxy.holds.length})`);
  t.same(
    proxy.holds.filter((h) => h.seen.includes(lockName)),
    [{ pipelined: true, seen: [lockName, checkName, 'SAVEPOINT outcomes'] }],
    'the batch: its locks, check and savepoint reached the server before BEGIN was answered',
  );
});

t.test(
  'a dispatch batch writes its evidence statement, BEGIN, its locks, its final check and its savepoint in one round trip',
  async (t) => {
    const { proxy, lockName, checkName } = await dispatchOneThroughProxy(t, 'evidence-pipelined', 'evidence');
    t.same(
      proxy.holds,
      [{ pipelined: true, seen: ['BEGIN', lockName, checkName, 'SAVEPOINT outcomes'] }],
      'the batch reached the server before its evidence statement was answered',
    );
  },
);

t.test(
  'a kill switch committed while the row-lock statement waits on a table lock is seen by the check written with it',
  async (t) => {
    const { e, d, proxy, checkName } = await dispatcherThroughProxy(t);
    const other = new pg.Client({ connectionString: e.url });
    await other.connect();
    t.teardown(() => other.end());
    const held = proxy.holdNextRequests();
    await d.start();
    const r = await e.ledger.reserve(ctx('switched'), 'issue_refund', {
      order_id: 'ord-s',
      amount: 120,
      currency: 'EUR',
    });
    // The batch's BEGIN, locks, check and savepoint wait in the proxy (its evidence statement went ahead).
    const text = await held.arrived;
    t.ok(text.includes(checkName), 'the final check was written with the locks');
    // Another session takes a table lock the row-lock statement waits on (SKIP LOCKED skips rows, not tables),
    // so it runs first and waits, with the check behind it.
    await other.query('BEGIN');
    await other.query(`LOCK TABLE ${e.config.schemaQuoted}.operations IN EXCLUSIVE MODE`);
    held.release();
    for (let i = 0; ; i++) {
      const { rows } = await e.pool.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND application_name = $1",
        [PROXIED_DISPATCHER],
      );
      if (rows[0]!.n > 0) break;
      if (i > 500) throw new Error('the row locks never waited');
      await new Promise((res) => setTimeout(res, 20));
    }
    await other.query(
      `INSERT INTO ${e.config.schemaQuoted}.gate_kill_switches (tenant_id, tool_name, engaged_by, reason) VALUES ('tenant-a', '*', 'oncall', 'incident')`,
    );
    await other.query('COMMIT');
    // Stopped at the final check and given back to the queue, where the switch holds it.
    let moved: { reason: string; detail: { stage?: string } }[] = [];
    for (let i = 0; moved.length === 0; i++) {
      if (i > 500) throw new Error('the claim never ended');
      moved = (
        await e.pool.query<{ reason: string; detail: { stage?: string } }>(
          `SELECT reason, detail FROM ${e.config.schemaQuoted}.operation_history WHERE operation_id = $1 AND from_status = 'executing'`,
          [r.operation_id],
        )
      ).rows;
      if (moved.length === 0) await new Promise((res) => setTimeout(res, 20));
    }
    t.match(
      moved,
      [{ reason: 'released:tool_disabled', detail: { stage: 'final_check' } }],
      'the check saw the switch committed before the locks were granted',
    );
    t.equal(e.provider.requestsFor(r.effect_key), 0, 'nothing sent');
  },
);
