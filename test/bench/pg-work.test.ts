/**
 * The benchmark's PostgreSQL work counters (bench/pg-work.ts) on a real server: known statements between the
 * two snapshots give their exact row counts, HOT share and derived index entries; what ran before the first
 * snapshot on a connection that stays open is not counted; every connection of this process is reached, so no
 * settle wait is needed (PostgreSQL 15 and later). No timing is asserted.
 */
import t from 'tap';
import pg from 'pg';
import { trackClients, trackedClients, workMeter } from '../../bench/pg-work.js';
import { createTestDatabase } from '../helpers/db.js';

t.test('a delta over known writes: rows per table, HOT share, index entries; earlier writes left out', async (t) => {
  const url = await createTestDatabase(t, { empty: true });
  trackClients();
  // A pool whose connections stay open across both snapshots: their counts reach the views only when flushed.
  const pool = new pg.Pool({ connectionString: url, max: 2 });
  t.teardown(() => pool.end());
  const version = Number(
    (await pool.query<{ v: string }>("SELECT current_setting('server_version_num') AS v")).rows[0]!.v,
  );
  // `v` is in no index, so an update of it alone can be HOT; `w` is in a plain and a partial index.
  await pool.query('CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, w int NOT NULL) WITH (fillfactor = 50)');
  await pool.query('CREATE INDEX t_w_idx ON t (w)');
  await pool.query('CREATE INDEX t_w_big_idx ON t (w) WHERE w > 100');
  // Written before the measurement, on a connection that stays open.
  await pool.query('INSERT INTO t SELECT g, 0, g FROM generate_series(101, 110) g');
  await pool.query('UPDATE t SET w = w + 1 WHERE id > 105');

  const database = new URL(url).pathname.slice(1);
  t.ok(trackedClients(database).length >= 1, "the pool's connections are known");

  const meter = workMeter(url);
  await meter.start();
  await pool.query('INSERT INTO t SELECT g, 0, g FROM generate_series(1, 4) g'); // 4 inserts
  await pool.query('UPDATE t SET v = v + 1 WHERE id IN (1, 2)'); // 2 HOT updates
  await pool.query('UPDATE t SET w = 50 WHERE id = 3'); // 1 update of an indexed column: not HOT
  await pool.query('DELETE FROM t WHERE id = 4'); // 1 delete
  const w = await meter.stop(2); // as if the statements were 2 operations

  const table = w.tables['public.t'];
  t.ok(table !== undefined, 'the table is in the delta');
  t.same(
    { ...table },
    { inserted: 2, updated: 1.5, hotUpdated: 1, deleted: 0.5, indexes: 3, partialIndexes: 1 },
    'per operation: the 4 inserts, 3 updates (2 HOT) and 1 delete of the measured run only',
  );
  t.equal(w.rowsWritten, 4, '(4 + 3 + 1) / 2');
  t.equal(w.hotShare, 2 / 3, 'two of the three updates were HOT');
  // 4 inserts + 1 non-HOT update = 5 new row versions: 3 index entries each at most, 2 (no predicate) at least.
  t.equal(w.indexEntries, 7.5, 'every index counted: 5 * 3 / 2');
  t.equal(w.indexEntriesFull, 5, 'indexes without a predicate: 5 * 2 / 2');
  t.ok(w.walBytes > 0 && w.walLsnBytes > 0 && w.walRecords > 0, 'WAL was written');
  if (version >= 150000) t.equal(w.waitedMs, 0, 'every backend of the database was flushed; no settle wait');
});
