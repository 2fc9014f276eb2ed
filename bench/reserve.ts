/**
 * `npm run bench -- --only reserve`: reservations per second at 1, 4 and 16 concurrent clients, beside the same
 * server's plain single-row INSERT commit rate measured in the same run. The ratio is the figure.
 */
import { createPool } from '../db/db.js';
import { migrate } from '../db/migrate.js';
import { benchLedger } from './cells.js';
import { tableLine, workJson, workMeter } from './pg-work.js';
import {
  closedLoop,
  freshDatabase,
  machine,
  openBenchDatabase,
  printTable,
  saveResults,
  type ResultEntry,
} from './harness.js';

const LEVELS = [1, 4, 16];

/** Runs every level for `seconds` per cell (4 in a full run); replaces `runs.reserve` in results.json when `save`. */
export async function runReserveBench(o: { seconds: number; save: boolean }): Promise<void> {
  const DURATION_MS = o.seconds * 1000;
  const db = await openBenchDatabase();
  const url = await freshDatabase(db.adminUrl, 'al_bench_reserve');
  const pool = createPool(url, { max: 20, statementTimeoutMs: 60_000, applicationName: 'bench' });
  const client = await pool.connect();
  await migrate(client, 'actionledger', '"actionledger"');
  await client.query(
    'CREATE TABLE public.plain_insert (id bigserial PRIMARY KEY, payload text NOT NULL, at timestamptz NOT NULL DEFAULT now())',
  );
  client.release();

  const ledger = benchLedger(url, pool);
  const args = { order_id: 'ord-1', amount: 1250, currency: 'EUR', reason: 'damaged in transit' };

  const rows: (string | number)[][] = [];
  const entries: ResultEntry[] = [];
  const tables: string[] = [];
  process.stdout.write(`# PostgreSQL ${db.version}; ${machine()}; ${DURATION_MS / 1000} s per cell\n`);
  for (const c of LEVELS) {
    const plain = await closedLoop(c, DURATION_MS, async () => {
      await pool.query('INSERT INTO public.plain_insert (payload) VALUES ($1)', [JSON.stringify(args)]);
    });
    const meter = workMeter(url);
    await meter.start();
    const reserve = await closedLoop(c, DURATION_MS, async (w, i) => {
      await ledger.reserve(
        {
          tenant_id: 'tenant-a',
          principal_id: `p-${w}`,
          task_id: `task-${c}-${i}`,
          workflow_step_id: 's1',
          approval_id: 'a1',
          policy_version: 'v1',
        },
        'issue_refund',
        args,
      );
    });
    const work = await meter.stop(reserve.ops);
    const ratio = reserve.opsPerS / plain.opsPerS;
    rows.push([
      String(c),
      plain.opsPerS,
      reserve.opsPerS,
      ratio,
      reserve.p50Ms,
      reserve.p99Ms,
      work.walBytes,
      work.rowsWritten,
      `${work.indexEntriesFull.toFixed(2)}-${work.indexEntries.toFixed(2)}`,
    ]);
    tables.push(`${c} clients: ${tableLine(work)}`);
    entries.push(
      {
        name: 'plain_insert_commit',
        concurrency: c,
        ops_per_s: plain.opsPerS,
        p50_ms: plain.p50Ms,
        p99_ms: plain.p99Ms,
      },
      {
        name: 'reserve',
        concurrency: c,
        ops_per_s: reserve.opsPerS,
        p50_ms: reserve.p50Ms,
        p99_ms: reserve.p99Ms,
        ratio_to_plain_insert: ratio,
        ...workJson(work),
      },
    );
  }
  printTable(
    [
      'clients',
      'plain INSERT commits/s',
      'reserve/s',
      'reserve / INSERT',
      'reserve p50 ms',
      'reserve p99 ms',
      'reserve WAL bytes/op',
      'reserve heap rows/op',
      'reserve index entries/op (min-max)',
    ],
    rows,
  );
  process.stdout.write(`Reservation heap rows per operation, by table (bench/pg-work.ts):\n${tables.join('\n')}\n`);
  if (o.save) saveResults('reserve', entries, { machine: machine(), postgres: db.version });
  ledger.stop();
  await pool.end();
  await db.close();
}
