/**
 * `npm run bench:scaling`: does the claim stay flat as the queue and the ledger grow?
 *
 * For 1,000, 10,000 and 100,000 queued operations (and for 1,000 queued beside 100,000 finished ones), the
 * dispatcher's own claim statement (batch of 32) is run repeatedly, each time inside a transaction that is
 * rolled back so the queue keeps its size, and its p50/p99 are reported beside the 1,000-queued baseline of
 * the same run. The claim's plan is read with EXPLAIN and the scans it uses are printed: the outbox holds only
 * what waits (rows are deleted on claim), so finished operations never enter the claim's scan.
 */
import { randomBytes } from 'node:crypto';
import { bindQueries, createPool, type Pool } from '../core/db.js';
import { migrate } from '../core/migrate.js';
import { dispatcherQueries } from '../dispatcher/queries.js';
import { freshDatabase, machine, openBenchDatabase, percentiles, printTable, saveResults, type ResultEntry } from './harness.js';

const CLAIMS = Number(process.env.BENCH_CLAIMS ?? 300);
const q = bindQueries(dispatcherQueries, '"actionledger"');

/** Inserts `n` operations in `status` (with an outbox row when pending) by set-based SQL: loading, not measuring. */
async function load(pool: Pool, n: number, status: 'pending' | 'succeeded'): Promise<void> {
  const salt = randomBytes(4).toString('hex');
  for (let done = 0; done < n; done += 20_000) {
    const m = Math.min(20_000, n - done);
    await pool.query(
      `WITH ins AS (
         INSERT INTO actionledger.operations (operation_id, effect_key, effect_key_id, principal_id, task_id, workflow_step_id, tool_name,
           tenant_id, provider_id, provider_endpoint, idempotency_header, canonical_args_sha256, arguments_json,
           current_approval_id, current_policy_version, status, provider_receipt)
         SELECT gen_random_uuid(), 'v1.k1.' || encode(sha256(($1 || i)::bytea), 'hex'), 'k1', 'bench', $1 || '-' || i, 's1', 'issue_refund',
           'tenant-a', 'billing', 'https://localhost:9443/v1/refunds', 'Idempotency-Key', encode(sha256(('a' || i)::bytea), 'hex'),
           jsonb_build_object('order_id', 'o-' || i, 'amount', i), 'a1', 'v1', $2, CASE WHEN $2 = 'succeeded' THEN 'r-' || i END
         FROM generate_series($3::int, $4::int) i
         RETURNING operation_id, status
       )
       INSERT INTO actionledger.outbox (operation_id, attempt, available_at)
       SELECT operation_id, 1, now() - interval '1 second' FROM ins WHERE status = 'pending'`,
      [`${status}-${salt}-${done}`, status, done + 1, done + m],
    );
  }
  await pool.query('ANALYZE actionledger.operations');
  await pool.query('ANALYZE actionledger.outbox');
}

async function claimTimes(pool: Pool): Promise<number[]> {
  const client = await pool.connect();
  const times: number[] = [];
  try {
    for (let i = 0; i < CLAIMS; i++) {
      await client.query('BEGIN');
      const t0 = process.hrtime.bigint();
      const { rowCount } = await client.query(q.outboxClaimBatch, [32, 'bench-worker']);
      times.push(Number(process.hrtime.bigint() - t0) / 1e6);
      await client.query('ROLLBACK');
      if (rowCount !== 32) throw new Error(`claim returned ${rowCount} rows`);
    }
  } finally {
    client.release();
  }
  return times;
}

/** The scans in the claim's plan, e.g. "Index Scan using outbox_available_idx on outbox". */
async function planScans(pool: Pool): Promise<string> {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const { rows } = await client.query<{ 'QUERY PLAN': unknown }>(`EXPLAIN (FORMAT JSON) ${q.outboxClaimBatch}`, [32, 'bench-worker']);
    await client.query('ROLLBACK');
    const scans: string[] = [];
    const walk = (node: Record<string, unknown>): void => {
      const type = String(node['Node Type'] ?? '');
      if (type.includes('Scan')) scans.push(`${type}${node['Index Name'] ? ` using ${String(node['Index Name'])}` : ''} on ${String(node['Relation Name'] ?? '?')}`);
      for (const child of (node.Plans as Record<string, unknown>[] | undefined) ?? []) walk(child);
    };
    const plan = (rows[0]?.['QUERY PLAN'] as { Plan: Record<string, unknown> }[])[0]?.Plan;
    if (plan !== undefined) walk(plan);
    return [...new Set(scans)].join('; ');
  } finally {
    client.release();
  }
}

async function main(): Promise<void> {
  const db = await openBenchDatabase();
  process.stdout.write(`# PostgreSQL ${db.version}; ${machine()}; ${CLAIMS} claims of 32 per row, each rolled back\n`);
  const cases: { name: string; queued: number; finished: number }[] = [
    { name: 'queued 1,000', queued: 1_000, finished: 0 },
    { name: 'queued 10,000', queued: 10_000, finished: 0 },
    { name: 'queued 100,000', queued: 100_000, finished: 0 },
    { name: 'queued 1,000 + finished 100,000', queued: 1_000, finished: 100_000 },
  ];
  const rows: (string | number)[][] = [];
  const entries: ResultEntry[] = [];
  let base: { p50Ms: number; p99Ms: number } | undefined;
  for (const [i, c] of cases.entries()) {
    const url = await freshDatabase(db.adminUrl, `al_bench_scaling_${i}`);
    const pool = createPool(url, { max: 4, statementTimeoutMs: 600_000, applicationName: 'bench' });
    const client = await pool.connect();
    await migrate(client, 'actionledger', '"actionledger"');
    client.release();
    if (c.finished > 0) await load(pool, c.finished, 'succeeded');
    await load(pool, c.queued, 'pending');
    await claimTimes(pool); // warm
    const p = percentiles(await claimTimes(pool));
    base ??= p;
    const scans = await planScans(pool);
    rows.push([c.name, p.p50Ms, p.p99Ms, p.p50Ms / base.p50Ms, scans]);
    entries.push({ name: 'claim_32', concurrency: 1, ops_per_s: 1000 / p.p50Ms, p50_ms: p.p50Ms, p99_ms: p.p99Ms, ratio_to_1000_queued_p50: p.p50Ms / base.p50Ms, queued: c.queued, finished: c.finished, plan: scans } as ResultEntry);
    await pool.end();
  }
  printTable(['ledger', 'claim p50 ms', 'claim p99 ms', 'p50 / 1,000 queued', 'scans in the claim plan'], rows);
  saveResults('scaling', entries, { machine: machine(), postgres: db.version, claims_per_row: String(CLAIMS) });
  await db.close();
}

main().catch((err: unknown) => {
  process.stderr.write(`${(err as Error)?.stack ?? String(err)}\n`);
  process.exit(1);
});
