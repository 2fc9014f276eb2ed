/**
 * Does the claim stay flat as the queue and the ledger grow? The scaling part of `npm run bench`
 * (`npm run bench -- --only scaling` runs it alone).
 *
 * For each ledger (e.g. 1,000 / 10,000 / 100,000 / 1,000,000 queued operations, and 1,000 queued beside 100,000
 * finished ones) on a fresh database: the rows are bulk-loaded by set-based SQL (the load and the ANALYZE are
 * timed, and the times printed in the notes), then the loaded tables are analyzed,
 * as autovacuum would after such a load (`ANALYZE operations, outbox`; nothing else: the other tables are
 * left with the statistics a freshly migrated schema has in production, `gate_kill_switches` never analyzed).
 * Then the dispatcher's own claim statement (batch of 32) runs repeatedly, each time in a transaction that is
 * rolled back so the queue keeps its size, and EXPLAIN (ANALYZE, BUFFERS) of it is captured.
 *
 * Five claims are measured on each ledger (on a ledger whose case lists `variants`, only those; the 1,000,000
 * ledger measures only `shipped`), in this order:
 *   - `shipped`: the claim in dispatcher/queries.ts, with the statistics production has;
 *   - `previous`: the claim as it was before its kill-switch test was rewritten (a plain NOT EXISTS, which the
 *     planner turns into an anti-join; see PREVIOUS_KILL_SWITCH_TEST below), kept to show what the fix buys;
 *   - `previous, kill switches analyzed`: that claim after `ANALYZE gate_kill_switches`, the evidence for the
 *     cause (the empty, never-analyzed kill-switch table makes the planner expect the anti-join to leave one
 *     row, so it reads the whole queue instead of the first 32 entries of the outbox index);
 *   - `shipped / previous, 1 kill switch, analyzed`: with one kill switch for a tenant that has no queued
 *     work, analyzed: why analyzing the table was no fix (the estimate collapses again) and the rewrite is.
 *
 * The shipped claim is also measured beside the base ledger (the first case, loaded afresh on a database of its
 * own for each ledger): each claim on the ledger is paired with one on the base (after it, then before it, in
 * turn), and the table's `p50 / ... alongside` column is the ledger's p50 over the base's p50 from those same
 * moments, so load from other processes on a shared machine falls on both sides of that ratio. On the first
 * ledger itself it compares two copies of the same ledger: how far from 1 that is shows the noise.
 *
 * The shipped claims run as a dispatcher runs its claims (dispatcher/claim-session.ts): the named statement, on
 * a session with the claim's planner settings, so one generic plan, built at the first claim on the loaded and
 * analyzed ledger, serves them all, and EXPLAIN shows that plan (`EXPLAIN EXECUTE`). The previous claims are
 * sent unnamed (node-postgres without `name`), each execution planned with its own parameters; the run records
 * plan_cache_mode and the pool session's prepared statements.
 */
import { randomBytes } from 'node:crypto';
import type pg from 'pg';
import { bindQueries, createPool, prepared, type Pool, type PoolClient } from '../db/db.js';
import { migrate } from '../db/migrate.js';
import { openClaimConnection } from '../dispatcher/claim-session.js';
import { dispatcherQueries } from '../dispatcher/queries.js';
import { dropDatabase } from './cells.js';
import { freshDatabase, percentiles, type ResultEntry } from './harness.js';

const q = bindQueries(dispatcherQueries, '"actionledger"');
const BATCH = 32;

/**
 * A claim as a variant sends it: `named`, as a dispatcher does (the named statement on a session with the claim
 * settings, dispatcher/claim-session.ts), or as unnamed text.
 */
export interface ClaimStatement {
  text: string;
  named: boolean;
}

/** The shipped claim, sent as the dispatcher sends it. */
export const SHIPPED: ClaimStatement = { text: q.outboxClaimBatch, named: true };

/** A connection for `statement`'s claims: a named one gets a claim connection of its own, as a dispatcher does. */
export async function claimClient(pool: Pool, statement: ClaimStatement): Promise<pg.ClientBase> {
  if (!statement.named) return pool.connect();
  const { client, pinned } = await openClaimConnection(pool);
  if (!pinned) {
    await client.end();
    throw new Error('the claim connection did not get its planner settings: the dispatcher would claim unnamed here');
  }
  return client;
}

/** Gives a pool connection back, or closes a claim connection. */
export async function releaseClaimClient(client: pg.ClientBase, statement: ClaimStatement): Promise<void> {
  if (statement.named) await (client as pg.Client).end();
  else (client as PoolClient).release();
}

/** Sends `statement`'s claim of `batch` on `client`. */
function sendClaim(client: pg.ClientBase, statement: ClaimStatement, batch: number): Promise<pg.QueryResult> {
  const values = [batch, 'bench-worker'];
  return statement.named ? client.query({ ...prepared(statement.text), values }) : client.query(statement.text, values);
}

export interface ScalingCase {
  name: string;
  queued: number;
  finished: number;
  /** The claims measured on this ledger; all five when absent. */
  variants?: ClaimVariant[];
}

export const DEFAULT_CASES: ScalingCase[] = [
  { name: 'queued 1,000', queued: 1_000, finished: 0 },
  { name: 'queued 10,000', queued: 10_000, finished: 0 },
  { name: 'queued 100,000', queued: 100_000, finished: 0 },
  // Only the shipped claim: the others are kept to explain a plan choice, which 100,000 already shows, and the
  // previous claim reads the whole queue (seconds per claim at this size).
  { name: 'queued 1,000,000', queued: 1_000_000, finished: 0, variants: ['shipped'] },
  { name: 'queued 1,000 + finished 100,000', queued: 1_000, finished: 100_000 },
];

export const ALL_VARIANTS = [
  'shipped',
  'previous',
  'previous, kill switches analyzed',
  'shipped, 1 kill switch, analyzed',
  'previous, 1 kill switch, analyzed',
] as const;
export type ClaimVariant = (typeof ALL_VARIANTS)[number];

/**
 * The shipped claim's kill-switch test, `(no switch at all OR none for this row)`, and the plain NOT EXISTS it
 * replaced. The plain form becomes an anti-join whose estimate, from an empty never-analyzed table (or one with
 * a row for another tenant), is one row; under the OR it stays a filter, the uncorrelated EXISTS is evaluated
 * once per statement (an InitPlan), and the plan walks outbox_available_idx in order and stops after 32 rows.
 * Same result: the two forms are logically equivalent (test/bench/claim-scaling.test.ts).
 */
const SHIPPED_KILL_SWITCH_TEST =
  /AND \(NOT EXISTS \(SELECT 1 FROM ("actionledger"\.gate_kill_switches)\)\s*OR NOT EXISTS \(\s*SELECT 1 FROM "actionledger"\.gate_kill_switches k\s*WHERE (k\.tenant_id IN \(l\.tenant_id, '\*'\) AND k\.tool_name IN \(l\.tool_name, '\*'\))\)\)/;
const PREVIOUS_KILL_SWITCH_TEST = 'AND NOT EXISTS (\n          SELECT 1 FROM $1 k\n          WHERE $2)';

/**
 * The claim as it was before the fix, or null when the shipped claim no longer has the shape this rewrites: the
 * plain NOT EXISTS in place of the OR form.
 */
export function previousClaim(shipped: string = q.outboxClaimBatch): string | null {
  return SHIPPED_KILL_SWITCH_TEST.test(shipped)
    ? shipped.replace(SHIPPED_KILL_SWITCH_TEST, PREVIOUS_KILL_SWITCH_TEST)
    : null;
}

export interface ScalingRow {
  ledger: ScalingCase;
  variant: ClaimVariant;
  claims: number;
  p50Ms: number;
  p99Ms: number;
  /**
   * The shipped claim only: p50 of the same claim on the base ledger (the run's first case, on a database of
   * its own that nothing else touches), each of its claims run right after one of these; NaN for the others.
   */
  baseAlongsideP50Ms: number;
  /** Scans of operations and outbox in the claim's pick, e.g. "Index Scan using outbox_available_idx on outbox". */
  scans: string;
  /** Rows the pick read from operations and outbox (actual rows x loops of their scans). */
  rowsRead: number;
  /** Shared buffers hit + read by the whole statement. */
  buffers: number;
  explainMs: number;
  /** Whether the plan taken after the claims loop has the same scans as the one taken before it. */
  planStable: boolean;
  plan: string;
}

export interface ScalingResult {
  rows: ScalingRow[];
  /** Statistics and planner settings seen on each ledger, for the report. */
  notes: string[];
}

/**
 * Inserts `n` operations in `status` (with an outbox row when pending) by set-based SQL: loading, not measuring.
 * They are what a reservation of `issue_refund` on `route` would leave, with valid arguments hashes, so a real
 * dispatcher can send them; the effect keys are not HMACs, which dispatch does not check.
 */
export async function loadOperations(
  pool: Pool,
  n: number,
  status: 'pending' | 'succeeded',
  tenant = 'tenant-a',
  route: { providerId: string; endpoint: string } = {
    providerId: 'billing',
    endpoint: 'https://localhost:9443/v1/refunds',
  },
): Promise<void> {
  const salt = randomBytes(4).toString('hex');
  for (let done = 0; done < n; done += 20_000) {
    const m = Math.min(20_000, n - done);
    await pool.query(
      `WITH ins AS (
         INSERT INTO actionledger.operations (operation_id, effect_key, effect_key_id, principal_id, task_id, workflow_step_id, tool_name,
           tenant_id, provider_id, provider_endpoint, idempotency_header, canonical_args_sha256, arguments_json,
           current_approval_id, current_policy_version, status, provider_receipt)
         SELECT gen_random_uuid(), 'v1.k1.' || encode(sha256(($1 || i)::bytea), 'hex'), 'k1', 'bench', $1 || '-' || i, 's1', 'issue_refund',
           $5, $6, $7, 'Idempotency-Key',
           encode(sha256(convert_to('{"amount":' || i || ',"currency":"EUR","order_id":"o-' || i || '"}', 'UTF8')), 'hex'),
           jsonb_build_object('amount', i, 'currency', 'EUR', 'order_id', 'o-' || i), 'a1', 'v1', $2, CASE WHEN $2 = 'succeeded' THEN 'r-' || i END
         FROM generate_series($3::int, $4::int) i
         RETURNING operation_id, status
       )
       INSERT INTO actionledger.outbox (operation_id, attempt, available_at)
       SELECT operation_id, 1, now() - interval '1 second' FROM ins WHERE status = 'pending'`,
      [`${status}-${salt}-${done}`, status, done + 1, done + m, tenant, route.providerId, route.endpoint],
    );
  }
}

/** One claim in a transaction that is rolled back; its time in ms. */
export async function claimOnce(client: pg.ClientBase, statement: ClaimStatement): Promise<number> {
  await client.query('BEGIN');
  const t0 = process.hrtime.bigint();
  const { rowCount } = await sendClaim(client, statement, BATCH);
  const ms = Number(process.hrtime.bigint() - t0) / 1e6;
  await client.query('ROLLBACK');
  if (rowCount !== BATCH) throw new Error(`claim returned ${rowCount} rows`);
  return ms;
}

/**
 * Runs `statement` (a claim) in rolled-back transactions: first unmeasured warm-up claims (at most 10, for at
 * most a quarter of `maxMs`), then at most `maxClaims`, stopping after `maxMs` (at least 5), all on one session
 * (the first claims of a session pay for its caches and a named claim's planning). With `base`, each claim is
 * paired with the same claim on the base ledger (right after it, or right before it, in turn), so both see the
 * same moments of a shared machine; `baseTimes` are those.
 */
async function claimTimes(
  pool: Pool,
  statement: ClaimStatement,
  maxClaims: number,
  maxMs: number,
  base?: Pool,
): Promise<{ times: number[]; baseTimes: number[] }> {
  const client = await claimClient(pool, statement);
  const baseClient = base === undefined ? undefined : await claimClient(base, statement);
  const times: number[] = [];
  const baseTimes: number[] = [];
  try {
    const warmUntil = performance.now() + maxMs / 4;
    for (let i = 0; i < Math.min(10, maxClaims) && (i < 1 || performance.now() < warmUntil); i++) {
      await claimOnce(client, statement);
      if (baseClient !== undefined) await claimOnce(baseClient, statement);
    }
    const deadline = performance.now() + maxMs;
    for (let i = 0; i < maxClaims && (i < 5 || performance.now() < deadline); i++) {
      // The base goes second, then first, in turn: neither side is always the one after the pause.
      if (baseClient !== undefined && i % 2 === 1) baseTimes.push(await claimOnce(baseClient, statement));
      times.push(await claimOnce(client, statement));
      if (baseClient !== undefined && i % 2 === 0) baseTimes.push(await claimOnce(baseClient, statement));
    }
  } finally {
    await releaseClaimClient(client, statement);
    if (baseClient !== undefined) await releaseClaimClient(baseClient, statement);
  }
  return { times, baseTimes };
}

/**
 * The claim table's rows and the results entries for `rows`: each claim's p50 beside the same claim's p50 on
 * the first ledger of the run (`base`).
 */
export function scalingReport(
  rows: ScalingRow[],
  base: ScalingCase | undefined,
): { table: (string | number)[][]; entries: ResultEntry[] } {
  const table: (string | number)[][] = [];
  const entries: ResultEntry[] = [];
  for (const r of rows) {
    const first = rows.find((b) => b.variant === r.variant && b.ledger === base);
    const ratio = first === undefined ? NaN : r.p50Ms / first.p50Ms;
    const alongside = r.p50Ms / r.baseAlongsideP50Ms;
    table.push([
      r.ledger.name,
      r.variant,
      String(r.claims),
      r.p50Ms,
      r.p99Ms,
      ratio,
      Number.isNaN(alongside) ? '' : alongside,
      String(r.rowsRead),
      String(r.buffers),
      r.scans,
    ]);
    entries.push({
      name: `claim_32 ${r.variant}`,
      concurrency: 1,
      ops_per_s: 1000 / r.p50Ms,
      p50_ms: r.p50Ms,
      p99_ms: r.p99Ms,
      ratio_to_1000_queued_p50: ratio,
      ...(Number.isNaN(alongside)
        ? {}
        : { ratio_to_1000_queued_alongside_p50: alongside, base_alongside_p50_ms: r.baseAlongsideP50Ms }),
      queued: r.ledger.queued,
      finished: r.ledger.finished,
      claims: r.claims,
      rows_read_by_pick: r.rowsRead,
      shared_buffers: r.buffers,
      explain_analyze_ms: r.explainMs,
      plan_same_before_and_after_claims: r.planStable ? 'yes' : 'no',
      plan: r.scans,
    });
  }
  return { table, entries };
}

export interface PlanSummary {
  scans: string;
  rowsRead: number;
  buffers: number;
  executionMs: number;
  text: string;
}

/**
 * EXPLAIN (ANALYZE, BUFFERS) of a claim, rolled back, with the figures the tables show. A named claim is run
 * once first (rolled back too), so that its session holds the statement, and EXPLAIN shows that statement's plan.
 */
export async function explainClaim(pool: Pool, statement: ClaimStatement): Promise<PlanSummary> {
  const client = await claimClient(pool, statement);
  try {
    const values = [BATCH, 'bench-worker'];
    if (statement.named) {
      await client.query('BEGIN');
      await sendClaim(client, statement, BATCH);
      await client.query('ROLLBACK');
    }
    await client.query('BEGIN');
    const { rows } = statement.named
      ? await client.query<{ 'QUERY PLAN': string }>(
          `EXPLAIN (ANALYZE, BUFFERS) EXECUTE ${prepared(statement.text).name}(${BATCH}, 'bench-worker')`,
        )
      : await client.query<{ 'QUERY PLAN': string }>(`EXPLAIN (ANALYZE, BUFFERS) ${statement.text}`, values);
    await client.query('ROLLBACK');
    return summarizePlan(rows.map((r) => r['QUERY PLAN']).join('\n'));
  } finally {
    await releaseClaimClient(client, statement);
  }
}

/**
 * Reads the scans of the pick (aliases `o` and `l`: outbox and operations as the claim's first CTE names them;
 * the DELETE and UPDATE use other aliases), the rows they returned, and the statement's shared buffers.
 */
export function summarizePlan(text: string): PlanSummary {
  const lines = text.split('\n');
  const scans: string[] = [];
  let rowsRead = 0;
  for (const line of lines) {
    const m =
      /((?:Seq|Index Only|Index|Bitmap Heap) Scan)(?: using (\S+))? on (operations|outbox) (l|o)\s.*actual time=\S+ rows=([\d.]+) loops=(\d+)/.exec(
        line,
      );
    if (m === null) continue;
    scans.push(`${m[1]}${m[2] === undefined ? '' : ` using ${m[2]}`} on ${m[3]}`);
    rowsRead += Number(m[5]) * Number(m[6]);
  }
  // Bitmap heap scans name their index on the next line; add it to the summary.
  for (const line of lines) {
    const m = /Bitmap Index Scan on (\S+)/.exec(line);
    if (m !== null && /^(operations|outbox)_/.test(m[1] ?? '')) scans.push(`Bitmap Index Scan on ${m[1]}`);
  }
  const buffersLine = lines.find((l) => l.includes('Buffers: shared')) ?? '';
  const hit = Number(/shared hit=(\d+)/.exec(buffersLine)?.[1] ?? 0);
  const read = Number(/shared (?:hit=\d+ )?read=(\d+)/.exec(buffersLine)?.[1] ?? 0);
  const executionMs = Number(/Execution Time: ([\d.]+) ms/.exec(text)?.[1] ?? NaN);
  return { scans: [...new Set(scans)].join('; '), rowsRead, buffers: hit + read, executionMs, text };
}

async function tableStats(pool: Pool): Promise<string> {
  const { rows } = await pool.query<{
    relname: string;
    n_live_tup: string;
    n_dead_tup: string;
    last_analyze: Date | null;
    last_autoanalyze: Date | null;
    reltuples: number;
    relpages: number;
  }>(
    `SELECT s.relname, s.n_live_tup, s.n_dead_tup, s.last_analyze, s.last_autoanalyze, c.reltuples, c.relpages
     FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
     WHERE s.schemaname = 'actionledger' AND s.relname IN ('operations', 'outbox', 'gate_kill_switches')
     ORDER BY s.relname`,
  );
  return rows
    .map(
      (r) =>
        `${r.relname}: reltuples ${r.reltuples}, relpages ${r.relpages}, n_live_tup ${r.n_live_tup}, n_dead_tup ${r.n_dead_tup}, ` +
        `last_analyze ${r.last_analyze === null ? 'never' : 'set'}, last_autoanalyze ${r.last_autoanalyze === null ? 'never' : 'set'}`,
    )
    .join('; ');
}

export interface ScalingOptions {
  cases?: ScalingCase[];
  /** Most claims per variant and ledger. */
  maxClaims?: number;
  /** Claims stop after this long (at least 5 run), so a slow plan does not hold the run for minutes. */
  maxMsPerVariant?: number;
  log?: (line: string) => void;
}

export async function runClaimScaling(adminUrl: string, options: ScalingOptions = {}): Promise<ScalingResult> {
  const cases = options.cases ?? DEFAULT_CASES;
  const maxClaims = options.maxClaims ?? 200;
  const maxMs = options.maxMsPerVariant ?? 6_000;
  const log = options.log ?? ((line: string) => process.stdout.write(line + '\n'));
  const previous = previousClaim();
  const rows: ScalingRow[] = [];
  const notes: string[] = [];
  if (previous === null)
    notes.push(
      'The shipped claim no longer has the kill-switch test this benchmark rewrites: the previous claim was not measured.',
    );
  for (const [i, c] of cases.entries())
    await measureLedger(adminUrl, `al_bench_scaling_${i}`, c, cases[0], {
      maxClaims,
      maxMs,
      log,
      previous,
      rows,
      notes,
    });
  return { rows, notes };
}

/**
 * The base ledger (the run's first case) loaded afresh on a database of its own, for one ledger's shipped
 * claims to alternate with: fresh each time, so its rows carry no dead versions from earlier rolled-back claims
 * that the measured ledger's rows do not.
 */
async function withBaseLedger<T>(adminUrl: string, base: ScalingCase, fn: (pool: Pool) => Promise<T>): Promise<T> {
  const name = 'al_bench_scaling_base';
  const pool = createPool(await freshDatabase(adminUrl, name), {
    max: 2,
    statementTimeoutMs: 600_000,
    applicationName: 'bench-scaling-base',
  });
  try {
    await loadLedger(pool, base);
    return await fn(pool);
  } finally {
    await pool.end();
    await dropDatabase(adminUrl, name);
  }
}

/** Migrates the database and bulk-loads the ledger `c`, then analyzes as autovacuum would; the times taken. */
async function loadLedger(pool: Pool, c: ScalingCase): Promise<{ loadS: number; analyzeS: number }> {
  // Released even when the migration fails: pool.end() waits for every checked-out client.
  const client = await pool.connect();
  try {
    await migrate(client, 'actionledger', '"actionledger"');
  } finally {
    client.release();
  }
  const loadStart = performance.now();
  if (c.finished > 0) await loadOperations(pool, c.finished, 'succeeded');
  await loadOperations(pool, c.queued, 'pending');
  const loadS = (performance.now() - loadStart) / 1000;
  // What autovacuum does after a bulk load: analyze the tables that changed. Nothing else is analyzed.
  await pool.query('ANALYZE actionledger.operations');
  await pool.query('ANALYZE actionledger.outbox');
  return { loadS, analyzeS: (performance.now() - loadStart) / 1000 - loadS };
}

/** One ledger on a fresh database `name`: its claims, measured and explained; rows and notes are appended. */
async function measureLedger(
  adminUrl: string,
  name: string,
  c: ScalingCase,
  base: ScalingCase | undefined,
  o: {
    maxClaims: number;
    maxMs: number;
    log: (line: string) => void;
    previous: string | null;
    rows: ScalingRow[];
    notes: string[];
  },
): Promise<void> {
  const { maxClaims, maxMs, log, previous, rows, notes } = o;
  const url = await freshDatabase(adminUrl, name);
  const pool = createPool(url, { max: 4, statementTimeoutMs: 600_000, applicationName: 'bench-scaling' });
  try {
    const { loadS, analyzeS } = await loadLedger(pool, c);
    const measured: readonly ClaimVariant[] = c.variants ?? ALL_VARIANTS;
    notes.push(
      `${c.name}: bulk load (set-based INSERTs of 20,000 rows) ${loadS.toFixed(1)} s, ANALYZE ${analyzeS.toFixed(1)} s` +
        (measured.length < ALL_VARIANTS.length
          ? `; only the ${measured.join(', ')} claim measured on this ledger`
          : ''),
    );
    log(`  ${c.name}: loaded in ${loadS.toFixed(1)} s, analyzed in ${analyzeS.toFixed(1)} s`);
    const settings = await pool.query<{ mode: string; prepared: number }>(
      `SELECT current_setting('plan_cache_mode') AS mode, (SELECT count(*)::int FROM pg_prepared_statements) AS prepared`,
    );
    notes.push(
      `${c.name}, after load + ANALYZE: ${await tableStats(pool)}; plan_cache_mode ${settings.rows[0]?.mode}, prepared statements in the session ${settings.rows[0]?.prepared}`,
    );
    const unnamed = previous === null ? null : { text: previous, named: false };
    const variants: [ClaimVariant, ClaimStatement | null][] = [
      ['shipped', SHIPPED],
      ['previous', unnamed],
      ['previous, kill switches analyzed', unnamed],
      ['shipped, 1 kill switch, analyzed', SHIPPED],
      ['previous, 1 kill switch, analyzed', unnamed],
    ];
    for (const [variant, text] of variants) {
      if (text === null || !measured.includes(variant)) continue;
      if (variant === 'previous, kill switches analyzed') await pool.query('ANALYZE actionledger.gate_kill_switches');
      if (variant === 'shipped, 1 kill switch, analyzed') {
        // One kill switch for a tenant with no queued work: the claim still takes 32, but the statistics now
        // say the table has a row, which is what a kill switch engaged once (or left on) leaves behind.
        await pool.query(
          `INSERT INTO actionledger.gate_kill_switches (tenant_id, tool_name, engaged_by, reason) VALUES ('tenant-z', '*', 'bench', 'bench')`,
        );
        await pool.query('ANALYZE actionledger.gate_kill_switches');
      }
      const before = await explainClaim(pool, text);
      const measure = (alongside?: Pool): Promise<{ times: number[]; baseTimes: number[] }> =>
        claimTimes(pool, text, maxClaims, maxMs, alongside);
      const { times, baseTimes } =
        variant === 'shipped' && base !== undefined ? await withBaseLedger(adminUrl, base, measure) : await measure();
      const after = await explainClaim(pool, text);
      const p = percentiles(times);
      const baseP50 = baseTimes.length === 0 ? NaN : percentiles(baseTimes).p50Ms;
      rows.push({
        ledger: c,
        variant,
        claims: times.length,
        ...p,
        baseAlongsideP50Ms: baseP50,
        scans: after.scans,
        rowsRead: after.rowsRead,
        buffers: after.buffers,
        explainMs: after.executionMs,
        planStable: before.scans === after.scans,
        plan: after.text,
      });
      log(
        `  ${c.name}, ${variant}: claim p50 ${p.p50Ms.toFixed(2)} ms, p99 ${p.p99Ms.toFixed(2)} ms over ${times.length} claims` +
          (Number.isNaN(baseP50) ? '' : ` (base ledger alongside: p50 ${baseP50.toFixed(2)} ms)`) +
          `; ${after.scans}; rows read ${after.rowsRead}`,
      );
    }
    notes.push(`${c.name}, after the claims: ${await tableStats(pool)}`);
  } finally {
    await pool.end();
    await dropDatabase(adminUrl, name);
  }
}
