/**
 * What PostgreSQL did for a cell's measured run, per operation: WAL written, heap rows written per table, index
 * entries written (derived) and the share of updates that were HOT. Read from the statistics views of the cell's
 * own database (each cell runs on a fresh one) before and after the measured run, so setup and warm-up are not
 * in the deltas:
 *   - WAL: `pg_stat_wal` (`wal_records`, `wal_fpi`, `wal_bytes`: columns PostgreSQL 14 to 18 all have; 18 moved
 *     `wal_write`, `wal_sync` and their times to `pg_stat_io`, so they are not read), and the advance of
 *     `pg_current_wal_insert_lsn()`, which is exact at both ends and needs no statistics flush. Both are
 *     cluster-wide: they include what the server's background processes (checkpointer, autovacuum) wrote
 *     meanwhile; the bench cluster runs one cell at a time.
 *   - heap rows: `pg_stat_user_tables` `n_tup_ins`, `n_tup_upd`, `n_tup_hot_upd`, `n_tup_del` of every table of
 *     the database, whatever its schema (pg-boss's `pgboss` schema included). Rows written by triggers count.
 *   - index entries: not counted by any statistics view (`pg_stat_user_indexes` counts scans and tuples read,
 *     `pg_statio_user_indexes` blocks), so derived: each inserted row and each non-HOT update adds one entry to
 *     every index of its table whose predicate the new row version satisfies. Which partial indexes a row
 *     satisfies is not known from the counters, so two figures: `indexEntries` counts every index (an upper
 *     bound), `indexEntriesFull` only the indexes without a predicate (a lower bound). Deletes add none (the
 *     entries go at vacuum); a HOT update adds none. A non-HOT update whose indexed columns did not change still
 *     adds an entry to every index (PostgreSQL 16's bottom-up deletion may remove old ones later, not counted).
 *
 * The statistics collector is asynchronous: a backend keeps its counts until it flushes them, at most once a
 * second while busy and within 10 s of going idle. {@link flushBackends} asks every connection of this process
 * to the database to flush now (`pg_stat_force_next_flush()`, PostgreSQL 15 and later; the flush happens before
 * the statement's answer). Connections of other processes cannot be reached: when the database has any (or the
 * server is older than 15), it waits {@link SETTLE_MS} for their idle flush instead, and says so.
 *
 * The one use of the driver beyond its public API is here: {@link trackClients} wraps `pg.Client#connect` to
 * know every connection of this process (pools, the dispatcher's claim connection, pg-boss's), because the
 * dispatcher opens its claim connection itself. test/bench/pg-work.test.ts fails if that stops seeing them.
 */
import pg from 'pg';

/** Longer than PostgreSQL's idle flush interval (PGSTAT_IDLE_INTERVAL, 10 s). */
export const SETTLE_MS = 11_000;

const live = new Set<pg.Client>();
let tracking = false;

/** Makes every pg.Client this process connects from now on known to {@link flushBackends}; idempotent. */
export function trackClients(): void {
  if (tracking) return;
  tracking = true;
  const proto = pg.Client.prototype as unknown as { connect: (...args: unknown[]) => unknown };
  const connect = proto.connect;
  proto.connect = function (this: pg.Client, ...args: unknown[]): unknown {
    live.add(this);
    this.once('end', () => live.delete(this));
    return connect.apply(this, args);
  };
}

/** The connected clients of this process to `database`, with their server process ids. */
export function trackedClients(database: string): { client: pg.Client; pid: number }[] {
  const out: { client: pg.Client; pid: number }[] = [];
  for (const client of live) {
    const pid = (client as unknown as { processID?: number | null }).processID;
    if (client.database === database && typeof pid === 'number' && pid > 0) out.push({ client, pid });
  }
  return out;
}

/** How the counters were brought up to date before a snapshot. */
export interface Flush {
  /** Connections of this process asked to flush. */
  flushed: number;
  /** Client backends in the database that were not (another process's), and whether it waited for them. */
  untracked: number;
  waitedMs: number;
}

/**
 * Brings the database's statistics up to date: every connection of this process to it flushes its pending
 * counts; when other client backends are connected to it, or the server has no `pg_stat_force_next_flush`,
 * waits {@link SETTLE_MS} for their idle flush. Call it with the cell's load stopped.
 */
export async function flushBackends(url: string): Promise<Flush> {
  const database = decodeURIComponent(new URL(url).pathname.slice(1));
  const reader = new pg.Client({ connectionString: url });
  await reader.connect();
  try {
    const { rows: v } = await reader.query<{ n: number }>("SELECT current_setting('server_version_num')::int AS n");
    const forceable = (v[0]?.n ?? 0) >= 150000;
    const ours = trackedClients(database).filter((c) => c.client !== reader);
    const flushed = new Set<number>();
    if (forceable)
      await Promise.all(
        ours.map(async ({ client, pid }) => {
          try {
            await client.query('SELECT pg_stat_force_next_flush()');
            flushed.add(pid);
          } catch {
            // The connection is closing or broken: its backend flushes as it exits.
          }
        }),
      );
    const { rows } = await reader.query<{ pid: number }>(
      "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
      [database],
    );
    const untracked = rows.filter((r) => !flushed.has(r.pid)).length;
    const wait = !forceable || untracked > 0;
    if (wait) await new Promise((r) => setTimeout(r, SETTLE_MS));
    return { flushed: flushed.size, untracked, waitedMs: wait ? SETTLE_MS : 0 };
  } finally {
    await reader.end();
  }
}

/** One table's counters (cumulative in a snapshot, per operation in a {@link PgWork}). */
export interface TableWork {
  inserted: number;
  updated: number;
  hotUpdated: number;
  deleted: number;
  /** The table's indexes, and those with a predicate (partial). */
  indexes: number;
  partialIndexes: number;
}

export interface WorkSnapshot {
  walRecords: number;
  walFpi: number;
  walBytes: number;
  /** pg_current_wal_insert_lsn() as a byte position. */
  walLsn: number;
  tables: Record<string, TableWork>;
  flush: Flush;
}

/** The counters now, after {@link flushBackends}. */
export async function workSnapshot(url: string): Promise<WorkSnapshot> {
  const flush = await flushBackends(url);
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    const wal = await c
      .query<{ records: number; fpi: number; bytes: number; lsn: number }>(
        `SELECT wal_records::float8 AS records, wal_fpi::float8 AS fpi, wal_bytes::float8 AS bytes,
                pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::float8 AS lsn
           FROM pg_stat_wal`,
      )
      .then((r) => r.rows[0])
      .catch(() => undefined); // before PostgreSQL 14, or not allowed: the WAL figures are NaN
    const { rows } = await c.query<{
      name: string;
      ins: number;
      upd: number;
      hot: number;
      del: number;
      indexes: number;
      partial: number;
    }>(
      `SELECT s.schemaname || '.' || s.relname AS name, s.n_tup_ins::float8 AS ins, s.n_tup_upd::float8 AS upd,
              s.n_tup_hot_upd::float8 AS hot, s.n_tup_del::float8 AS del,
              (SELECT count(*) FROM pg_index i WHERE i.indrelid = s.relid)::int AS indexes,
              (SELECT count(*) FROM pg_index i WHERE i.indrelid = s.relid AND i.indpred IS NOT NULL)::int AS partial
         FROM pg_stat_user_tables s`,
    );
    const tables: Record<string, TableWork> = {};
    for (const r of rows)
      tables[r.name] = {
        inserted: r.ins,
        updated: r.upd,
        hotUpdated: r.hot,
        deleted: r.del,
        indexes: r.indexes,
        partialIndexes: r.partial,
      };
    return {
      walRecords: wal?.records ?? NaN,
      walFpi: wal?.fpi ?? NaN,
      walBytes: wal?.bytes ?? NaN,
      walLsn: wal?.lsn ?? NaN,
      tables,
      flush,
    };
  } finally {
    await c.end();
  }
}

/** PostgreSQL's work per operation over a measured run. */
export interface PgWork {
  ops: number;
  walBytes: number;
  walRecords: number;
  walFpi: number;
  /** The insert LSN's advance per operation (exact, needs no flush). */
  walLsnBytes: number;
  inserted: number;
  updated: number;
  hotUpdated: number;
  deleted: number;
  /** inserted + updated + deleted. */
  rowsWritten: number;
  /** Derived, every index counted (an upper bound; see the file comment). */
  indexEntries: number;
  /** Derived, only indexes without a predicate (a lower bound). */
  indexEntriesFull: number;
  /** hotUpdated / updated; NaN without updates. */
  hotShare: number;
  /**
   * Per table (schema.table), per operation: every table of the database, so that rounds of one cell have the
   * same tables (the printed and stored forms leave out those the run did not write).
   */
  tables: Record<string, TableWork>;
  /** The run's statements by total execution time, where {@link workContext} asks for them. */
  statements?: StatementWork[];
  /** Connections flushed at the start and end, client backends not reached, and the settle waits (ms). */
  flushed: number;
  untracked: number;
  waitedMs: number;
}

/** The work between two snapshots, divided by `ops`. */
export function workDelta(before: WorkSnapshot, after: WorkSnapshot, ops: number): PgWork {
  const per = (x: number): number => x / ops;
  const tables: Record<string, TableWork> = {};
  let inserted = 0;
  let updated = 0;
  let hot = 0;
  let deleted = 0;
  let entries = 0;
  let entriesFull = 0;
  for (const [name, a] of Object.entries(after.tables)) {
    const b = before.tables[name] ?? { inserted: 0, updated: 0, hotUpdated: 0, deleted: 0 };
    const d = {
      inserted: a.inserted - b.inserted,
      updated: a.updated - b.updated,
      hotUpdated: a.hotUpdated - b.hotUpdated,
      deleted: a.deleted - b.deleted,
    };
    const versions = d.inserted + d.updated - d.hotUpdated;
    inserted += d.inserted;
    updated += d.updated;
    hot += d.hotUpdated;
    deleted += d.deleted;
    entries += versions * a.indexes;
    entriesFull += versions * (a.indexes - a.partialIndexes);
    tables[name] = {
      inserted: per(d.inserted),
      updated: per(d.updated),
      hotUpdated: per(d.hotUpdated),
      deleted: per(d.deleted),
      indexes: a.indexes,
      partialIndexes: a.partialIndexes,
    };
  }
  return {
    ops,
    walBytes: per(after.walBytes - before.walBytes),
    walRecords: per(after.walRecords - before.walRecords),
    walFpi: per(after.walFpi - before.walFpi),
    walLsnBytes: per(after.walLsn - before.walLsn),
    inserted: per(inserted),
    updated: per(updated),
    hotUpdated: per(hot),
    deleted: per(deleted),
    rowsWritten: per(inserted + updated + deleted),
    indexEntries: per(entries),
    indexEntriesFull: per(entriesFull),
    hotShare: updated === 0 ? NaN : hot / updated,
    tables,
    flushed: before.flush.flushed + after.flush.flushed,
    untracked: Math.max(before.flush.untracked, after.flush.untracked),
    waitedMs: before.flush.waitedMs + after.flush.waitedMs,
  };
}

/**
 * Set by the statements part (bench/statements.ts): a database of the server where `pg_stat_statements` is
 * installed. While set, every {@link workMeter} resets the statistics at its start (they are cluster-wide; the
 * bench runs one cell at a time) and reads the cell database's statements at its stop.
 */
export const workContext: { statementsUrl: string | null } = { statementsUrl: null };

/** One statement's totals over a measured run, per operation (`pg_stat_statements`). */
export interface StatementWork {
  query: string;
  callsPerOp: number;
  meanMs: number;
  totalMsPerOp: number;
  rowsPerOp: number;
  walBytesPerOp: number;
  sharedBlksDirtiedPerOp: number;
  /** Of all the database's statements' execution time in the run. */
  shareOfTime: number;
}

async function onStatements<T>(fn: (c: pg.Client) => Promise<T>): Promise<T | undefined> {
  if (workContext.statementsUrl === null) return undefined;
  const c = new pg.Client({ connectionString: workContext.statementsUrl });
  await c.connect();
  try {
    return await fn(c);
  } finally {
    await c.end();
  }
}

/** The cell database's statements since the last reset, by total execution time. */
async function readStatements(url: string, ops: number): Promise<StatementWork[] | undefined> {
  const database = decodeURIComponent(new URL(url).pathname.slice(1));
  return onStatements(async (c) => {
    const { rows } = await c.query<{
      query: string;
      calls: number;
      total: number;
      mean: number;
      rows: number;
      wal: number;
      dirtied: number;
    }>(
      `SELECT s.query, s.calls::float8 AS calls, s.total_exec_time AS total, s.mean_exec_time AS mean,
              s.rows::float8 AS rows, s.wal_bytes::float8 AS wal, s.shared_blks_dirtied::float8 AS dirtied
         FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
        WHERE d.datname = $1
        ORDER BY s.total_exec_time DESC`,
      [database],
    );
    const all = rows.reduce((sum, r) => sum + r.total, 0);
    return rows.map((r) => ({
      query: r.query.replace(/\s+/g, ' ').trim(),
      callsPerOp: r.calls / ops,
      meanMs: r.mean,
      totalMsPerOp: r.total / ops,
      rowsPerOp: r.rows / ops,
      walBytesPerOp: r.wal / ops,
      sharedBlksDirtiedPerOp: r.dirtied / ops,
      shareOfTime: all === 0 ? NaN : r.total / all,
    }));
  });
}

/**
 * Measures around a cell's run: `start()` after the warm-up, `stop(ops)` after the run (load stopped at both).
 * With {@link workContext} set, the result carries the run's statements too.
 */
export function workMeter(url: string): {
  start(): Promise<void>;
  stop(ops: number): Promise<PgWork>;
} {
  trackClients();
  let before: WorkSnapshot | undefined;
  return {
    async start() {
      before = await workSnapshot(url);
      await onStatements((c) => c.query('SELECT pg_stat_statements_reset()'));
    },
    async stop(ops: number) {
      if (before === undefined) throw new Error('workMeter: stop() before start()');
      // Statements are counted as they finish, with no flush to wait for: read them before the snapshot's own.
      const statements = await readStatements(url, ops);
      const work = workDelta(before, await workSnapshot(url), ops);
      return statements === undefined ? work : { ...work, statements };
    },
  };
}

/** The median of each figure over rounds (tables: each counter's median, a table missing in a round as 0). */
export function medianWork(works: PgWork[]): PgWork {
  const m = (f: (w: PgWork) => number): number => {
    const s = works.map(f).sort((a, b) => a - b);
    const mid = Math.floor(s.length / 2);
    return s.length % 2 === 1 ? (s[mid] ?? NaN) : ((s[mid - 1] ?? NaN) + (s[mid] ?? NaN)) / 2;
  };
  const names = [...new Set(works.flatMap((w) => Object.keys(w.tables)))].sort();
  const tables: Record<string, TableWork> = {};
  for (const name of names) {
    const t = (f: (x: TableWork) => number) => m((w) => (w.tables[name] === undefined ? 0 : f(w.tables[name])));
    const any = works.find((w) => w.tables[name] !== undefined)!.tables[name]!;
    tables[name] = {
      inserted: t((x) => x.inserted),
      updated: t((x) => x.updated),
      hotUpdated: t((x) => x.hotUpdated),
      deleted: t((x) => x.deleted),
      indexes: any.indexes,
      partialIndexes: any.partialIndexes,
    };
  }
  return {
    ops: m((w) => w.ops),
    walBytes: m((w) => w.walBytes),
    walRecords: m((w) => w.walRecords),
    walFpi: m((w) => w.walFpi),
    walLsnBytes: m((w) => w.walLsnBytes),
    inserted: m((w) => w.inserted),
    updated: m((w) => w.updated),
    hotUpdated: m((w) => w.hotUpdated),
    deleted: m((w) => w.deleted),
    rowsWritten: m((w) => w.rowsWritten),
    indexEntries: m((w) => w.indexEntries),
    indexEntriesFull: m((w) => w.indexEntriesFull),
    hotShare: m((w) => w.hotShare),
    tables,
    flushed: m((w) => w.flushed),
    untracked: Math.max(...works.map((w) => w.untracked)),
    waitedMs: m((w) => w.waitedMs),
  };
}

const r2 = (x: number): number | null => (Number.isFinite(x) ? Number(x.toFixed(2)) : null);

const written = (t: TableWork): boolean => t.inserted !== 0 || t.updated !== 0 || t.deleted !== 0;

/** "ins 1.00 upd 2.00 (HOT 1.00) del 1.00" per table written, the tables by rows written. */
export function tableLine(w: PgWork): string {
  return Object.entries(w.tables)
    .filter(([, t]) => written(t))
    .sort(([, a], [, b]) => b.inserted + b.updated + b.deleted - (a.inserted + a.updated + a.deleted))
    .map(
      ([name, t]) =>
        `${name} ins ${t.inserted.toFixed(2)} upd ${t.updated.toFixed(2)} (HOT ${t.hotUpdated.toFixed(2)}) del ${t.deleted.toFixed(2)}, ${t.indexes} indexes (${t.partialIndexes} partial)`,
    )
    .join('; ');
}

/** The figures as bench/results.json stores them on an entry (`pg_*` per operation; `pg_tables` per table). */
export function workJson(w: PgWork): Record<string, number | null | Record<string, Record<string, number | null>>> {
  const tables: Record<string, Record<string, number | null>> = {};
  for (const [name, t] of Object.entries(w.tables))
    if (written(t))
      tables[name] = {
        inserted: r2(t.inserted),
        updated: r2(t.updated),
        hot_updated: r2(t.hotUpdated),
        deleted: r2(t.deleted),
        indexes: t.indexes,
        partial_indexes: t.partialIndexes,
      };
  return {
    pg_wal_bytes_per_op: r2(w.walBytes),
    pg_wal_lsn_bytes_per_op: r2(w.walLsnBytes),
    pg_wal_records_per_op: r2(w.walRecords),
    pg_wal_fpi_per_op: r2(w.walFpi),
    pg_rows_inserted_per_op: r2(w.inserted),
    pg_rows_updated_per_op: r2(w.updated),
    pg_rows_hot_updated_per_op: r2(w.hotUpdated),
    pg_rows_deleted_per_op: r2(w.deleted),
    pg_rows_written_per_op: r2(w.rowsWritten),
    pg_index_entries_per_op_max: r2(w.indexEntries),
    pg_index_entries_per_op_min: r2(w.indexEntriesFull),
    pg_hot_share: r2(w.hotShare),
    pg_stats_settle_wait_ms: w.waitedMs,
    pg_tables: tables,
  };
}

/** The columns of the "PostgreSQL work per operation" table. */
export const WORK_HEADER = [
  'N',
  'system',
  'PG CPU ms/op',
  'WAL bytes/op',
  'WAL records/op',
  'full-page images/op',
  'heap rows ins / upd / del per op',
  'index entries/op (min-max)',
  'HOT share of updates',
  'PG CPU / peer',
  'WAL / peer',
  'rows / peer',
];

/** A row of that table; the ratios to the peer where `peer` is given (its own row: 1). */
export function workRow(
  n: number,
  system: string,
  pgCpuMs: number,
  w: PgWork,
  peer?: { pgCpuMs: number; work: PgWork },
): (string | number)[] {
  const f = (x: number): string => (Number.isFinite(x) ? x.toFixed(2) : '-');
  return [
    String(n),
    system,
    pgCpuMs,
    w.walBytes,
    w.walRecords,
    w.walFpi,
    `${f(w.inserted)} / ${f(w.updated)} / ${f(w.deleted)}`,
    `${f(w.indexEntriesFull)}-${f(w.indexEntries)}`,
    Number.isFinite(w.hotShare) ? f(w.hotShare) : '-',
    peer === undefined ? NaN : pgCpuMs / peer.pgCpuMs,
    peer === undefined ? NaN : w.walBytes / peer.work.walBytes,
    peer === undefined ? NaN : w.rowsWritten / peer.work.rowsWritten,
  ];
}
