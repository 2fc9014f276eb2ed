/**
 * The claim benchmark's own pieces (no timing assertions): the plan summary it prints, and the previous claim
 * it measures beside the shipped one, which must take exactly the operations the shipped claim takes, kill
 * switches included, or the rewrite changed what is claimed; and the shipped claim's plan on a large queue.
 */
import t from 'tap';
import { bindQueries, createPool } from '../../db/db.js';
import { dispatcherQueries } from '../../dispatcher/queries.js';
import { explainClaim, loadOperations, previousClaim, SHIPPED, summarizePlan } from '../../bench/claim-scaling.js';
import { ruledOutNodes } from '../../bench/claim-plan.js';
import { createTestDatabase } from '../helpers/db.js';

const q = bindQueries(dispatcherQueries, '"actionledger"');

t.test("summarizePlan: the pick's scans, the rows they read and the statement's buffers", (t) => {
  const plan = [
    'CTE Scan on claimed  (cost=1.00..2.00 rows=32 width=452) (actual time=0.1..0.2 rows=32.00 loops=1)',
    '  Buffers: shared hit=1200 read=34',
    '  CTE picked',
    '    ->  Limit',
    '          ->  Index Scan using outbox_available_idx on outbox o  (cost=0.29..50.00 rows=1000 width=34) (actual time=0.010..0.015 rows=32.00 loops=1)',
    '          ->  Index Scan using operations_pkey on operations l  (cost=0.29..0.50 rows=1 width=44) (actual time=0.002..0.002 rows=1.00 loops=32)',
    '  CTE taken',
    '          ->  Index Scan using outbox_pkey on outbox o_1  (cost=0.42..8.44 rows=1 width=26) (actual time=0.004..0.004 rows=1.00 loops=32)',
    'Execution Time: 2.195 ms',
  ].join('\n');
  const s = summarizePlan(plan);
  t.equal(s.scans, 'Index Scan using outbox_available_idx on outbox; Index Scan using operations_pkey on operations');
  t.equal(s.rowsRead, 64);
  t.equal(s.buffers, 1234);
  t.equal(s.executionMs, 2.195);
  t.end();
});

t.test('ruledOutNodes: the nodes the claim connection rules out, once each, index scans not among them', (t) => {
  const plan = [
    'CTE Scan on claimed  (cost=1.00..2.00 rows=32 width=452) (actual time=0.1..0.2 rows=32.00 loops=1)',
    '  ->  Hash Join  (cost=10.00..20.00 rows=32 width=44)',
    '        ->  Seq Scan on outbox o  (cost=0.00..5.00 rows=200 width=34)',
    '        ->  Hash  (cost=5.00..5.00 rows=200 width=16)',
    '              ->  Seq Scan on operations l  (cost=0.00..5.00 rows=200 width=16)',
    '  ->  Hash Join  (cost=10.00..20.00 rows=32 width=44)',
    '  ->  Index Scan using operations_pkey on operations l_1  (cost=0.29..0.50 rows=1 width=44)',
    '  ->  Bitmap Heap Scan on gate_kill_switches k  (cost=4.00..8.00 rows=1 width=0)',
    '  ->  Sort  (cost=1.00..1.10 rows=32 width=8)',
  ].join('\n');
  t.same(ruledOutNodes(plan), [
    'Hash Join',
    'Seq Scan on outbox',
    'Seq Scan on operations',
    'Bitmap Heap Scan on gate_kill_switches',
    'Sort',
  ]);
  t.same(ruledOutNodes('Index Scan using outbox_available_idx on outbox o'), []);
  t.end();
});

t.test('the previous claim takes the same operations as the shipped one, kill switches included', async (t) => {
  const previous = previousClaim(q.outboxClaimBatch);
  if (previous === null) {
    t.fail(
      'the shipped claim no longer has the kill-switch test the benchmark rewrites: update bench/claim-scaling.ts',
    );
    return;
  }
  t.not(previous, q.outboxClaimBatch);
  const pool = createPool(await createTestDatabase(t), { max: 2, statementTimeoutMs: 30_000, applicationName: 'test' });
  t.teardown(() => pool.end());
  await loadOperations(pool, 20, 'pending', 'tenant-a');
  await loadOperations(pool, 20, 'pending', 'tenant-b');
  await loadOperations(pool, 10, 'succeeded', 'tenant-a');
  const claim = async (text: string, batch: number): Promise<string[]> => {
    const c = await pool.connect();
    try {
      await c.query('BEGIN');
      const { rows } = await c.query<{ operation_id: string }>(text, [batch, 'test-worker']);
      return rows.map((r) => r.operation_id).sort();
    } finally {
      await c.query('ROLLBACK');
      c.release();
    }
  };
  const switches: [string, string][][] = [
    [],
    [['tenant-b', '*']],
    [['*', 'issue_refund']],
    [
      ['tenant-a', 'issue_refund'],
      ['tenant-z', '*'],
    ],
    [['*', 'send_email']],
  ];
  for (const set of switches) {
    await pool.query('DELETE FROM actionledger.gate_kill_switches');
    for (const [tenant, tool] of set) {
      await pool.query(
        `INSERT INTO actionledger.gate_kill_switches (tenant_id, tool_name, engaged_by, reason) VALUES ($1, $2, 'test', 'test')`,
        [tenant, tool],
      );
    }
    for (const batch of [5, 32, 100]) {
      const shipped = await claim(q.outboxClaimBatch, batch);
      t.same(
        await claim(previous, batch),
        shipped,
        `kill switches ${JSON.stringify(set)}, batch ${batch}: ${shipped.length} operations`,
      );
    }
  }
  const all = await claim(previous, 100);
  t.equal(all.length, 40, 'no kill switch: every pending operation, none of the finished ones');
});

t.test(
  'the shipped claim walks the outbox index on a large queue, with or without a kill switch analyzed',
  async (t) => {
    const pool = createPool(await createTestDatabase(t), {
      max: 2,
      statementTimeoutMs: 60_000,
      applicationName: 'test',
    });
    t.teardown(() => pool.end());
    await loadOperations(pool, 20_000, 'pending', 'tenant-a');
    await pool.query('ANALYZE actionledger.operations');
    await pool.query('ANALYZE actionledger.outbox');
    // As the dispatcher sends it, and unnamed (as it runs where the claim settings did not take).
    const check = async (name: string): Promise<void> => {
      for (const [how, statement] of [
        ['named', SHIPPED],
        ['unnamed', { text: q.outboxClaimBatch, named: false }],
      ] as const) {
        const plan = await explainClaim(pool, statement);
        const what = `${name}, ${how}`;
        t.match(plan.scans, /Index Scan using outbox_available_idx on outbox/, `${what}: the outbox index, in order`);
        t.notMatch(plan.scans, /Seq Scan/, `${what}: no sequential scan`);
        t.ok(plan.rowsRead <= 1000, `${what}: reads the first rows only (${plan.rowsRead} of 40,000)`);
      }
    };
    await check('kill switches never analyzed');
    await pool.query(
      `INSERT INTO actionledger.gate_kill_switches (tenant_id, tool_name, engaged_by, reason) VALUES ('tenant-z', '*', 'test', 'test')`,
    );
    await pool.query('ANALYZE actionledger.gate_kill_switches');
    await check('one kill switch for another tenant, analyzed');
    const previous = previousClaim(q.outboxClaimBatch);
    if (previous !== null) {
      const before = await explainClaim(pool, { text: previous, named: false });
      t.comment(`the previous claim here: ${before.scans}; rows read ${before.rowsRead}`);
    }
  },
);

t.test(
  "the dispatcher's batch statements find their operations by primary key, never through the open-operations index",
  async (t) => {
    const pool = createPool(await createTestDatabase(t), {
      max: 2,
      statementTimeoutMs: 60_000,
      applicationName: 'test',
    });
    t.teardown(() => pool.end());
    await loadOperations(pool, 5_000, 'pending', 'tenant-a');
    await pool.query('ANALYZE actionledger.operations');
    const ids = ['00000000-0000-4000-8000-000000000001', '00000000-0000-4000-8000-000000000002'];
    const at = new Date().toISOString();
    const statements: [string, unknown[]][] = [
      [
        q.evidenceRecordBatch,
        [ids, ids, [1, 1], ['a', 'a'], ['v', 'v'], ['x', 'x'], ['d', 'd'], [at, at], [at, at], 1000, 1000, 1000],
      ],
      [q.operationLockForDispatchBatch, [ids, ids]],
      [q.operationFinalCheckBatch, [ids, ids, 1000]],
      [
        q.operationCompleteBatch,
        [ids, ids, ['succeeded', 'succeeded'], ['r', 'r'], ['{}', '{}'], [null, null], ['x', 'x'], 'w', [null, null]],
      ],
    ];
    for (const [text, values] of statements) {
      const { rows } = await pool.query<{ 'QUERY PLAN': string }>(`EXPLAIN ${text}`, values);
      const plan = rows.map((r) => r['QUERY PLAN']).join('\n');
      const name = text.trim().split('\n')[0]!.slice(0, 60);
      t.match(plan, /operations_pkey/, `${name}: by primary key`);
      t.notMatch(plan, /operations_open_idx/, `${name}: not through operations_open_idx`);
    }
  },
);
