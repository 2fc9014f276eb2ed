/**
 * What the claim connection's planner settings buy (`npm run bench -- --only claim-plan`). The dispatcher claims
 * with a named statement on a connection of its own whose startup settings force the generic plan and rule out
 * sequential and bitmap scans, hash and merge joins, sorts and materialized scans (dispatcher/claim-session.ts).
 * This part measures that connection against the two ways the dispatcher could claim without it, all three on one
 * ledger, alternating claim by claim so that a shared machine's load falls on each:
 *   - `shipped`: the named claim on a claim connection (its settings read back, as the dispatcher checks them);
 *   - `unnamed`: the claim as text on an ordinary pool connection, planned at every call (what the dispatcher
 *     falls back to where a pooler drops the settings);
 *   - `named, ordinary session`: the named claim on an ordinary pool connection, where PostgreSQL picks between
 *     custom plans and a cached generic plan itself (`plan_cache_mode = auto`).
 * Each claim takes 32 and is rolled back, so the queue keeps its size. Three phases on the same connections:
 *   1. `200 queued, analyzed`: the statements are prepared here (a dozen claims each before measuring);
 *   2. `grown to N, not analyzed`: N - 200 more queued rows bulk-loaded, with autovacuum off on the two tables so
 *      the statistics stay those of phase 1, as they do between two autovacuum runs; cached plans are kept;
 *   3. `N, analyzed`: after `ANALYZE operations, outbox`, as autovacuum would, which replaces cached plans.
 * For each claim and phase: p50 and p99, the median over rounds of its time over the shipped claim's in the same
 * round, the shared buffers of one EXPLAIN (ANALYZE, BUFFERS) of it as sent (a named claim's cached plan through
 * EXPLAIN EXECUTE on its own session), and the plan nodes the settings rule out.
 */
import type pg from 'pg';
import { createPool, prepared, type Pool, type PoolClient } from '../db/db.js';
import { migrate } from '../db/migrate.js';
import { openClaimConnection } from '../dispatcher/claim-session.js';
import { dropDatabase } from './cells.js';
import { claimOnce, loadOperations, SHIPPED, summarizePlan, type ClaimStatement } from './claim-scaling.js';
import { freshDatabase, machine, percentiles, printTable, saveResults, type ResultEntry } from './harness.js';

const BATCH = 32;
const FIRST_QUEUE = 200;

interface Variant {
  name: string;
  statement: ClaimStatement;
  client: pg.ClientBase;
  release: () => Promise<void>;
}

interface PhaseRow {
  phase: string;
  variant: string;
  claims: number;
  p50Ms: number;
  p99Ms: number;
  ratioToShipped: number;
  buffers: number;
  ruledOut: string;
}

export interface ClaimPlanOptions {
  adminUrl: string;
  postgres: string;
  /** The queue phase 2 grows to (phase 1 holds 200). */
  grownTo: number;
  /** Rounds per phase: each round claims once with every variant, in a rotating order. */
  rounds: number;
  save: boolean;
}

/** Plan nodes the claim settings rule out, as `EXPLAIN` names them (joins, sorts, scans other than by index). */
export function ruledOutNodes(plan: string): string[] {
  const found = new Set<string>();
  for (const line of plan.split('\n')) {
    const m = /(?:->\s+|^\s*)(Seq Scan on \w+|Bitmap Heap Scan on \w+|Hash Join|Merge Join|Sort|Materialize)\b/.exec(
      line,
    );
    if (m?.[1] !== undefined) found.add(m[1]);
  }
  return [...found];
}

async function explain(v: Variant): Promise<string> {
  await v.client.query('BEGIN');
  try {
    const { rows } = v.statement.named
      ? await v.client.query<{ 'QUERY PLAN': string }>(
          // The statement this session prepared: its cached plan, generic or custom, is what EXPLAIN EXECUTE shows.
          `EXPLAIN (ANALYZE, BUFFERS) EXECUTE ${prepared(v.statement.text).name}(${BATCH}, 'bench-worker')`,
        )
      : await v.client.query<{ 'QUERY PLAN': string }>(`EXPLAIN (ANALYZE, BUFFERS) ${v.statement.text}`, [
          BATCH,
          'bench-worker',
        ]);
    return rows.map((r) => r['QUERY PLAN']).join('\n');
  } finally {
    await v.client.query('ROLLBACK');
  }
}

async function measurePhase(phase: string, variants: Variant[], rounds: number): Promise<PhaseRow[]> {
  const times = new Map<string, number[]>(variants.map((v) => [v.name, []]));
  const ratios = new Map<string, number[]>(variants.map((v) => [v.name, []]));
  // Unmeasured: the first claims after a load pay for cold pages, on whichever variant goes first.
  for (let i = 0; i < 3; i++) for (const v of variants) await claimOnce(v.client, v.statement);
  for (let r = 0; r < rounds; r++) {
    const round = new Map<string, number>();
    for (let k = 0; k < variants.length; k++) {
      const v = variants[(r + k) % variants.length] as Variant;
      round.set(v.name, await claimOnce(v.client, v.statement));
    }
    const shipped = round.get('shipped') ?? NaN;
    for (const [name, ms] of round) {
      times.get(name)?.push(ms);
      ratios.get(name)?.push(ms / shipped);
    }
  }
  const rows: PhaseRow[] = [];
  for (const v of variants) {
    const plan = await explain(v);
    const { p50Ms, p99Ms } = percentiles(times.get(v.name) ?? []);
    rows.push({
      phase,
      variant: v.name,
      claims: rounds,
      p50Ms,
      p99Ms,
      ratioToShipped: percentiles(ratios.get(v.name) ?? []).p50Ms,
      buffers: summarizePlan(plan).buffers,
      ruledOut: ruledOutNodes(plan).join(', ') || 'none',
    });
  }
  return rows;
}

async function openVariants(pool: Pool): Promise<Variant[]> {
  const variants: Variant[] = [];
  try {
    const { client, pinned } = await openClaimConnection(pool);
    variants.push({ name: 'shipped', statement: SHIPPED, client, release: () => client.end() });
    if (!pinned) throw new Error('the claim connection did not get its planner settings on this server');
    const plainText: PoolClient = await pool.connect();
    variants.push({
      name: 'unnamed',
      statement: { text: SHIPPED.text, named: false },
      client: plainText,
      release: () => Promise.resolve(plainText.release()),
    });
    const plainNamed: PoolClient = await pool.connect();
    const { rows } = await plainNamed.query<{ mode: string }>(`SELECT current_setting('plan_cache_mode') AS mode`);
    if (rows[0]?.mode !== 'auto') throw new Error(`an ordinary session here has plan_cache_mode ${rows[0]?.mode}`);
    variants.push({
      name: 'named, ordinary session',
      statement: SHIPPED,
      client: plainNamed,
      release: () => Promise.resolve(plainNamed.release()),
    });
    return variants;
  } catch (err) {
    for (const v of variants) await v.release();
    throw err;
  }
}

export async function runClaimPlanBench(o: ClaimPlanOptions): Promise<PhaseRow[]> {
  const dbName = 'actionledger_bench_claim_plan';
  const url = await freshDatabase(o.adminUrl, dbName);
  const pool = createPool(url, { max: 4, statementTimeoutMs: 600_000, applicationName: 'bench-claim-plan' });
  const rows: PhaseRow[] = [];
  try {
    const client = await pool.connect();
    try {
      await migrate(client, 'actionledger', '"actionledger"');
    } finally {
      client.release();
    }
    await pool.query(`ALTER TABLE actionledger.operations SET (autovacuum_enabled = off)`);
    await pool.query(`ALTER TABLE actionledger.outbox SET (autovacuum_enabled = off)`);
    await loadOperations(pool, FIRST_QUEUE, 'pending');
    await pool.query('ANALYZE actionledger.operations, actionledger.outbox');
    const variants = await openVariants(pool);
    try {
      // Prepared at the first queue: a dozen claims each, past the five custom plans `auto` tries first.
      for (let i = 0; i < 12; i++) for (const v of variants) await claimOnce(v.client, v.statement);
      rows.push(...(await measurePhase(`${FIRST_QUEUE} queued, analyzed`, variants, o.rounds)));
      await loadOperations(pool, o.grownTo - FIRST_QUEUE, 'pending');
      const grown = o.grownTo.toLocaleString('en-US');
      rows.push(...(await measurePhase(`grown to ${grown}, not analyzed`, variants, o.rounds)));
      await pool.query('ANALYZE actionledger.operations, actionledger.outbox');
      rows.push(...(await measurePhase(`${grown}, analyzed`, variants, o.rounds)));
    } finally {
      for (const v of variants) await v.release();
    }
  } finally {
    await pool.end();
    await dropDatabase(o.adminUrl, dbName);
  }
  process.stdout.write(
    `\nThe claim connection's planner settings: one ledger, three ways of sending the claim of ${BATCH} (rolled back), ` +
      `alternating claim by claim; autovacuum off on operations and outbox, ANALYZE run by the bench (${machine()}, ` +
      `PostgreSQL ${o.postgres}):\n`,
  );
  printTable(
    ['ledger', 'claim', 'claims', 'p50 ms', 'p99 ms', 'p50 / shipped', 'shared buffers', 'nodes the settings rule out'],
    rows.map((r) => [
      r.phase,
      r.variant,
      String(r.claims),
      r.p50Ms,
      r.p99Ms,
      r.ratioToShipped,
      String(r.buffers),
      r.ruledOut,
    ]),
  );
  if (o.save) {
    const entries: ResultEntry[] = rows.map((r) => ({
      name: `claim_32 ${r.variant}, ${r.phase}`,
      concurrency: 1,
      ops_per_s: 1000 / r.p50Ms,
      p50_ms: r.p50Ms,
      p99_ms: r.p99Ms,
      ratio_to_shipped_p50: r.ratioToShipped,
      shared_buffers: r.buffers,
      plan_nodes_ruled_out: r.ruledOut,
    }));
    saveResults('claim_plan', entries, { machine: machine(), postgres: o.postgres });
  }
  return rows;
}
