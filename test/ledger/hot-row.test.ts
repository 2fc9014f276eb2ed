/**
 * The operation row on the happy path is updated in place (sql/0018_hot_ledger_row.sql): no index of the operations
 * table names a column the claim or the outcome changes, so PostgreSQL writes both as HOT updates, with no new index
 * entry. What the dropped status indexes found is kept in step by the transition trigger: `attention` for the states
 * a person or the reconciler must find again, operation_claims for the executing ones.
 */
import t from 'tap';
import pg from 'pg';
import { bindQueries } from '../../db/db.js';
import { migrate, readMigrations } from '../../db/migrate.js';
import { dispatcherQueries } from '../../dispatcher/queries.js';
import { compensatorQueries } from '../../compensator/queries.js';
import { reconcilerQueries } from '../../reconciler/queries.js';
import { createTestDatabase, ctx, ledgerFixture } from '../helpers/db.js';

const args = { order_id: 'ord-1', amount: 1000, currency: 'EUR' };
const dq = bindQueries(dispatcherQueries, '"actionledger"');
const rq = bindQueries(reconcilerQueries, '"actionledger"');

/** Columns an operation's claim or outcome writes (dispatcher/queries.ts, ledger/transitions.ts). */
const MOVING_COLUMNS = [
  'status',
  'claim_token',
  'claimed_by',
  'claimed_at',
  'attempt',
  'provider_contact',
  'provider_receipt',
  'result_json',
  'review_reason',
  'updated_at',
  'dispatch_releases',
];

t.test('no index of the operations table names a column that the claim or the outcome changes', async (t) => {
  const { pool } = await ledgerFixture(t);
  const { rows } = await pool.query<{ index: string; columns: string[]; predicate: string | null }>(`
    SELECT i.indexrelid::regclass::text AS index,
           array(SELECT a.attname::text FROM pg_attribute a
                 WHERE a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey::int2[])) AS columns,
           pg_get_expr(i.indpred, i.indrelid) AS predicate
    FROM pg_index i WHERE i.indrelid = 'actionledger.operations'::regclass`);
  t.ok(rows.length >= 5, `the operations indexes: ${rows.map((r) => r.index).join(', ')}`);
  for (const r of rows) {
    const named = [...r.columns, ...(r.predicate === null ? [] : (r.predicate.match(/[a-z_]+/g) ?? []))];
    t.same(
      named.filter((c) => MOVING_COLUMNS.includes(c)),
      [],
      `${r.index} (${r.columns.join(', ')}${r.predicate === null ? '' : ` WHERE ${r.predicate}`})`,
    );
  }
});

t.test('the history is indexed once, by operation', async (t) => {
  const { pool } = await ledgerFixture(t);
  const { rows } = await pool.query<{ def: string }>(
    `SELECT pg_get_indexdef(indexrelid) AS def FROM pg_index
     WHERE indrelid = 'actionledger.operation_history'::regclass`,
  );
  t.same(
    rows.map((r) => r.def.replace(/^.* USING /, '')),
    ['btree (operation_id, id)'],
  );
});

t.test('reservations claimed and completed in batches are updated in place (HOT)', async (t) => {
  const { ledger, pool } = await ledgerFixture(t);
  const ids: string[] = [];
  for (let i = 0; i < 12; i++)
    ids.push((await ledger.reserve(ctx({ workflow_step_id: `s${i}` }), 'issue_refund', args)).operation_id);
  const c = await pool.connect();
  t.teardown(() => c.release());
  const stats = async () => {
    await c.query('SELECT pg_stat_force_next_flush()');
    await c.query('SELECT 1');
    const { rows } = await c.query<{ upd: number; hot: number }>(
      `SELECT n_tup_upd::int AS upd, n_tup_hot_upd::int AS hot FROM pg_stat_user_tables
       WHERE relid = 'actionledger.operations'::regclass`,
    );
    return rows[0]!;
  };
  const before = await stats();
  let claimed = 0;
  for (let batch = 0; batch < 2; batch++) {
    const { rows } = await c.query<{ operation_id: string; claim_token: string }>(dq.outboxClaimBatch, [6, 'w-1']);
    t.equal(rows.length, 6, `claim ${batch + 1} took 6`);
    claimed += rows.length;
    const listed = await c.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM actionledger.operation_claims WHERE claimed_by = 'w-1'",
    );
    t.equal(listed.rows[0]!.n, claimed, 'each executing operation is listed under its worker');
    const done = await c.query<{ operation_id: string }>(dq.operationCompleteBatch, [
      rows.map((r) => r.operation_id),
      rows.map((r) => r.claim_token),
      rows.map(() => 'succeeded'),
      rows.map((r) => `receipt-${r.operation_id}`),
      rows.map(() => '{"ok":true}'),
      rows.map(() => null),
      rows.map(() => 'provider:ok'),
      'w-1',
      rows.map(() => null),
    ]);
    t.equal(done.rows.length, 6);
    claimed -= 6;
  }
  const after = await stats();
  t.equal(after.upd - before.upd, 24, 'two updates per operation');
  // Room for an outcome's version comes back when the page's versions from before the claim are pruned, which waits
  // for every snapshot older than the claim in this database (an autovacuum worker's, on a loaded machine): alone,
  // all 24 updates were HOT; beside other test files, 17 once. Before migration 0018, none was.
  t.ok(
    after.hot - before.hot >= 12,
    `at least half of them HOT: ${after.hot - before.hot} of ${after.upd - before.upd}`,
  );
  const { rows } = await c.query<{ status: string; attention: string | null; n: number }>(
    'SELECT status, attention, count(*)::int AS n FROM actionledger.operations GROUP BY 1, 2',
  );
  t.same(rows, [{ status: 'succeeded', attention: null, n: 12 }]);
  const listed = await c.query<{ n: number }>('SELECT count(*)::int AS n FROM actionledger.operation_claims');
  t.equal(listed.rows[0]!.n, 0, 'no claim listed once every operation ended');
});

t.test('attention and the claim listing follow every move, the hand-made ones too', async (t) => {
  const { ledger, pool } = await ledgerFixture(t);
  const id = (await ledger.reserve(ctx(), 'issue_refund', args)).operation_id;
  const state = async () => {
    const { rows } = await pool.query<{ status: string; attention: string | null; listed: string | null }>(
      `SELECT o.status, o.attention, c.claimed_by AS listed
       FROM actionledger.operations o LEFT JOIN actionledger.operation_claims c USING (operation_id)
       WHERE o.operation_id = $1`,
      [id],
    );
    return rows[0];
  };
  t.same(await state(), { status: 'pending', attention: null, listed: null });
  const claim = await pool.query<{ claim_token: string }>(dq.outboxClaimBatch, [1, 'w-1']);
  t.same(await state(), { status: 'executing', attention: null, listed: 'w-1' });

  // Handed to another worker by hand: the listing moves with it.
  await pool.query("UPDATE actionledger.operations SET claimed_by = 'w-2' WHERE operation_id = $1", [id]);
  t.same(await state(), { status: 'executing', attention: null, listed: 'w-2' });

  // Released, never sent: back to pending, no longer listed.
  await pool.query(dq.operationRelease, [id, claim.rows[0]!.claim_token, 'w-2', 'released:test', 0, '{}', true]);
  t.same(await state(), { status: 'pending', attention: null, listed: null });
  const again = await pool.query<{ claim_token: string }>(dq.outboxClaimBatch, [1, 'w-3']);
  t.same(await state(), { status: 'executing', attention: null, listed: 'w-3' });

  // The outcome is unknown: the reconciler finds it through `attention`, due at once.
  await pool.query(dq.operationCompleteBatch, [
    [id],
    [again.rows[0]!.claim_token],
    ['unknown'],
    [null],
    ['{}'],
    [null],
    ['provider:timeout'],
    'w-3',
    [null],
  ]);
  t.same(await state(), { status: 'unknown', attention: 'unknown', listed: null });
  const due = await pool.query<{ operation_id: string }>(rq.candidates, [60_000, 10]);
  t.same(
    due.rows.map((r) => r.operation_id),
    [id],
    'a due unknown operation is a reconciler candidate',
  );

  for (const [to, reason] of [
    ['needs_review', 'forged'],
    ['failed', null],
  ] as const) {
    await pool.query(
      'UPDATE actionledger.operations SET status = $2, review_reason = coalesce($3, review_reason) WHERE operation_id = $1',
      [id, to, reason],
    );
    t.same(await state(), { status: to, attention: to, listed: null });
  }

  const err = await pool
    .query('UPDATE actionledger.operations SET attention = NULL WHERE operation_id = $1', [id])
    .then(
      () => null,
      (e: unknown) => e as { code?: string; constraint?: string },
    );
  t.match(err, { code: '23514', constraint: 'operations_attention_matches_status' }, 'attention cannot disagree');

  // A row written directly in a state other than pending (a restore) gets the same bookkeeping.
  await pool.query(`
    INSERT INTO actionledger.operations (operation_id, effect_key, effect_key_id, principal_id, task_id,
      workflow_step_id, tool_name, tenant_id, provider_id, provider_endpoint, idempotency_header,
      canonical_args_sha256, arguments_json, current_approval_id, current_policy_version, status, claim_token,
      claimed_by, claimed_at, review_reason)
    VALUES ('00000000-0000-4000-8000-00000000000a', 'restored-a', 'k1', 'p', 't', 's1', 'issue_refund', 'tenant-a',
      'x', 'x', 'x', repeat('0', 64), '{}', 'a', 'v', 'executing', gen_random_uuid(), 'w-9', now(), NULL),
      ('00000000-0000-4000-8000-00000000000b', 'restored-b', 'k1', 'p', 't', 's2', 'issue_refund', 'tenant-a',
      'x', 'x', 'x', repeat('0', 64), '{}', 'a', 'v', 'needs_review', NULL, NULL, NULL, 'restored')`);
  const restored = await pool.query<{ status: string; attention: string | null; listed: string | null }>(`
    SELECT o.status, o.attention, c.claimed_by AS listed
    FROM actionledger.operations o LEFT JOIN actionledger.operation_claims c USING (operation_id)
    WHERE o.effect_key LIKE 'restored-%' ORDER BY o.effect_key`);
  t.same(restored.rows, [
    { status: 'executing', attention: null, listed: 'w-9' },
    { status: 'needs_review', attention: 'needs_review', listed: null },
  ]);
});

t.test('migration 0018 lists the executing operations and names the attention states of existing rows', async (t) => {
  const url = await createTestDatabase(t, { empty: true });
  const c = new pg.Client({ connectionString: url });
  // The database is dropped WITH (FORCE) at teardown: a connection still open then gets an 'error' event.
  c.on('error', () => undefined);
  await c.connect();
  t.teardown(() => c.end());
  const all = readMigrations();
  const v18 = all.findIndex((m) => m.version === 18);
  t.equal(all[v18]?.name, 'hot_ledger_row');
  await migrate(c, 'm', '"m"', all.slice(0, v18));
  await c.query('SET search_path TO m');
  await c.query("SELECT set_config('actionledger.notifications', 'off', false)");
  await c.query(`
    INSERT INTO operations (operation_id, effect_key, effect_key_id, principal_id, task_id, workflow_step_id,
      tool_name, tenant_id, provider_id, provider_endpoint, idempotency_header, canonical_args_sha256,
      arguments_json, current_approval_id, current_policy_version, status, claim_token, claimed_by, review_reason)
    SELECT ('00000000-0000-4000-8000-00000000000' || i)::uuid, 'k-' || s, 'k1', 'p', 't', 's-' || s, 'issue_refund',
      'tenant-a', 'x', 'x', 'x', repeat('0', 64), '{}', 'a', 'v', s,
      CASE WHEN s = 'executing' THEN gen_random_uuid() END, CASE WHEN s = 'executing' THEN 'w-1' END,
      CASE WHEN s = 'needs_review' THEN 'forged' END
    FROM unnest(ARRAY['pending', 'executing', 'succeeded', 'unknown', 'needs_review', 'compensating', 'failed'])
      WITH ORDINALITY AS x(s, i)`);
  // A concurrent build of the history's new key that failed beforehand left an invalid index under its name.
  await c.query('CREATE UNIQUE INDEX operation_history_operation_key ON operation_history (operation_id, id)');
  await c.query(
    "UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'm.operation_history_operation_key'::regclass",
  );
  await migrate(c, 'm', '"m"', all.slice(0, v18 + 1));
  const key = await c.query<{ valid: boolean; primary: boolean }>(`
    SELECT indisvalid AS valid, indisprimary AS primary FROM pg_index
    WHERE indexrelid = 'm.operation_history_pkey'::regclass`);
  t.same(key.rows, [{ valid: true, primary: true }], 'the invalid index was built again as the primary key');
  const { rows } = await c.query<{ status: string; attention: string | null; listed: string | null }>(`
    SELECT o.status, o.attention, l.claimed_by AS listed
    FROM operations o LEFT JOIN operation_claims l USING (operation_id) ORDER BY o.operation_id`);
  t.same(rows, [
    { status: 'pending', attention: null, listed: null },
    { status: 'executing', attention: null, listed: 'w-1' },
    { status: 'succeeded', attention: null, listed: null },
    { status: 'unknown', attention: 'unknown', listed: null },
    { status: 'needs_review', attention: 'needs_review', listed: null },
    { status: 'compensating', attention: 'compensating', listed: null },
    { status: 'failed', attention: 'failed', listed: null },
  ]);
});

t.test('the background passes find the states they look for without reading every operation', async (t) => {
  const { ledger, pool } = await ledgerFixture(t);
  const cq = bindQueries(compensatorQueries, '"actionledger"');
  for (let i = 0; i < 3; i++) await ledger.reserve(ctx({ workflow_step_id: `s${i}` }), 'issue_refund', args);
  await pool.query(dq.outboxClaimBatch, [3, 'w-1']);
  // Thousands of ended operations, the ledger's usual bulk, none of them what a pass looks for.
  await pool.query(`
    INSERT INTO actionledger.operations (operation_id, effect_key, effect_key_id, principal_id, task_id, workflow_step_id,
      tool_name, tenant_id, provider_id, provider_endpoint, idempotency_header, canonical_args_sha256,
      arguments_json, current_approval_id, current_policy_version, status, provider_receipt)
    SELECT gen_random_uuid(), 'bulk-' || i, 'k1', 'p', 'task-' || i, 's', 'issue_refund', 'tenant-a', 'x', 'x', 'x', repeat('0', 64),
      '{}', 'a', 'v', 'succeeded', 'r-' || i
    FROM generate_series(1, 5000) AS i`);
  // As autovacuum keeps them: statistics for both, the claim listing's included.
  await pool.query('ANALYZE actionledger.operations, actionledger.operation_claims');
  const seqScans = (node: Record<string, unknown>): string[] => [
    ...(node['Node Type'] === 'Seq Scan' && node['Relation Name'] === 'operations' ? ['operations'] : []),
    ...((node['Plans'] as Record<string, unknown>[] | undefined) ?? []).flatMap(seqScans),
  ];
  for (const [name, text, params] of [
    ['the reconciler candidates', rq.candidates, [60_000, 10]],
    ['the orphan watch', rq.orphansWaiting, [60_000]],
    ['the compensator: compensations that moved on', cq.endedCompensations, []],
    ['the compensator: tasks with a failed step', cq.tasksWithFailedStep, []],
  ] as const) {
    const { rows } = await pool.query<{ 'QUERY PLAN': [{ Plan: Record<string, unknown> }] }>(
      `EXPLAIN (FORMAT JSON) ${text}`,
      [...params],
    );
    t.same(seqScans(rows[0]!['QUERY PLAN'][0].Plan), [], `${name}: no sequential scan of operations`);
  }
});
