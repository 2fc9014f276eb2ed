/**
 * `npm run bench`: the one benchmark entry point. Its parts, chosen with `--only a,b` (default
 * `table,scaling,backlog`, the whole of bench/results.md's last run):
 *   - table: the throughput and latency table below,
 *   - scaling: the claim's cost as the queue grows (bench/claim-scaling.ts),
 *   - backlog: backlogs drained by one dispatcher (bench/backlog.ts),
 *   - reserve: reservations at 1, 4 and 16 clients against plain INSERTs (bench/reserve.ts),
 *   - dispatch: end to end with CPU per operation, connections in use and the row lock's SQL model
 *     (bench/dispatch.ts),
 *   - http: reservations and gate calls over the HTTP API against the library's (bench/http.ts),
 *   - fleet: a backlog drained by 1, 2 and 4 dispatcher workers against one PostgreSQL, started by
 *     `actionledger start --workers N` and as N `actionledger dispatcher` processes (bench/fleet.ts),
 *   - transport: the floor cell beside the transport cell (the same two requests through a bare undici Agent
 *     and `JSON.parse`, bench/transport.ts) at each level, alone (the table part runs both too),
 *   - isolation: a healthy provider's latency alone and beside a hanging one, one dispatcher (bench/isolation.ts),
 *   - rss: one `actionledger dispatcher` process's resident set idle and with 32 in flight (bench/rss.ts),
 *   - tracing: OpenTelemetry off and on, alternating cells of one workload, and the off hooks' own cost
 *     (bench/tracing.ts),
 *   - statements: the top statements by execution time, per operation, of one end-to-end run and one library
 *     gate-call run at N = 8 (`--levels` picks another), from pg_stat_statements preloaded in the embedded
 *     cluster (skipped, saying so, on a DATABASE_URL server that does not preload it; bench/statements.ts),
 *   - claim-plan: the claim connection's planner settings against an unnamed claim and a named claim on an
 *     ordinary session, over a queue analyzed at 200, grown without ANALYZE, then analyzed (bench/claim-plan.ts).
 *   - bookkeeping: end to end's PostgreSQL CPU per operation as shipped, without its foreign-key checks, and
 *     without its bookkeeping rows (history, claim listing), beside the peer in each round (bench/bookkeeping.ts).
 * The table part, the dispatch part and the http part's library cells also print "PostgreSQL work per
 * operation": PostgreSQL CPU, WAL bytes, heap rows written per table, derived index entries and the HOT share of
 * each cell's measured run (bench/pg-work.ts; docs/scaling.md sizes a server from them).
 * Each part runs on one PostgreSQL server (DATABASE_URL, or a fresh embedded cluster).
 *
 * At N = 1, 8 and 32 (closed loops: N callers, each starting its next operation when the previous one is
 * acknowledged), each round measuring, one after the other on fresh databases (bench/cells.ts):
 *   - the server's single-row INSERT commit rate (the commit ceiling),
 *   - the SQL-only 3-commit outbox lifecycle (insert ledger+outbox, claim with SKIP LOCKED, mark succeeded):
 *     the ceiling for a lifecycle,
 *   - pg-boss 10: `send` rate, no-op processing of those same jobs by one worker fetching N per batch, and
 *     send-to-complete with N jobs in flight (woken in-process),
 *   - actionledger: `reserve` rate, and reservation to `succeeded` through a real Dispatcher (fresh mTLS
 *     authorization, provider call over mTLS; bench/dispatch-env.ts) with N operations in flight: its rate,
 *     its latency (reservation commit acknowledged -> outcome commit acknowledged) and the latency to the claim.
 *   - the peer one would build instead: pg-boss send-to-complete whose handler makes the dispatcher's two
 *     mutual-TLS calls with its client code, N jobs in flight (woken in-process),
 *   - the floor: reserve, then the dispatcher's two mutual-TLS calls with its own client code and nothing else;
 *     the floor with the least dispatch writes (a claim row committed before the calls, its outcome after), one
 *     row a statement and batched; and the transport: the floor with a bare undici Agent and `JSON.parse`
 *     (bench/transport.ts).
 * After each round, an open loop at half that round's best end-to-end rate (Poisson arrivals through a real
 * Dispatcher): reservation commit acknowledged -> provider request sent, p50 and p99 (bench/half-peak.ts); then
 * the peer in the same open loop, at that rate and at half its own best rate of the round.
 * Rounds interleave the levels and the systems; the table shows medians over rounds, and ratios are medians of
 * per-round ratios. The machine is shared: a round during which other processes used 0.3 cores or more
 * (bench/cpu.ts) is run again, at most `--rounds` extra times per level, and the load that remained is reported. Then the claim's cost as the queue grows from 1,000 to 1,000,000 operations (only the shipped
 * claim at 1,000,000), and beside 100,000 finished ones, with EXPLAIN (ANALYZE, BUFFERS) (bench/claim-scaling.ts).
 *
 * A run of all of table, scaling and backlog writes `runs.bench` in bench/results.json (other runs kept) and
 * its tables and query plans into bench/results.md, between the last-run markers ({@link writeLastRun}; the
 * history after them is kept). A run of only some of them writes nothing: the tables come from one run. The
 * reserve, dispatch, http and statements parts replace `runs.reserve`, `runs.dispatch`, `runs.http` and
 * `runs.statements` in bench/results.json. BENCH_RESULTS names another file to write instead (a trial run).
 *
 * Options: --only PARTS, --quick (smoke run: 1 round, short cells, queues up to 10,000; writes nothing unless
 * --save), --rounds R (default 3), --levels 1,8,32, --seconds S (throughput cells, default 2; reserve cells,
 * default 4), --save; for the dispatch part --ops N (default 600), --min-seconds S (default 0), --cap-seconds S
 * (default 6). BENCH_QUIET_MAX_SECONDS (default 15): the longest wait, before each round, for other processes to
 * go quiet.
 */
import { cpus, totalmem } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import pg from 'pg';
import {
  actionledgerCell,
  floorCell,
  cellContext,
  common,
  gitHead,
  insertReserveCell,
  list,
  median,
  medianOf,
  pgBossCell,
  pgBossEnqueueDrainCell,
  pgBossMtlsCell,
  round2,
  sqlCell,
  type AlResult,
  type BossMtlsResult,
  type BossResult,
  type CellLimits,
  type InsertReserveResult,
  type LeastResult,
  type Run,
  type SqlResult,
} from './cells.js';
import { backlogCell, type BacklogRow } from './backlog.js';
import { DEFAULT_CASES, runClaimScaling, scalingReport, type ScalingRow } from './claim-scaling.js';
import { findPostmaster, waitForQuiet } from './cpu.js';
import { createBenchPki } from './dispatch-env.js';
import {
  halfPeakCell,
  peerOpenLoopCell,
  type AuthorizationWatch,
  type HalfPeakResult,
  type PeerOpenLoopResult,
} from './half-peak.js';
import { runDispatchBench } from './dispatch.js';
import { runReserveBench } from './reserve.js';
import { runHttpBench } from './http.js';
import { runFleetBench } from './fleet.js';
import { runIsolationBench } from './isolation.js';
import { runRssBench } from './rss.js';
import { runStatementsBench } from './statements.js';
import { runTracingBench } from './tracing.js';
import { runClaimPlanBench } from './claim-plan.js';
import { runBookkeepingBench } from './bookkeeping.js';
import { medianWork, tableLine, workJson, workRow, WORK_HEADER, type PgWork } from './pg-work.js';
import { transportCell, type TransportResult } from './transport.js';
import {
  machine,
  openBenchDatabase,
  stopOnSignal,
  printTable,
  saveResults,
  writeLastRun,
  type ResultEntry,
  type ResultValue,
} from './harness.js';

const { values: flags } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    save: { type: 'boolean', default: false },
    only: { type: 'string' },
    rounds: { type: 'string' },
    levels: { type: 'string' },
    seconds: { type: 'string' },
    ops: { type: 'string' },
    'min-seconds': { type: 'string' },
    'cap-seconds': { type: 'string' },
  },
});
const PARTS = [
  'table',
  'scaling',
  'backlog',
  'reserve',
  'dispatch',
  'http',
  'fleet',
  'transport',
  'isolation',
  'rss',
  'statements',
  'tracing',
  'claim-plan',
  'bookkeeping',
] as const;
/** The parts whose tables make up bench/results.md's last run. */
const MAIN_PARTS = ['table', 'scaling', 'backlog'] as const;
const ONLY = new Set((flags.only ?? MAIN_PARTS.join(',')).split(',').map((p) => p.trim()));
for (const part of ONLY)
  if (!(PARTS as readonly string[]).includes(part)) {
    process.stderr.write(`bench: unknown part ${JSON.stringify(part)}; the parts are ${PARTS.join(', ')}\n`);
    process.exit(2);
  }
const QUICK = flags.quick === true;
const SAVE = !QUICK || flags.save === true;
/** Whether this run writes bench/results.md and runs.bench: every main part ran, and not a smoke run. */
const SAVE_MAIN = SAVE && MAIN_PARTS.every((p) => ONLY.has(p));
const ROUNDS = Number(flags.rounds ?? (QUICK ? 1 : 3));
const LEVELS = (flags.levels ?? '1,8,32').split(',').map(Number);
const THROUGHPUT_MS = Number(flags.seconds ?? (QUICK ? 0.5 : 2)) * 1000;
/** INSERT, reserve, pg-boss send: time-based cells. */
const THROUGHPUT: CellLimits = { ops: 0, minMs: THROUGHPUT_MS, capMs: THROUGHPUT_MS };
/** Lifecycles (SQL, pg-boss in flight, actionledger end to end): at least 600 operations and 2 s, none started after 6 s. */
const LIFECYCLE: CellLimits = QUICK ? { ops: 50, minMs: 0, capMs: 1000 } : { ops: 600, minMs: 2000, capMs: 6000 };
/** Backlogs the dispatcher drains (bench/backlog.ts), with this many operations in flight. */
const BACKLOGS = QUICK ? [200, 1_000] : [1_000, 10_000, 100_000];
const BACKLOG_CONCURRENCY = 32;
const SCALING_CASES = QUICK
  ? [
      { name: 'queued 1,000', queued: 1_000, finished: 0 },
      { name: 'queued 10,000', queued: 10_000, finished: 0 },
      { name: 'queued 1,000 + finished 10,000', queued: 1_000, finished: 10_000 },
    ]
  : DEFAULT_CASES;
/** The open-loop cell at half the end-to-end peak: how long arrivals last. */
const HALF_PEAK_SECONDS = QUICK ? 1.5 : 5;
const QUIET_MAX_MS = Number(process.env.BENCH_QUIET_MAX_SECONDS ?? (QUICK ? 2 : 15)) * 1000;
const NOISY_CORES = 0.3;

interface Round {
  insert: Run;
  reserve: InsertReserveResult['reserve'];
  sql: SqlResult;
  bossSend: BossResult;
  bossDrain: BossResult;
  bossLive: BossResult;
  /** pg-boss whose handler makes the dispatcher's two mutual-TLS calls. */
  bossMtls: BossMtlsResult;
  al: AlResult;
  floor: LeastResult;
  /**
   * The floor with the two least dispatch writes (a claim row committed before the calls, its outcome after),
   * one statement per operation and one per batch.
   */
  least: LeastResult;
  leastBatched: LeastResult;
  transport: TransportResult;
  /** Most cores other processes used during any cell of the round. */
  otherCores: number;
}

const log = (line: string): void => void process.stdout.write(line + '\n');

/** What the "PostgreSQL work per operation" table shows (docs/scaling.md sizes a server from it). */
const WORK_NOTE =
  "PostgreSQL work per operation (each cell's measured run on its own database, warm-up and setup excluded; medians over rounds; ratios: those medians against the peer's): PG CPU from procfs (bench/cpu.ts); WAL bytes, records and full-page images from `pg_stat_wal` (cluster-wide, background processes included); heap rows from `pg_stat_user_tables`; index entries derived, each new row version times its table's indexes, partial ones excluded (min) or included (max); HOT share = HOT updates / updates (bench/pg-work.ts; `pg_*` fields in bench/results.json):";

/** "authorize 3.4, evidence 3.5, ..." or, with `tail`, "authorize 3.4 / 6.7, ...". */
function stageList(all: Record<string, number>, tail?: Record<string, number>): string {
  return Object.keys(all)
    .map((k) => `${k} ${all[k]!.toFixed(1)}${tail === undefined ? '' : ` / ${(tail[k] ?? NaN).toFixed(1)}`}`)
    .join(', ');
}

/** "authorization requests p50 3.1 ms, p99 40.2 ms, up to 32 at once, 4 connections opened". */
function authorizationLine(a: AuthorizationWatch): string {
  return `authorization requests p50 ${a.p50Ms.toFixed(1)} ms, p99 ${a.p99Ms.toFixed(1)} ms, up to ${a.maxInFlight} at once, ${a.connects} connections opened`;
}

/** Median over rounds of a / b, each ratio taken within one round. */
function ratio(rounds: Round[], a: (r: Round) => number, b: (r: Round) => number): number {
  return medianOf(rounds.map((r) => a(r) / b(r)));
}

async function serverFacts(url: string): Promise<Record<string, string>> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    const out: Record<string, string> = {};
    for (const name of [
      'server_version',
      'fsync',
      'synchronous_commit',
      'full_page_writes',
      'shared_buffers',
      'wal_level',
    ]) {
      const { rows } = await c.query<Record<string, string>>(`SHOW ${name}`);
      out[name] = Object.values(rows[0] ?? {})[0] ?? '?';
    }
    return out;
  } finally {
    await c.end();
  }
}

async function main(): Promise<void> {
  if (ONLY.has('reserve')) await runReserveBench({ seconds: Number(flags.seconds ?? (QUICK ? 0.5 : 4)), save: SAVE });
  if (ONLY.has('dispatch'))
    await runDispatchBench({
      ops: Number(flags.ops ?? (QUICK ? 50 : 600)),
      minSeconds: Number(flags['min-seconds'] ?? 0),
      capSeconds: Number(flags['cap-seconds'] ?? (QUICK ? 1 : 6)),
      rounds: Number(flags.rounds ?? (QUICK ? 1 : 3)),
      levels: LEVELS,
      quietMaxSeconds: QUIET_MAX_MS / 1000,
      save: SAVE,
    });
  if (ONLY.has('http')) {
    const db = await openBenchDatabase();
    try {
      await runHttpBench({
        adminUrl: db.adminUrl,
        postgres: db.version,
        postmaster: await findPostmaster(db.adminUrl).catch(() => null),
        quietMaxSeconds: QUIET_MAX_MS / 1000,
        levels: LEVELS,
        rounds: ROUNDS,
        seconds: Number(flags.seconds ?? (QUICK ? 0.5 : 3)),
        save: SAVE,
      });
    } finally {
      await db.close();
    }
  }
  if (ONLY.has('fleet')) {
    const db = await openBenchDatabase();
    stopOnSignal(db);
    try {
      await runFleetBench({
        adminUrl: db.adminUrl,
        postgres: db.version,
        processes: [1, 2, 4],
        launchers: ['start', 'dispatcher'],
        queued: Number(flags.ops ?? (QUICK ? 400 : 6000)),
        concurrency: 16,
        rounds: Number(flags.rounds ?? (QUICK ? 1 : 3)),
        quietMaxSeconds: QUIET_MAX_MS / 1000,
        save: SAVE,
      });
    } finally {
      await db.close();
    }
  }
  if (ONLY.has('transport')) await transportPart();
  if (ONLY.has('isolation'))
    await runIsolationBench({
      levels: LEVELS,
      hanging: 8,
      limits: LIFECYCLE,
      rounds: ROUNDS,
      quietMaxSeconds: QUIET_MAX_MS / 1000,
      save: SAVE,
    });
  if (ONLY.has('tracing'))
    await runTracingBench({
      levels: flags.levels === undefined ? (QUICK ? [8] : [1, 8]) : LEVELS,
      // Enough operations for two identical cells to agree closely: the spread they show is the yardstick.
      limits: QUICK ? { ops: 400, minMs: 2000, capMs: 4000 } : { ops: 2000, minMs: 5000, capMs: 12_000 },
      rounds: ROUNDS,
      quietMaxSeconds: QUIET_MAX_MS / 1000,
      save: SAVE,
    });
  if (ONLY.has('rss'))
    await runRssBench({
      inFlight: 32,
      samples: QUICK ? 5 : 20,
      settleMs: QUICK ? 1000 : 5000,
      rounds: QUICK ? 1 : ROUNDS,
      save: SAVE,
    });
  if (ONLY.has('statements'))
    await runStatementsBench({
      n: flags.levels === undefined ? 8 : (LEVELS[0] ?? 8),
      limits: LIFECYCLE,
      gateSeconds: Number(flags.seconds ?? (QUICK ? 0.5 : 3)),
      top: 12,
      save: SAVE,
    });
  if (ONLY.has('claim-plan')) {
    const db = await openBenchDatabase();
    stopOnSignal(db);
    try {
      await runClaimPlanBench({
        adminUrl: db.adminUrl,
        postgres: db.version,
        grownTo: QUICK ? 20_000 : 200_000,
        rounds: QUICK ? 30 : 200,
        save: SAVE,
      });
    } finally {
      await db.close();
    }
  }
  if (ONLY.has('bookkeeping'))
    await runBookkeepingBench({
      levels: flags.levels === undefined ? (QUICK ? [8] : [8, 32]) : LEVELS,
      rounds: ROUNDS,
      limits: LIFECYCLE,
      quietMaxSeconds: QUIET_MAX_MS / 1000,
      save: SAVE,
    });
  if (MAIN_PARTS.some((p) => ONLY.has(p))) await mainParts();
}

/**
 * The transport part: the floor and transport cells at each level, `ROUNDS` rounds interleaved, and
 * floor / transport per round (the table part measures the same pair beside the rest).
 */
async function transportPart(): Promise<void> {
  const db = await openBenchDatabase();
  stopOnSignal(db);
  cellContext.postmaster = await findPostmaster(db.adminUrl).catch(() => null);
  const pki = await createBenchPki();
  const byLevel = new Map<number, { floor: Run; transport: TransportResult }[]>();
  log(`\nFloor and transport (${ROUNDS} round(s) at N = ${LEVELS.join(', ')}):`);
  try {
    for (let round = 1; round <= ROUNDS; round++)
      for (const n of LEVELS) {
        await waitForQuiet(cellContext.postmaster, QUIET_MAX_MS, NOISY_CORES);
        const floor = await floorCell(db.adminUrl, pki, n, LIFECYCLE);
        const transport = await transportCell(db.adminUrl, pki, n, LIFECYCLE);
        byLevel.set(n, [...(byLevel.get(n) ?? []), { floor, transport }]);
        log(
          `  round ${round} N=${n}: floor ${floor.opsPerS.toFixed(0)}/s, transport ${transport.opsPerS.toFixed(0)}/s (floor / transport ${(floor.opsPerS / transport.opsPerS).toFixed(2)})`,
        );
      }
  } finally {
    await db.close();
  }
  const rows: (string | number)[][] = [];
  const entries: ResultEntry[] = [];
  for (const n of LEVELS) {
    const rs = byLevel.get(n) ?? [];
    if (rs.length === 0) continue;
    const floor = median(rs.map((r) => r.floor));
    const transport = median(rs.map((r) => r.transport));
    const floorToTransport = medianOf(rs.map((r) => r.floor.opsPerS / r.transport.opsPerS));
    rows.push(
      [
        String(n),
        'transport: reserve + the two requests, bare undici and JSON.parse',
        transport.opsPerS,
        transport.p50Ms,
        transport.p99Ms,
        1,
      ],
      [
        String(n),
        "floor: reserve + the two requests, the dispatcher's client code",
        floor.opsPerS,
        floor.p50Ms,
        floor.p99Ms,
        floorToTransport,
      ],
    );
    entries.push(
      {
        name: 'transport_reserve_and_two_bare_requests',
        concurrency: n,
        ops_per_s: transport.opsPerS,
        p50_ms: transport.p50Ms,
        p99_ms: transport.p99Ms,
        not_succeeded: transport.notSucceeded,
        ops_per_s_rounds: list(rs.map((r) => r.transport)),
        ...common(transport),
      },
      {
        name: 'floor_reserve_and_two_mtls_calls',
        concurrency: n,
        ops_per_s: floor.opsPerS,
        p50_ms: floor.p50Ms,
        p99_ms: floor.p99Ms,
        ratio_to_transport: floorToTransport,
        ops_per_s_rounds: list(rs.map((r) => r.floor)),
        ...common(floor),
      },
    );
  }
  log('\nFloor against the bare transport (medians over rounds; ratio: median of per-round ratios; ms per operation):');
  const table = printTable(['N', 'measurement', 'ops/s', 'p50 ms', 'p99 ms', '/ transport'], rows);
  if (!SAVE) return;
  saveResults('transport', entries, {
    machine: machine(),
    postgres: db.version,
    rounds: String(ROUNDS),
    levels: LEVELS.join(','),
    lifecycle_cell: `>= ${LIFECYCLE.ops} ops and ${LIFECYCLE.minMs / 1000} s, none started after ${LIFECYCLE.capMs / 1000} s`,
    tree: gitHead(),
    tables: table,
  });
}

/** The table, scaling and backlog parts, on one database server, and bench/results.md's last run. */
async function mainParts(): Promise<void> {
  const started = Date.now();
  const db = await openBenchDatabase();
  stopOnSignal(db);
  cellContext.postmaster = await findPostmaster(db.adminUrl).catch(() => null);
  const server = await serverFacts(db.adminUrl);
  const tree = gitHead();
  const cpu = cpus()[0]?.model.trim() ?? 'unknown CPU';
  const machineLine =
    `${cpus().length} cores (${cpu}), ${Math.round(totalmem() / 2 ** 30)} GiB RAM, Node ${process.version}, ` +
    `PostgreSQL ${server.server_version} (${process.env.DATABASE_URL ? 'DATABASE_URL' : 'embedded'}), fsync ${server.fsync}, ` +
    `synchronous_commit ${server.synchronous_commit}, full_page_writes ${server.full_page_writes}, shared_buffers ${server.shared_buffers}, at ${tree}`;
  log(`# ${machineLine}`);
  log(
    `# ${QUICK ? 'QUICK smoke run; ' : ''}${ROUNDS} round(s) at N = ${LEVELS.join(', ')}; throughput cells ${THROUGHPUT_MS / 1000} s; lifecycle cells >= ${LIFECYCLE.ops} ops and ${LIFECYCLE.minMs / 1000} s, none started after ${LIFECYCLE.capMs / 1000} s`,
  );
  const pki = await createBenchPki();

  const byLevel = new Map<number, Round[]>();
  const discarded = new Map<number, number>();
  /** This round's kept end-to-end rates, by level; the open-loop cell's results, one per round. */
  const peaks: { n: number; opsPerS: number }[] = [];
  const halfPeak: HalfPeakResult[] = [];
  /**
   * The peer's kept rates in this round, by level; its open loops, one pair per round: at the rate offered to
   * actionledger, and at half its own peak.
   */
  const peerPeaks: { n: number; opsPerS: number }[] = [];
  const peerAtSame: PeerOpenLoopResult[] = [];
  const peerAtOwnHalf: PeerOpenLoopResult[] = [];
  let scaling: ScalingRow[] = [];
  const backlog: BacklogRow[] = [];
  let scalingNotes: string[] = [];
  try {
    // Rounds interleave the levels and the systems. A round during which other processes used NOISY_CORES or
    // more in any cell is run again, at most ROUNDS extra times per level; after that it is kept, and the
    // results say how loaded it was.
    for (let round = 1; ONLY.has('table') && LEVELS.some((n) => (byLevel.get(n)?.length ?? 0) < ROUNDS); round++) {
      for (const n of LEVELS) {
        if ((byLevel.get(n)?.length ?? 0) >= ROUNDS) continue;
        const quiet = await waitForQuiet(cellContext.postmaster, QUIET_MAX_MS, NOISY_CORES);
        if (quiet >= NOISY_CORES)
          log(
            `  (other processes still used ${quiet.toFixed(2)} cores after ${QUIET_MAX_MS / 1000} s; measuring anyway)`,
          );
        const { insert, reserve } = await insertReserveCell(db.adminUrl, n, THROUGHPUT);
        const sql = await sqlCell(db.adminUrl, n, 'plain', 0, LIFECYCLE);
        const { enqueue: bossSend, drain: bossDrain } = await pgBossEnqueueDrainCell(db.adminUrl, n, THROUGHPUT);
        const bossLive = await pgBossCell(db.adminUrl, n, 'notify', LIFECYCLE);
        const al = await actionledgerCell(db.adminUrl, pki, n, LIFECYCLE);
        const bossMtls = await pgBossMtlsCell(db.adminUrl, pki, n, LIFECYCLE);
        const floor = await floorCell(db.adminUrl, pki, n, LIFECYCLE);
        const least = await floorCell(db.adminUrl, pki, n, LIFECYCLE, 'single');
        const leastBatched = await floorCell(db.adminUrl, pki, n, LIFECYCLE, 'batched');
        const transport = await transportCell(db.adminUrl, pki, n, LIFECYCLE);
        const cells = {
          insert,
          reserve,
          sql,
          bossSend,
          bossDrain,
          bossLive,
          bossMtls,
          al,
          floor,
          least,
          leastBatched,
          transport,
        };
        const otherCores = Math.max(
          ...Object.values(cells).map((r: Run) => (Number.isNaN(r.cpu.otherCores) ? 0 : r.cpu.otherCores)),
        );
        const keep = otherCores < NOISY_CORES || (discarded.get(n) ?? 0) >= ROUNDS;
        log(
          `  round ${round} N=${n}${keep ? '' : ' DISCARDED'}: INSERT ${insert.opsPerS.toFixed(0)}/s, SQL lifecycle ${sql.opsPerS.toFixed(0)}/s, ` +
            `pg-boss send ${bossSend.opsPerS.toFixed(0)}/s drain ${bossDrain.opsPerS.toFixed(0)}/s in flight ${bossLive.opsPerS.toFixed(0)}/s, ` +
            `AL reserve ${reserve.opsPerS.toFixed(0)}/s end to end ${al.opsPerS.toFixed(0)}/s (p50 ${al.p50Ms.toFixed(1)} ms), ` +
            `pg-boss mTLS handler ${bossMtls.opsPerS.toFixed(0)}/s (p50 ${bossMtls.p50Ms.toFixed(1)} ms), floor ${floor.opsPerS.toFixed(0)}/s, floor + least writes ${least.opsPerS.toFixed(0)}/s (batched ${leastBatched.opsPerS.toFixed(0)}/s), transport ${transport.opsPerS.toFixed(0)}/s; other processes up to ${otherCores.toFixed(2)} cores\n    ${al.check}`,
        );
        if (!keep) {
          discarded.set(n, (discarded.get(n) ?? 0) + 1);
          continue;
        }
        peaks.push({ n, opsPerS: al.opsPerS });
        peerPeaks.push({ n, opsPerS: bossMtls.opsPerS });
        byLevel.set(n, [...(byLevel.get(n) ?? []), { ...cells, otherCores }]);
      }
      // Open loop at half the round's end-to-end peak (the best level measured and kept in this round).
      const best = (xs: { n: number; opsPerS: number }[]) =>
        xs.reduce<{ n: number; opsPerS: number } | undefined>(
          (b, p) => (b === undefined || p.opsPerS > b.opsPerS ? p : b),
          undefined,
        );
      const peak = best(peaks);
      const peerPeak = best(peerPeaks);
      peaks.length = 0;
      peerPeaks.length = 0;
      if (peak !== undefined && halfPeak.length < ROUNDS) {
        await waitForQuiet(cellContext.postmaster, QUIET_MAX_MS, NOISY_CORES);
        const h = await halfPeakCell(db.adminUrl, pki, peak.n, peak.opsPerS, HALF_PEAK_SECONDS);
        halfPeak.push(h);
        log(
          `  round ${round} open loop at half the peak (${h.peakOpsPerS.toFixed(0)}/s at N=${h.concurrency}): offered ${h.offeredOpsPerS.toFixed(0)}/s, achieved ${h.achievedOpsPerS.toFixed(0)}/s, ` +
            `reserve commit -> provider request sent p50 ${h.p50Ms.toFixed(1)} ms p99 ${h.p99Ms.toFixed(1)} ms; -> outcome commit p50 ${h.outcomeP50Ms.toFixed(1)} ms p99 ${h.outcomeP99Ms.toFixed(1)} ms; ` +
            `-> claim p50 ${h.claimP50Ms.toFixed(1)} ms p99 ${h.claimP99Ms.toFixed(1)} ms (${h.tailClaimMs.toFixed(1)} ms for the sends at or past the p99)\n    ${h.check}; ${authorizationLine(h.authorization)}; ${h.dbConnectionsOpened} database connections opened by the dispatcher's pool during the arrivals\n` +
            `    after the claim, median ms (all / sends at or past the p99): ${stageList(h.stages.all, h.stages.tail)}`,
        );
        if (peerPeak !== undefined) {
          for (const [into, n, rate, what] of [
            [peerAtSame, peak.n, peak.opsPerS / 2, "actionledger's rate"],
            [peerAtOwnHalf, peerPeak.n, peerPeak.opsPerS / 2, `half its own peak (${peerPeak.opsPerS.toFixed(0)}/s)`],
          ] as const) {
            await waitForQuiet(cellContext.postmaster, QUIET_MAX_MS, NOISY_CORES);
            const p = await peerOpenLoopCell(db.adminUrl, pki, n, rate, HALF_PEAK_SECONDS);
            into.push(p);
            log(
              `  round ${round} peer open loop at ${what}, N=${n}: offered ${p.offeredOpsPerS.toFixed(0)}/s, achieved ${p.achievedOpsPerS.toFixed(0)}/s, ` +
                `send commit -> provider request sent p50 ${p.p50Ms.toFixed(1)} ms p99 ${p.p99Ms.toFixed(1)} ms; -> complete p50 ${p.outcomeP50Ms.toFixed(1)} ms p99 ${p.outcomeP99Ms.toFixed(1)} ms\n    ${p.check}; ${authorizationLine(p.authorization)}`,
            );
          }
        }
      }
    }
    if (ONLY.has('scaling')) {
      log(`\nClaim scaling (${SCALING_CASES.map((c) => c.name).join('; ')}):`);
      const result = await runClaimScaling(db.adminUrl, {
        cases: SCALING_CASES,
        maxClaims: QUICK ? 20 : 200,
        maxMsPerVariant: QUICK ? 1000 : 6000,
        log: (line) => log(line),
      });
      scaling = result.rows;
      scalingNotes = result.notes;
    }
    if (ONLY.has('backlog')) {
      log(`\nBacklog drains (${BACKLOGS.join(', ')} queued; one dispatcher, concurrency ${BACKLOG_CONCURRENCY}):`);
      for (const queued of BACKLOGS) {
        await waitForQuiet(cellContext.postmaster, QUIET_MAX_MS, NOISY_CORES);
        const b = await backlogCell(db.adminUrl, pki, queued, BACKLOG_CONCURRENCY, 8, QUICK ? 500 : 3000);
        backlog.push(b);
        log(
          `  ${queued} queued: drained at ${b.drainOpsPerS.toFixed(0)}/s in ${b.drainSeconds.toFixed(1)} s (${b.states}); then reserve ${b.reserve.opsPerS.toFixed(0)}/s`,
        );
      }
    }
  } finally {
    await db.close();
  }

  // ------------------------------------------------------------------------------------------------------
  // Tables

  const entries: ResultEntry[] = [];
  const rows: (string | number)[][] = [];
  const loads: string[] = [];
  const budgets: string[] = [];
  /** PostgreSQL's work per operation: a row per system and level, and each system's heap rows by table. */
  const workRows: (string | number)[][] = [];
  const workTables: string[] = [];
  const dash = NaN;
  for (const n of LEVELS) {
    const rs = byLevel.get(n) ?? [];
    if (rs.length === 0) continue;
    const m = <T extends object>(f: (r: Round) => T): T => median(rs.map(f));
    const insert = m((r) => r.insert);
    const reserve = m((r) => r.reserve);
    const sql = m((r) => r.sql);
    const bossSend = m((r) => r.bossSend);
    const bossDrain = m((r) => r.bossDrain);
    const bossLive = m((r) => r.bossLive);
    const bossMtls = m((r) => r.bossMtls);
    const al = m((r) => r.al);
    const floor = m((r) => r.floor);
    const least = m((r) => r.least);
    const leastBatched = m((r) => r.leastBatched);
    const transport = m((r) => r.transport);
    const other = medianOf(rs.map((r) => r.otherCores));
    loads.push(
      `N = ${n}: ${rs.map((r) => r.otherCores.toFixed(2)).join(' / ')} cores (${discarded.get(n) ?? 0} round(s) discarded)`,
    );
    const sqlToInsert = ratio(
      rs,
      (r) => r.sql.opsPerS,
      (r) => r.insert.opsPerS,
    );
    const sendToInsert = ratio(
      rs,
      (r) => r.bossSend.opsPerS,
      (r) => r.insert.opsPerS,
    );
    const liveToSql = ratio(
      rs,
      (r) => r.bossLive.opsPerS,
      (r) => r.sql.opsPerS,
    );
    const reserveToInsert = ratio(
      rs,
      (r) => r.reserve.opsPerS,
      (r) => r.insert.opsPerS,
    );
    const reserveToSend = ratio(
      rs,
      (r) => r.reserve.opsPerS,
      (r) => r.bossSend.opsPerS,
    );
    const alToSql = ratio(
      rs,
      (r) => r.al.opsPerS,
      (r) => r.sql.opsPerS,
    );
    const alToLive = ratio(
      rs,
      (r) => r.al.opsPerS,
      (r) => r.bossLive.opsPerS,
    );
    const alToDrain = ratio(
      rs,
      (r) => r.al.opsPerS,
      (r) => r.bossDrain.opsPerS,
    );
    const alToBossMtls = ratio(
      rs,
      (r) => r.al.opsPerS,
      (r) => r.bossMtls.opsPerS,
    );
    const bossMtlsToSql = ratio(
      rs,
      (r) => r.bossMtls.opsPerS,
      (r) => r.sql.opsPerS,
    );
    const bossMtlsToLive = ratio(
      rs,
      (r) => r.bossMtls.opsPerS,
      (r) => r.bossLive.opsPerS,
    );
    const floorToSql = ratio(
      rs,
      (r) => r.floor.opsPerS,
      (r) => r.sql.opsPerS,
    );
    const alToFloor = ratio(
      rs,
      (r) => r.al.opsPerS,
      (r) => r.floor.opsPerS,
    );
    // The peer against the same floor: what a queue with none of the guarantees keeps of it on this machine.
    const bossMtlsToFloor = ratio(
      rs,
      (r) => r.bossMtls.opsPerS,
      (r) => r.floor.opsPerS,
    );
    // The least any at-most-once dispatcher writes (a claim before the calls, an outcome after), on the floor:
    // one row per statement, batched, and in each round the better of the two (the bound).
    const bestLeast = (r: Round): number => Math.max(r.least.opsPerS, r.leastBatched.opsPerS);
    const leastToFloor = ratio(
      rs,
      (r) => r.least.opsPerS,
      (r) => r.floor.opsPerS,
    );
    const leastBatchedToFloor = ratio(
      rs,
      (r) => r.leastBatched.opsPerS,
      (r) => r.floor.opsPerS,
    );
    const bestLeastToFloor = ratio(rs, bestLeast, (r) => r.floor.opsPerS);
    const alToBestLeast = ratio(rs, (r) => r.al.opsPerS, bestLeast);
    const bossMtlsToBestLeast = ratio(rs, (r) => r.bossMtls.opsPerS, bestLeast);
    const floorToTransport = ratio(
      rs,
      (r) => r.floor.opsPerS,
      (r) => r.transport.opsPerS,
    );
    // CPU per operation of the whole work (this process's threads, the sandbox servers' included, and
    // PostgreSQL), medians over rounds; and the cores end to end would need at the peer's rate.
    const cpuOf = (f: (r: Round) => Run): { node: number; pg: number; all: number } => {
      const per = (cores: (r: Run) => number): number => medianOf(rs.map((r) => (cores(f(r)) * 1000) / f(r).opsPerS));
      return {
        node: per((r) => r.cpu.nodeCores),
        pg: per((r) => r.cpu.postgresCores),
        all: per((r) => r.cpu.nodeCores + r.cpu.postgresCores),
      };
    };
    const cpuAl = cpuOf((r) => r.al);
    const cpuPeer = cpuOf((r) => r.bossMtls);
    const cpuFloor = cpuOf((r) => r.floor);
    const coresAtPeerRate = medianOf(
      rs.map((r) => ((r.al.cpu.nodeCores + r.al.cpu.postgresCores) / r.al.opsPerS) * r.bossMtls.opsPerS),
    );
    const usedByPeer = medianOf(rs.map((r) => r.bossMtls.cpu.nodeCores + r.bossMtls.cpu.postgresCores));
    const ms = (c: { node: number; pg: number; all: number }): string =>
      `${c.all.toFixed(2)} (${c.node.toFixed(2)} + ${c.pg.toFixed(2)})`;
    budgets.push(
      `N = ${n}: end to end ${ms(cpuAl)}, the peer ${ms(cpuPeer)}, the floor ${ms(cpuFloor)}; end to end at the peer's rate would take ${coresAtPeerRate.toFixed(2)} cores, the peer took ${usedByPeer.toFixed(2)}`,
    );
    // What PostgreSQL did per operation (bench/pg-work.ts): its CPU and what it wrote, medians over rounds,
    // ratios of those medians to the peer's.
    const works = (f: (r: Round) => { pgWork: PgWork }): PgWork => medianWork(rs.map((r) => f(r).pgWork));
    const workAl = works((r) => r.al);
    const workPeer = works((r) => r.bossMtls);
    const workFloor = works((r) => r.floor);
    const workReserve = works((r) => r.reserve);
    const pgCpuReserve = medianOf(rs.map((r) => (r.reserve.cpu.postgresCores * 1000) / r.reserve.opsPerS));
    const peerWork = { pgCpuMs: cpuPeer.pg, work: workPeer };
    for (const [system, pgCpuMs, w] of [
      ['actionledger end to end', cpuAl.pg, workAl],
      ['peer: pg-boss, handler makes the two mTLS calls', cpuPeer.pg, workPeer],
      ['floor: reserve + the two mTLS calls', cpuFloor.pg, workFloor],
      ['actionledger reserve', pgCpuReserve, workReserve],
    ] as const) {
      workRows.push(workRow(n, system, pgCpuMs, w, peerWork));
      workTables.push(`N = ${n}, ${system}: ${tableLine(w)}`);
    }
    const N = String(n);
    rows.push(
      [N, 'INSERT one row, commit', insert.opsPerS, insert.p50Ms, insert.p99Ms, 1, dash, dash],
      [N, 'SQL outbox lifecycle, 3 commits (ceiling)', sql.opsPerS, sql.p50Ms, sql.p99Ms, sqlToInsert, 1, dash],
      [N, 'pg-boss send', bossSend.opsPerS, bossSend.p50Ms, bossSend.p99Ms, sendToInsert, dash, 1],
      [N, `pg-boss no-op processing of those jobs (batch ${n})`, bossDrain.opsPerS, dash, dash, dash, dash, dash],
      [
        N,
        'pg-boss send -> completed, N in flight',
        bossLive.opsPerS,
        bossLive.p50Ms,
        bossLive.p99Ms,
        dash,
        liveToSql,
        1,
      ],
      [N, 'actionledger reserve', reserve.opsPerS, reserve.p50Ms, reserve.p99Ms, reserveToInsert, dash, reserveToSend],
      [
        N,
        'actionledger reserve -> succeeded (mTLS), N in flight',
        al.opsPerS,
        al.p50Ms,
        al.p99Ms,
        dash,
        alToSql,
        alToLive,
      ],
      [N, 'actionledger reserve commit -> claimed', dash, al.wakeP50Ms, al.wakeP99Ms, dash, dash, dash],
      [
        N,
        `pg-boss send -> completed, handler makes the two mTLS calls, N in flight (end to end / this ${alToBossMtls.toFixed(2)}; this / floor ${bossMtlsToFloor.toFixed(2)})`,
        bossMtls.opsPerS,
        bossMtls.p50Ms,
        bossMtls.p99Ms,
        dash,
        bossMtlsToSql,
        bossMtlsToLive,
      ],
      [
        N,
        `floor: reserve + the two mTLS calls, no dispatch bookkeeping (end to end / floor ${alToFloor.toFixed(2)})`,
        floor.opsPerS,
        floor.p50Ms,
        floor.p99Ms,
        dash,
        floorToSql,
        dash,
      ],
      [
        N,
        `floor + the least dispatch writes: a claim row committed before the calls, its outcome after, one row a statement (this / floor ${leastToFloor.toFixed(2)})`,
        least.opsPerS,
        least.p50Ms,
        least.p99Ms,
        dash,
        dash,
        dash,
      ],
      [
        N,
        `the same, batched (this / floor ${leastBatchedToFloor.toFixed(2)}; the better of the two / floor ${bestLeastToFloor.toFixed(2)}; end to end / the better ${alToBestLeast.toFixed(2)}; peer / the better ${bossMtlsToBestLeast.toFixed(2)})`,
        leastBatched.opsPerS,
        leastBatched.p50Ms,
        leastBatched.p99Ms,
        dash,
        dash,
        dash,
      ],
      [
        N,
        `transport: reserve + the same two requests, bare undici and JSON.parse (floor / transport ${floorToTransport.toFixed(2)})`,
        transport.opsPerS,
        transport.p50Ms,
        transport.p99Ms,
        dash,
        dash,
        dash,
      ],
    );
    const rounds = (f: (r: Round) => Run): string => list(rs.map(f));
    const e = (name: string, r: Run, extra: Record<string, ResultValue>): ResultEntry => ({
      name,
      concurrency: n,
      ops_per_s: r.opsPerS,
      p50_ms: Number.isFinite(r.p50Ms) ? r.p50Ms : null,
      p99_ms: Number.isFinite(r.p99Ms) ? r.p99Ms : null,
      ...extra,
      ...common(r),
    });
    entries.push(
      e('plain_insert_commit', insert, { ops_per_s_rounds: rounds((r) => r.insert) }),
      e('sql_lifecycle_3_commits', sql, { ratio_to_insert: sqlToInsert, ops_per_s_rounds: rounds((r) => r.sql) }),
      e('pgboss_send', bossSend, { ratio_to_insert: sendToInsert, ops_per_s_rounds: rounds((r) => r.bossSend) }),
      e('pgboss_noop_drain', bossDrain, {
        batch_size: n,
        jobs: bossDrain.ops,
        ops_per_s_rounds: rounds((r) => r.bossDrain),
      }),
      e('pgboss_send_to_completed', bossLive, {
        ratio_to_sql_lifecycle: liveToSql,
        ops_per_s_rounds: rounds((r) => r.bossLive),
      }),
      e('actionledger_reserve', reserve, {
        ratio_to_insert: reserveToInsert,
        ratio_to_pgboss: reserveToSend,
        ratio_to_pgboss_send: reserveToSend,
        ops_per_s_rounds: rounds((r) => r.reserve),
        postgres_cpu_ms_per_op: round2(pgCpuReserve),
        ...workJson(workReserve),
      }),
      e('actionledger_end_to_end', al, {
        ratio_to_sql_lifecycle: alToSql,
        ratio_to_pgboss: alToLive,
        ratio_to_pgboss_send_to_completed: alToLive,
        ratio_to_pgboss_noop_drain: alToDrain,
        commit_to_claim_p50_ms: al.wakeP50Ms,
        commit_to_claim_p99_ms: al.wakeP99Ms,
        provider_call_p50_ms: al.providerP50Ms,
        row_lock_held_p50_ms: al.lockHeldP50Ms,
        dispatcher_statements_per_op: al.statementsPerOp,
        not_succeeded: al.notSucceeded,
        ratio_to_floor: alToFloor,
        ratio_to_floor_with_least_dispatch_writes: alToBestLeast,
        ratio_to_pgboss_mtls_handler: alToBossMtls,
        cpu_ms_per_op: round2(cpuAl.all),
        node_cpu_ms_per_op: round2(cpuAl.node),
        postgres_cpu_ms_per_op: round2(cpuAl.pg),
        cpu_cores_at_pgboss_mtls_handler_rate: round2(coresAtPeerRate),
        ...workJson(workAl),
        pg_wal_bytes_ratio_to_pgboss_mtls_handler: round2(workAl.walBytes / workPeer.walBytes),
        pg_rows_written_ratio_to_pgboss_mtls_handler: round2(workAl.rowsWritten / workPeer.rowsWritten),
        postgres_cpu_ratio_to_pgboss_mtls_handler: round2(cpuAl.pg / cpuPeer.pg),
        ops_per_s_rounds: rounds((r) => r.al),
        other_processes_cpu_cores_max_median: round2(other),
        rounds_discarded_for_other_load: discarded.get(n) ?? 0,
        check: al.check,
      }),
      e('pgboss_mtls_handler_send_to_completed', bossMtls, {
        ratio_to_sql_lifecycle: bossMtlsToSql,
        ratio_to_pgboss_send_to_completed: bossMtlsToLive,
        ratio_to_floor: bossMtlsToFloor,
        ratio_to_floor_with_least_dispatch_writes: bossMtlsToBestLeast,
        not_succeeded: bossMtls.notSucceeded,
        cpu_ms_per_op: round2(cpuPeer.all),
        node_cpu_ms_per_op: round2(cpuPeer.node),
        postgres_cpu_ms_per_op: round2(cpuPeer.pg),
        ...workJson(workPeer),
        ops_per_s_rounds: rounds((r) => r.bossMtls),
        check: bossMtls.check,
      }),
      e('floor_reserve_and_two_mtls_calls', floor, {
        ratio_to_sql_lifecycle: floorToSql,
        ratio_to_transport: floorToTransport,
        cpu_ms_per_op: round2(cpuFloor.all),
        node_cpu_ms_per_op: round2(cpuFloor.node),
        postgres_cpu_ms_per_op: round2(cpuFloor.pg),
        ...workJson(workFloor),
        ops_per_s_rounds: rounds((r) => r.floor),
      }),
      e('floor_with_least_dispatch_writes', least, {
        ratio_to_floor: leastToFloor,
        better_of_single_and_batched_ratio_to_floor: bestLeastToFloor,
        not_succeeded: least.notSucceeded,
        ops_per_s_rounds: rounds((r) => r.least),
        check: least.check,
      }),
      e('floor_with_least_dispatch_writes_batched', leastBatched, {
        ratio_to_floor: leastBatchedToFloor,
        better_of_single_and_batched_ratio_to_floor: bestLeastToFloor,
        not_succeeded: leastBatched.notSucceeded,
        ops_per_s_rounds: rounds((r) => r.leastBatched),
        check: leastBatched.check,
      }),
      e('transport_reserve_and_two_bare_requests', transport, {
        not_succeeded: transport.notSucceeded,
        ops_per_s_rounds: rounds((r) => r.transport),
      }),
    );
  }
  let t1 = '';
  if (rows.length > 0) {
    log(
      '\nThroughput and latency (medians over rounds; ratios are medians of per-round ratios; latency per operation, ms):',
    );
    t1 = printTable(
      ['N', 'measurement', 'ops/s', 'p50 ms', 'p99 ms', '/ INSERT', '/ SQL lifecycle', '/ pg-boss'],
      rows,
    );
    log(`Other processes, most cores in any cell of each kept round: ${loads.join('; ')}`);
  }
  let tWork = '';
  if (workRows.length > 0) {
    log(`\n${WORK_NOTE}`);
    tWork = printTable(WORK_HEADER, workRows);
    log(`Heap rows per operation, by table:\n${workTables.map((l) => `- ${l}`).join('\n')}`);
  }
  let tHalf = '';
  let halfWhere = '';
  if (halfPeak.length > 0) {
    const h = median(halfPeak);
    const levels = [...new Set(halfPeak.map((x) => x.concurrency))].join(' / ');
    entries.push({
      name: 'actionledger_enqueue_to_dispatch_at_half_peak',
      concurrency: h.concurrency,
      ops_per_s: h.achievedOpsPerS,
      p50_ms: h.p50Ms,
      p99_ms: h.p99Ms,
      enqueue_to_dispatch_p50_ms_at_half_peak: h.p50Ms,
      enqueue_to_dispatch_p99_ms_at_half_peak: h.p99Ms,
      enqueue_to_dispatch_max_ms_at_half_peak: round2(h.maxMs),
      enqueue_to_outcome_p50_ms_at_half_peak: h.outcomeP50Ms,
      enqueue_to_outcome_p99_ms_at_half_peak: h.outcomeP99Ms,
      commit_to_claim_p50_ms_at_half_peak: h.claimP50Ms,
      commit_to_claim_p99_ms_at_half_peak: h.claimP99Ms,
      commit_to_claim_ms_of_sends_at_or_past_p99: round2(h.tailClaimMs),
      authorization_requests: authorizationLine(h.authorization),
      database_connections_opened_rounds: halfPeak.map((x) => x.dbConnectionsOpened).join(', '),
      after_claim_stage_p50_ms: stageList(h.stages.all),
      after_claim_stage_p50_ms_of_sends_at_or_past_p99: stageList(h.stages.tail),
      peak_ops_per_s: h.peakOpsPerS,
      peak_concurrency: levels,
      target_ops_per_s: h.targetOpsPerS,
      offered_ops_per_s: h.offeredOpsPerS,
      achieved_ops_per_s: h.achievedOpsPerS,
      arrivals: 'poisson',
      arrival_seconds: h.seconds,
      arrivals_started: h.arrivals,
      arrival_lag_p99_ms: h.arrivalLagP99Ms,
      not_succeeded: h.notSucceeded,
      p99_ms_rounds: halfPeak.map((x) => x.p99Ms.toFixed(1)).join(', '),
      check: h.check,
      main_thread_elu: round2(h.elu),
      machine_cpu_cores: round2(h.cpu.machineCores),
      other_processes_cpu_cores: round2(h.cpu.otherCores),
    });
    log(
      `\nOpen loop at half the end-to-end peak (Poisson arrivals for ${h.seconds} s; medians over ${halfPeak.length} round(s); latency per operation, ms):`,
    );
    const peerRows: (string | number)[][] = [];
    for (const [runs, label, entry] of [
      [
        peerAtSame,
        "pg-boss mTLS handler at actionledger's rate",
        'pgboss_mtls_handler_enqueue_to_dispatch_at_actionledger_half_peak',
      ],
      [
        peerAtOwnHalf,
        'pg-boss mTLS handler at half its own peak',
        'pgboss_mtls_handler_enqueue_to_dispatch_at_own_half_peak',
      ],
    ] as const) {
      if (runs.length === 0) continue;
      const p = median(runs);
      const pLevels = [...new Set(runs.map((x) => x.concurrency))].join(' / ');
      peerRows.push([
        label,
        pLevels,
        2 * p.targetOpsPerS,
        p.targetOpsPerS,
        p.offeredOpsPerS,
        p.achievedOpsPerS,
        p.p50Ms,
        p.p99Ms,
        p.outcomeP50Ms,
        p.outcomeP99Ms,
      ]);
      entries.push({
        name: entry,
        concurrency: p.concurrency,
        ops_per_s: p.achievedOpsPerS,
        p50_ms: p.p50Ms,
        p99_ms: p.p99Ms,
        enqueue_to_dispatch_p50_ms: p.p50Ms,
        enqueue_to_dispatch_p99_ms: p.p99Ms,
        enqueue_to_complete_p50_ms: p.outcomeP50Ms,
        enqueue_to_complete_p99_ms: p.outcomeP99Ms,
        target_ops_per_s: p.targetOpsPerS,
        offered_ops_per_s: p.offeredOpsPerS,
        achieved_ops_per_s: p.achievedOpsPerS,
        arrivals: 'poisson',
        arrival_seconds: p.seconds,
        arrivals_started: p.arrivals,
        arrival_lag_p99_ms: p.arrivalLagP99Ms,
        not_succeeded: p.notSucceeded,
        p99_ms_rounds: runs.map((x) => x.p99Ms.toFixed(1)).join(', '),
        level_rounds: runs.map((x) => x.concurrency).join(', '),
        authorization_requests: authorizationLine(p.authorization),
        check: p.check,
        main_thread_elu: round2(p.elu),
        machine_cpu_cores: round2(p.cpu.machineCores),
        other_processes_cpu_cores: round2(p.cpu.otherCores),
      });
    }
    tHalf = printTable(
      [
        'system',
        'N',
        'peak ops/s',
        'target ops/s',
        'offered ops/s',
        'achieved ops/s',
        'commit -> request sent p50',
        'p99',
        'commit -> outcome commit p50',
        'p99',
      ],
      [
        [
          'actionledger',
          levels,
          h.peakOpsPerS,
          h.targetOpsPerS,
          h.offeredOpsPerS,
          h.achievedOpsPerS,
          h.p50Ms,
          h.p99Ms,
          h.outcomeP50Ms,
          h.outcomeP99Ms,
        ],
        ...peerRows,
      ],
    );
    halfWhere =
      `Where commit -> request sent went (each stage's median ms in a round, all operations / those sent at or past the p99; then each stage's median over rounds on its own, so the stages need not add up): ` +
      `to the claim ${h.claimP50Ms.toFixed(1)} / ${h.tailClaimMs.toFixed(1)}; after it, ${stageList(h.stages.all, h.stages.tail)}; ${authorizationLine(h.authorization)} (medians over rounds) ` +
      '(authorize: claim -> evidence statement sent, in two parts: the authorization call, request created -> response body received, and after the call, the checks of the decision and the wait for a dispatch batch and its connection; evidence + lock: that statement, BEGIN and the row-lock statement written with it, until the locks are answered; check + send: the final check and the request until written).';
    log(halfWhere);
  }

  const { table: scalingRows, entries: scalingEntries } = scalingReport(scaling, SCALING_CASES[0]);
  entries.push(...scalingEntries);
  let t2 = '';
  if (scaling.length > 0) {
    for (const r of scaling)
      log(`\n== ${r.ledger.name}, ${r.variant} claim: EXPLAIN (ANALYZE, BUFFERS) after ${r.claims} claims\n${r.plan}`);
    log('\n' + scalingNotes.map((x) => `- ${x}`).join('\n'));
    log(
      `\nClaim of 32 as the queue grows (each claim rolled back; p50 / first ledger's p50 of the same claim; alongside: ` +
        `the shipped claim's p50 / the first ledger's p50 from claims alternating with these):`,
    );
    t2 = printTable(
      [
        'ledger',
        'claim',
        'claims',
        'p50 ms',
        'p99 ms',
        `p50 / ${SCALING_CASES[0]?.name}`,
        `p50 / ${SCALING_CASES[0]?.name} alongside`,
        'rows read by the pick',
        'shared buffers',
        'scans in the pick',
      ],
      scalingRows,
    );
  }
  let t3 = '';
  if (backlog.length > 0) {
    const first = backlog[0]!;
    const backlogRows = backlog.map((b) => [
      b.queued.toLocaleString('en-US'),
      b.drainOpsPerS,
      b.drainOpsPerS / first.drainOpsPerS,
      b.drainSeconds,
      b.states,
      b.reserve.opsPerS,
      b.reserve.opsPerS / first.reserve.opsPerS,
      b.reserve.p50Ms,
      b.reserve.p99Ms,
    ]);
    for (const b of backlog) {
      entries.push({
        name: 'actionledger_backlog_drain',
        concurrency: b.concurrency,
        ops_per_s: b.drainOpsPerS,
        p50_ms: null,
        p99_ms: null,
        queued: b.queued,
        ratio_to_first_backlog: b.drainOpsPerS / first.drainOpsPerS,
        seconds: b.drainSeconds,
        states: b.states,
      });
      entries.push({
        name: 'actionledger_reserve_after_backlog',
        concurrency: 8,
        ops_per_s: b.reserve.opsPerS,
        p50_ms: b.reserve.p50Ms,
        p99_ms: b.reserve.p99Ms,
        ledger_operations: b.queued,
        ratio_to_first_backlog: b.reserve.opsPerS / first.reserve.opsPerS,
      });
    }
    log(
      `\nBacklog drained by one dispatcher (concurrency ${BACKLOG_CONCURRENCY}), then reservations into that ledger (8 in flight):`,
    );
    t3 = printTable(
      [
        'queued',
        'drain ops/s',
        `/ ${first.queued.toLocaleString('en-US')} queued`,
        'drain s',
        'after the drain',
        'reserve ops/s after',
        `/ after ${first.queued.toLocaleString('en-US')}`,
        'reserve p50 ms',
        'reserve p99 ms',
      ],
      backlogRows,
    );
  }
  const minutes = (Date.now() - started) / 60_000;
  log(`\n# ${minutes.toFixed(1)} minutes`);

  if (!SAVE_MAIN) {
    log(
      SAVE
        ? '# only some of table, scaling, backlog ran: bench/results.json and bench/results.md left as they were'
        : '# --quick: bench/results.json and bench/results.md left as they were (--save writes them)',
    );
    return;
  }
  const md = [
    `Measured by \`npm run bench\`: ${machineLine}; ${ROUNDS} round(s), ${minutes.toFixed(0)} minutes, ${new Date().toISOString().slice(0, 10)}.`,
    '',
    `Throughput and latency at N = ${LEVELS.join(', ')} (closed loops: N callers, each starting its next operation when the previous one is acknowledged; medians over rounds, ratios are medians of per-round ratios):`,
    '',
    t1,
    '',
    '- INSERT: `INSERT INTO plain_insert (payload) VALUES ($1)`, autocommit. SQL lifecycle: insert ledger + outbox row; claim with `FOR UPDATE SKIP LOCKED`, delete it and mark executing; mark succeeded: 3 commits; latency first statement to third commit.',
    '- pg-boss 10.4: `send` from N callers; then one worker with `batchSize` N processes those jobs with a no-op handler that wakes it again at once (no polling pause): jobs / (first fetch -> last `complete` acknowledged); and send -> `complete` acknowledged with N jobs in flight, woken in-process after each send (`notifyWorker`).',
    '- actionledger: `Ledger.reserve` from N callers; and reservation -> `succeeded` through a real Dispatcher (concurrency N, pool N + 4): fresh authorization and provider call over mutual TLS to sandbox servers on loopback (a worker thread of the same process), latency from the reservation commit acknowledged to the outcome commit acknowledged; "-> claimed" ends when the claim statement returns the operation.',
    '- "/ pg-boss": reserve against pg-boss `send`; end to end, and pg-boss with the mTLS handler, against pg-boss send -> completed.',
    "- pg-boss with the two mTLS calls in its handler (the peer one would build instead): N callers each `send` a job (the request's tenant, principal, task, step, approval, policy version and arguments) and wait for its `complete` acknowledged; one worker with `batchSize` N, woken after each send (`notifyWorker`), runs the batch's jobs concurrently, each making the dispatcher's two mutual-TLS calls with the dispatcher's client code, agents and sandbox servers: the authorization request, its decision checked as the dispatcher checks it, then the provider POST with the job id as the Idempotency-Key, classified. It has none of actionledger's guarantees: no ledger row, claim fence, evidence, final check under a row lock (kill switches, revocations, freshness) or recorded outcome, and a job that outlives its expiry is fetched again while its first call may still be out. \"end to end / this\" (`ratio_to_pgboss_mtls_handler` on the end-to-end entries of bench/results.json) is actionledger's end-to-end rate against it, the median of per-round ratios; \"this / floor\" (`ratio_to_floor` on its entries) is its own rate against the floor below.",
    '- floor: N callers each reserve and then make the two mutual-TLS calls themselves (the authorization, checked as the dispatcher checks it, and the provider call), with the dispatcher\'s client code, agents and sandbox servers, and nothing else: no claim, evidence, row lock or outcome write. No dispatcher can beat it on this machine; "end to end / floor" is the share of it the dispatcher reaches.',
    '- floor + the least dispatch writes: the floor, with the two writes a dispatcher that promises at most one provider effect without trusting the provider to deduplicate must add, each kept small: after the reservation and before the calls, the claim (a row of a two-column table keyed by the operation, inserted unless present, committed), and after the calls the outcome, where end to end ends (that row updated, fenced on `executing`, committed asynchronously: a crash may lose it and leave the claim for a readback, so no promise needs it flushed); prepared statements, autocommitted on pools of their own whose sessions leave the planner only index plans; one row a statement, or, in the next row, one statement a batch (the writes that arrive while the previous statement of their kind is in flight go together, as the dispatcher batches its own). No evidence, history, row lock, final check or claim query (each caller knows its operation). Its rate is the most such a dispatcher could reach here: "the better of the two / floor" is what those two commits leave of the floor, in each round the better of the two forms; "end to end / the better" and "peer / the better" measure actionledger and the peer against it (`ratio_to_floor_with_least_dispatch_writes` in bench/results.json).',
    '- transport: the floor with a bare undici Agent (same certificates, servers and requests) and `JSON.parse` instead of the dispatcher\'s client code (byte cap, strict parser, body hash, classification, checked decision); "floor / transport" is the share of the bare transport the floor reaches.',
    `- CPU per operation, ms (this process's threads, the sandbox servers' included, + PostgreSQL's processes; medians over rounds; \`cpu_ms_per_op\` in bench/results.json), and the cores end to end would need at the peer's rate (its CPU per operation times the peer's rate, median over rounds; the machine has ${cpus().length}): ${budgets.join('; ')}.`,
    `- Other processes on the machine, most cores in any cell of each kept round: ${loads.join('; ')}. A round with 0.3 cores or more was run again, at most ${ROUNDS} times per level.`,
    '',
    ...(tWork === ''
      ? []
      : [WORK_NOTE, '', tWork, '', 'Heap rows per operation, by table:', '', ...workTables.map((l) => `- ${l}`), '']),
    ...(tHalf === ''
      ? []
      : [
          `Enqueue -> dispatch at half the end-to-end peak (open loop): after each round, on a fresh database, a real Dispatcher of the concurrency whose end-to-end rate was that round's best (pool concurrency + 4) takes reservations arriving as a Poisson process (seeded exponential gaps) at half that rate for ${HALF_PEAK_SECONDS} s, each started at its arrival time whatever the others do; latency from the reservation commit acknowledged to the provider request written to its socket (undici's \`undici:request:bodySent\` diagnostics channel, matched by URL and Idempotency-Key), and to the outcome commit acknowledged; achieved: operations succeeded / (first arrival -> last outcome commit). Then the peer (pg-boss with the mTLS handler, one worker of batch size N woken after each send) in the same open loop (the same seeded gaps, scaled to the rate): once at the rate offered to actionledger and the level of its peak, once at half the peer's own best rate of the round and that rate's level ("peak ops/s" is the peak the target was taken from); its latency runs from the send's commit acknowledged to the provider request written and to the \`complete\` acknowledged. Medians over rounds (\`enqueue_to_dispatch_p99_ms_at_half_peak\` in bench/results.json; \`enqueue_to_dispatch_p99_ms\` on the peer's entries):`,
          '',
          tHalf,
          '',
          halfWhere,
          '',
        ]),
    ...(t2 === ''
      ? []
      : [
          'Claim cost as the queue grows (the dispatcher\'s claim of 32, each rolled back; the shipped claim sent as the dispatcher sends it, a named statement on a connection with the claim settings, the others unnamed; bulk-loaded rows, then `ANALYZE operations, outbox` as autovacuum would; `gate_kill_switches` left as migrations leave it, never analyzed; "previous" is the claim before its kill-switch test was rewritten (a plain NOT EXISTS); "kill switches analyzed" is that claim after `ANALYZE gate_kill_switches`; "1 kill switch, analyzed": after one kill switch for a tenant with no queued work was engaged and the table analyzed; at 1,000,000 queued only the shipped claim is measured; "alongside": the shipped claim\'s p50 over the first ledger\'s, from claims alternating with claims on a copy of the first ledger, so both meet the same machine load):',
          '',
          t2,
          '',
          '<details><summary>EXPLAIN (ANALYZE, BUFFERS) of each claim, taken after its claims</summary>',
          '',
          ...scaling.flatMap((r) => [`${r.ledger.name}, ${r.variant}:`, '', '```', r.plan, '```', '']),
          ...scalingNotes.map((x) => `- ${x}`),
          '',
          '</details>',
        ]),
    '',
    ...(t3 === ''
      ? []
      : [
          `Backlogs drained (operations bulk-loaded as reservations leave them, tables analyzed, then one real Dispatcher of concurrency ${BACKLOG_CONCURRENCY} over mutual TLS drains them all: outcomes per second from the 10% mark to the last outcome commit; drain s is start to last outcome); then, with the dispatcher stopped, reservations into the ledger the drain left, 8 in flight:`,
          '',
          t3,
          '',
        ]),
  ].join('\n');
  writeLastRun(join('bench', 'results.md'), md);
  saveResults('bench', entries, {
    machine: machineLine,
    postgres: server.server_version ?? '?',
    fsync: server.fsync ?? '?',
    synchronous_commit: server.synchronous_commit ?? '?',
    tree,
    rounds: String(ROUNDS),
    levels: LEVELS.join(','),
    throughput_cell_seconds: String(THROUGHPUT_MS / 1000),
    lifecycle_cell: `>= ${LIFECYCLE.ops} ops and ${LIFECYCLE.minMs / 1000} s, none started after ${LIFECYCLE.capMs / 1000} s`,
    minutes: minutes.toFixed(1),
    tables: [t1, tWork, tHalf, t2, t3].filter((t) => t !== '').join('\n\n'),
  });
  log('# wrote bench/results.json (runs.bench) and bench/results.md');
}

main().catch((err: unknown) => {
  process.stderr.write(`${(err as Error)?.stack ?? String(err)}\n`);
  process.exit(1);
});
