/**
 * `npm run bench -- --only dispatch`: operations per second from reservation to `succeeded` through a real Dispatcher
 * (fresh mTLS authorization, evidence, final check under the row lock, one provider call over mTLS, fenced
 * outcome), beside, on the same PostgreSQL in the same run:
 *   - the server's 3-commit SQL-only lifecycle (insert ledger+outbox, claim with SKIP LOCKED, mark succeeded),
 *   - pg-boss 10 processing no-op jobs, polling (its fastest interval, 0.5 s) and woken in-process,
 *   - the SQL lifecycle with a simulated provider request of the measured duration, outside the transaction
 *     and inside one holding the row lock, which is what the dispatcher does: the cost of that lock.
 *
 * Load, the same for every system: N producers in a closed loop, each enqueuing one operation and waiting
 * until its completion commit is acknowledged before enqueuing the next, so N operations are in flight; the
 * consumer runs with concurrency N. After a warm-up, each cell runs at least `--ops` operations and at least
 * `--min-seconds`, and starts none after `--seconds`, on a fresh database dropped afterwards.
 *
 * Every cell but polling pg-boss runs `--rounds` times, interleaved, and the tables show medians. These
 * machines are shared: a round during which other processes used 0.3 cores or more (bench/cpu.ts) is run
 * again, up to `--rounds` extra rounds per level, and the load that remained is reported.
 *
 * Options (bench/run.ts passes them; see {@link DispatchBenchOptions}): --ops (default 600), --min-seconds
 * (default 0; 2 keeps the fast SQL and pg-boss cells running long enough to be steadier), --cap-seconds
 * (default 6), --rounds (default 3), --levels (default 1,8,32); BENCH_QUIET_MAX_SECONDS (default 15).
 */
import {
  actionledgerCell,
  cellContext,
  common,
  cpuMsPerOp,
  gitHead,
  list,
  median,
  medianOf,
  pgBossCell,
  ratioOf,
  sqlCell,
  type AlResult,
  type BossResult,
  type CellLimits,
  type SqlResult,
} from './cells.js';
import { findPostmaster, waitForQuiet } from './cpu.js';
import { createBenchPki } from './dispatch-env.js';
import { medianWork, tableLine, workJson, workRow, WORK_HEADER } from './pg-work.js';
import { machine, openBenchDatabase, stopOnSignal, printTable, saveResults, type ResultEntry } from './harness.js';

export interface DispatchBenchOptions {
  /** Each cell runs at least this many operations (600). */
  ops: number;
  /** ... and at least this long (0 s) ... */
  minSeconds: number;
  /** ... and starts none after this long (6 s). */
  capSeconds: number;
  rounds: number;
  levels: number[];
  /** Longest wait, before each round, for other processes on the machine to go quiet (15 s). */
  quietMaxSeconds: number;
  /** Replace `runs.dispatch` in bench/results.json. */
  save: boolean;
}
/**
 * A round in which other processes used this many cores during any of its cells is run again (at most
 * ROUNDS times per level; after that rounds are kept whatever the load, and the results say how loaded).
 */
const NOISY_CORES = 0.3;

/** The dispatch detail run (see the file comment); prints its tables, and saves them when `o.save`. */
export async function runDispatchBench(o: DispatchBenchOptions): Promise<void> {
  const OPS = o.ops;
  const CELL_MS = o.capSeconds * 1000;
  const MIN_MS = o.minSeconds * 1000;
  const ROUNDS = o.rounds;
  const LEVELS = o.levels;
  const LIMITS: CellLimits = { ops: OPS, capMs: CELL_MS, minMs: MIN_MS };
  const QUIET_MAX_MS = o.quietMaxSeconds * 1000;
  const db = await openBenchDatabase();
  stopOnSignal(db);
  cellContext.postmaster = await findPostmaster(db.adminUrl).catch(() => null);
  const pki = await createBenchPki();
  process.stdout.write(
    `# PostgreSQL ${db.version}; ${machine()}; ${ROUNDS} rounds; per cell at least ${OPS} ops and ${MIN_MS / 1000} s, none started after ${CELL_MS / 1000} s\n`,
  );
  const entries: ResultEntry[] = [];
  const throughput: (string | number)[][] = [];
  const latency: (string | number)[][] = [];
  const locks: (string | number)[][] = [];
  const cpu: (string | number)[][] = [];
  const work: (string | number)[][] = [];
  const workTables: string[] = [];
  try {
    for (const n of LEVELS) {
      const als: AlResult[] = [];
      const sqls: SqlResult[] = [];
      const outsides: SqlResult[] = [];
      const unders: SqlResult[] = [];
      const notifies: BossResult[] = [];
      let requestMs: number | undefined;
      // Rounds interleave the systems, so a noisy stretch of the shared machine hits all of them.
      let discarded = 0;
      for (let round = 1; als.length < ROUNDS; round++) {
        const quiet = await waitForQuiet(cellContext.postmaster, QUIET_MAX_MS, NOISY_CORES);
        if (quiet >= NOISY_CORES)
          process.stdout.write(
            `  (other processes still used ${quiet.toFixed(2)} cores after ${QUIET_MAX_MS / 1000} s; measuring anyway)\n`,
          );
        const al = await actionledgerCell(db.adminUrl, pki, n, LIMITS);
        // The simulated request lasts as long as the first round's measured provider call (whole ms).
        const reqMs = requestMs ?? Math.max(1, Math.round(al.providerP50Ms));
        const sql = await sqlCell(db.adminUrl, n, 'plain', 0, LIMITS);
        const outside = await sqlCell(db.adminUrl, n, 'request_outside_lock', reqMs, LIMITS);
        const under = await sqlCell(db.adminUrl, n, 'request_under_lock', reqMs, LIMITS);
        const notify = await pgBossCell(db.adminUrl, n, 'notify', LIMITS);
        const other = Math.max(
          ...[al, sql, outside, under, notify].map((r) => (Number.isNaN(r.cpu.otherCores) ? 0 : r.cpu.otherCores)),
        );
        const keep = other < NOISY_CORES || discarded >= ROUNDS;
        process.stdout.write(
          `  N=${n} round ${round}${keep ? '' : ' DISCARDED'}: actionledger ${al.opsPerS.toFixed(0)} ops/s (main-thread ELU ${al.elu.toFixed(2)}; cores: Node ${al.cpu.nodeCores.toFixed(2)}, PostgreSQL ${al.cpu.postgresCores.toFixed(2)}); ` +
            `sql ${sql.opsPerS.toFixed(0)}, +request outside/under lock ${outside.opsPerS.toFixed(0)}/${under.opsPerS.toFixed(0)}; pg-boss notify ${notify.opsPerS.toFixed(0)}; ` +
            `other processes up to ${other.toFixed(2)} cores\n    ${al.check}\n`,
        );
        if (!keep) {
          discarded++;
          continue;
        }
        requestMs = reqMs;
        als.push(al);
        sqls.push(sql);
        outsides.push(outside);
        unders.push(under);
        notifies.push(notify);
      }
      // Polling pg-boss runs once: its rate is its batch size times its polling rate.
      const poll = await pgBossCell(db.adminUrl, n, 'poll', LIMITS);
      process.stdout.write(`  N=${n} pg-boss poll ${poll.opsPerS.toFixed(1)} jobs/s (${poll.ops} jobs)\n`);
      const al = median(als);
      const sql = median(sqls);
      const outside = median(outsides);
      const under = median(unders);
      const notify = median(notifies);
      const reqMs = requestMs ?? 1;
      const alSql = ratioOf(als, sqls);
      const alNotify = ratioOf(als, notifies);
      const underOutside = ratioOf(unders, outsides);

      throughput.push([
        String(n),
        al.opsPerS,
        sql.opsPerS,
        alSql,
        poll.opsPerS,
        al.opsPerS / poll.opsPerS,
        notify.opsPerS,
        alNotify,
        al.cpu.otherCores,
      ]);
      latency.push([
        String(n),
        al.p50Ms,
        al.p99Ms,
        al.wakeP50Ms,
        poll.p50Ms,
        poll.p99Ms,
        notify.p50Ms,
        notify.p99Ms,
        sql.p50Ms,
        sql.p99Ms,
      ]);
      locks.push([
        String(n),
        al.providerP50Ms,
        al.lockHeldP50Ms,
        al.connAvg,
        String(reqMs),
        outside.opsPerS,
        under.opsPerS,
        underOutside,
        outside.connAvg,
        under.connAvg,
      ]);

      cpu.push([
        String(n),
        al.elu,
        al.cpu.nodeCores - al.cpu.threadCores,
        al.cpu.threadCores,
        al.cpu.postgresCores,
        cpuMsPerOp(al),
        cpuMsPerOp(sql),
        cpuMsPerOp(notify),
        al.statementsPerOp,
      ]);

      // PostgreSQL's work per operation: its CPU (median over rounds) and what it wrote (bench/pg-work.ts).
      const alWork = medianWork(als.map((r) => r.pgWork));
      const alPgCpuMs = medianOf(als.map((r) => (r.cpu.postgresCores * 1000) / r.opsPerS));
      work.push(workRow(n, 'actionledger end to end', alPgCpuMs, alWork));
      workTables.push(`N = ${n}, actionledger end to end: ${tableLine(alWork)}`);

      entries.push(
        {
          name: 'actionledger_end_to_end',
          concurrency: n,
          ops_per_s: al.opsPerS,
          p50_ms: al.p50Ms,
          p99_ms: al.p99Ms,
          ops_per_s_rounds: list(als),
          ...common(al),
          ratio_to_sql_lifecycle: alSql,
          ratio_to_pgboss_poll: al.opsPerS / poll.opsPerS,
          ratio_to_pgboss_notify: alNotify,
          commit_to_claim_p50_ms: al.wakeP50Ms,
          provider_call_p50_ms: al.providerP50Ms,
          row_lock_held_p50_ms: al.lockHeldP50Ms,
          row_lock_held_p99_ms: al.lockHeldP99Ms,
          dispatcher_connections_avg: al.connAvg,
          dispatcher_connections_max: al.connMax,
          dispatcher_pool_waiting_avg: al.poolWaitingAvg,
          not_succeeded: al.notSucceeded,
          dispatcher_statements_per_op: al.statementsPerOp,
          rounds_discarded_for_other_load: discarded,
          cpu_ms_per_op: cpuMsPerOp(al),
          pg_cpu_ms_per_op: alPgCpuMs,
          ...workJson(alWork),
          check: al.check,
        },
        {
          name: 'sql_lifecycle_3_commits',
          concurrency: n,
          ops_per_s: sql.opsPerS,
          p50_ms: sql.p50Ms,
          p99_ms: sql.p99Ms,
          ops_per_s_rounds: list(sqls),
          ...common(sql),
          cpu_ms_per_op: cpuMsPerOp(sql),
          connections_avg: sql.connAvg,
          empty_claims: sql.emptyClaims,
        },
        {
          name: 'sql_lifecycle_request_outside_lock',
          concurrency: n,
          ops_per_s: outside.opsPerS,
          p50_ms: outside.p50Ms,
          p99_ms: outside.p99Ms,
          ops_per_s_rounds: list(outsides),
          ...common(outside),
          request_ms: reqMs,
          connections_avg: outside.connAvg,
        },
        {
          name: 'sql_lifecycle_request_under_lock',
          concurrency: n,
          ops_per_s: under.opsPerS,
          p50_ms: under.p50Ms,
          p99_ms: under.p99Ms,
          ops_per_s_rounds: list(unders),
          ...common(under),
          request_ms: reqMs,
          connections_avg: under.connAvg,
          ratio_to_outside_lock: underOutside,
        },
        {
          name: 'pgboss_poll_0.5s',
          concurrency: n,
          ops_per_s: poll.opsPerS,
          p50_ms: poll.p50Ms,
          p99_ms: poll.p99Ms,
          ...common(poll),
          check: poll.check,
        },
        {
          name: 'pgboss_notify_worker',
          concurrency: n,
          ops_per_s: notify.opsPerS,
          p50_ms: notify.p50Ms,
          p99_ms: notify.p99Ms,
          ops_per_s_rounds: list(notifies),
          ...common(notify),
          cpu_ms_per_op: cpuMsPerOp(notify),
          check: notify.check,
        },
      );
    }
  } finally {
    await db.close();
  }
  process.stdout.write(
    `\nThroughput (operations/s with N in flight; medians of ${ROUNDS} rounds, ratios: median of per-round ratios; pg-boss poll 1 round):\n`,
  );
  const t1 = printTable(
    [
      'N',
      'actionledger ops/s',
      'SQL 3-commit ops/s',
      'AL / SQL',
      'pg-boss poll 0.5 s jobs/s',
      'AL / pg-boss poll',
      'pg-boss notifyWorker jobs/s',
      'AL / pg-boss notify',
      'other load during AL (cores)',
    ],
    throughput,
  );
  process.stdout.write('\nLatency (ms): enqueue commit acknowledged -> completion commit acknowledged:\n');
  const t2 = printTable(
    [
      'N',
      'AL p50',
      'AL p99',
      'AL commit->claim p50',
      'pg-boss poll p50',
      'pg-boss poll p99',
      'pg-boss notify p50',
      'pg-boss notify p99',
      'SQL cycle p50',
      'SQL cycle p99',
    ],
    latency,
  );
  process.stdout.write('\nRow lock across the provider call:\n');
  const t3 = printTable(
    [
      'N',
      'AL provider call p50 ms',
      'AL lock held p50 ms',
      'AL dispatcher conns in use (avg)',
      'simulated request ms',
      'SQL + request outside lock ops/s',
      'SQL + request under lock ops/s',
      'under / outside',
      'conns outside (avg)',
      'conns under (avg)',
    ],
    locks,
  );
  process.stdout.write(
    '\nWhere the CPU goes (cores; ms of Node + PostgreSQL CPU per operation, sandbox servers excluded):\n',
  );
  const t4 = printTable(
    [
      'N',
      'AL main-thread ELU',
      'AL Node cores (producers + dispatcher)',
      'sandbox servers cores',
      'AL PostgreSQL cores',
      'AL CPU ms/op',
      'SQL CPU ms/op',
      'pg-boss notify CPU ms/op',
      'AL dispatcher statements/op',
    ],
    cpu,
  );
  process.stdout.write(
    '\nPostgreSQL work per operation (medians over rounds; WAL from pg_stat_wal, rows from pg_stat_user_tables, index entries derived: bench/pg-work.ts):\n',
  );
  const t5 = printTable(WORK_HEADER, work);
  process.stdout.write(`Heap rows per operation, by table:\n${workTables.map((l) => `- ${l}`).join('\n')}\n`);
  if (!o.save) return;
  saveResults('dispatch', entries, {
    machine: machine(),
    postgres: db.version,
    rounds: String(ROUNDS),
    ops_per_cell: String(OPS),
    cell_seconds_min: String(MIN_MS / 1000),
    cell_seconds_cap: String(CELL_MS / 1000),
    tree: gitHead(),
    tables: [t1, t2, t3, t4, t5].join('\n\n'),
  });
}
