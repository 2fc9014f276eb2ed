import t from 'tap';
import { mkdtempSync, writeFileSync, cpSync, appendFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { createTestDatabase, TEST_SECRET, baseToolConfig } from '../helpers/db.js';
import { runCli, lastJson } from '../helpers/cli.js';
import { defaultMigrationsDir, migrate, readMigrations } from '../../db/migrate.js';

function writeConfig(dir: string, schema = 'actionledger'): string {
  const path = join(dir, 'config.json');
  writeFileSync(path, JSON.stringify({ schema, tools: baseToolConfig }));
  return path;
}

t.test('ten processes running migrate at once apply each migration exactly once', async (t) => {
  const url = await createTestDatabase(t, { empty: true });
  const dir = mkdtempSync(join(tmpdir(), 'al-migrate-'));
  const env = {
    DATABASE_URL: url,
    ACTIONLEDGER_CONFIG: writeConfig(dir, 'ledger_ten'),
    ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET,
  };
  const results = await Promise.all(Array.from({ length: 10 }, () => runCli(['migrate'], env)));
  for (const r of results) t.same(lastJson(r.stdout), { ok: true }, `exit ${r.code} ${r.stderr.slice(0, 200)}`);
  const c = new pg.Client({ connectionString: url });
  // The database is dropped WITH (FORCE) at teardown: a connection still open then gets an 'error' event.
  c.on('error', () => undefined);
  await c.connect();
  const { rows } = await c.query<{ version: number; n: string }>(
    'SELECT version, count(*) OVER (PARTITION BY version) AS n FROM ledger_ten.schema_migrations ORDER BY version',
  );
  t.same(
    rows.map((r) => r.version),
    readMigrations().map((m) => m.version),
    'every migration recorded',
  );
  t.ok(
    rows.every((r) => r.n === '1'),
    'each exactly once',
  );
  const tables = await c.query(`SELECT count(*)::int AS n FROM pg_tables WHERE schemaname = 'ledger_ten'`);
  t.ok((tables.rows[0] as { n: number }).n >= 5);
  await c.end();
});

t.test('edited, removed and out-of-order history is refused and nothing is applied', async (t) => {
  const url = await createTestDatabase(t, { empty: true });
  const c = new pg.Client({ connectionString: url });
  // The database is dropped WITH (FORCE) at teardown: a connection still open then gets an 'error' event.
  c.on('error', () => undefined);
  await c.connect();
  t.teardown(() => c.end());
  const real = readMigrations();
  await migrate(c, 'hist', '"hist"', real);
  const again = await migrate(c, 'hist', '"hist"', real);
  t.same(again.applied, [], 'nothing left to apply');

  const dir = mkdtempSync(join(tmpdir(), 'al-sql-'));
  cpSync(defaultMigrationsDir(), dir, { recursive: true });
  appendFileSync(
    join(dir, real[0]!.version.toString().padStart(4, '0') + '_' + real[0]!.name + '.sql'),
    '\n-- edited\n',
  );
  await t.rejects(
    migrate(c, 'hist', '"hist"', readMigrations(dir)),
    { code: 'migration_history_mismatch' },
    'edited file',
  );
  await t.rejects(
    migrate(c, 'hist', '"hist"', real.slice(0, -1).length === 0 ? [] : real.slice(0, -1)),
    { code: 'migration_history_mismatch' },
    'removed file',
  );

  const gap = mkdtempSync(join(tmpdir(), 'al-sql-gap-'));
  writeFileSync(join(gap, '0001_a.sql'), 'SELECT 1;');
  writeFileSync(join(gap, '0003_c.sql'), 'SELECT 1;');
  t.throws(() => readMigrations(gap), { code: 'migration_history_mismatch' }, 'a gap in numbering');

  const renamed = real.map((m, i) => (i === 0 ? { ...m, name: 'renamed' } : m));
  await t.rejects(migrate(c, 'hist', '"hist"', renamed), { code: 'migration_history_mismatch' }, 'renamed file');

  const extra = [...real, { version: real.length + 1, name: 'broken', sql: 'CREATE TABLE x (; ', sha256: 'x' }];
  await t.rejects(
    migrate(c, 'hist', '"hist"', extra),
    /migration .*broken.* failed/,
    'a failing migration names itself',
  );
  const { rows } = await c.query('SELECT count(*)::int AS n FROM hist.schema_migrations');
  t.equal((rows[0] as { n: number }).n, real.length, 'the failed one rolled back and is not recorded');
});

t.test('a migration renamed with its content unchanged is accepted under its old recorded name', async (t) => {
  const url = await createTestDatabase(t, { empty: true });
  const c = new pg.Client({ connectionString: url });
  // The database is dropped WITH (FORCE) at teardown: a connection still open then gets an 'error' event.
  c.on('error', () => undefined);
  await c.connect();
  t.teardown(() => c.end());
  const real = readMigrations();
  t.equal(real[4]?.name, 'gate_caps_keyed_without_currency', 'version 5 is the file under its new name');
  await migrate(c, 'renames', '"renames"', real);
  const names = async (): Promise<string[]> =>
    (await c.query<{ name: string }>('SELECT name FROM renames.schema_migrations ORDER BY version')).rows.map(
      (r) => r.name,
    );
  const recorded = await names();

  // A database migrated before the rename recorded version 5 under its old name.
  await c.query(`UPDATE renames.schema_migrations SET name = 'gate_fixes' WHERE version = 5`);
  const again = await migrate(c, 'renames', '"renames"', real);
  t.same(again.applied, [], 'nothing applied again');
  t.same(await names(), recorded, 'the recorded name is now the new one');

  // The rename table covers only that name, that version and that content.
  await c.query(`UPDATE renames.schema_migrations SET name = 'gate_fixes_2' WHERE version = 5`);
  await t.rejects(migrate(c, 'renames', '"renames"', real), { code: 'migration_history_mismatch' }, 'another name');
  await c.query(`UPDATE renames.schema_migrations SET name = 'gate_fixes', sha256 = 'x' WHERE version = 5`);
  await t.rejects(migrate(c, 'renames', '"renames"', real), { code: 'migration_history_mismatch' }, 'other content');
  const { rows } = await c.query<{ name: string }>('SELECT name FROM renames.schema_migrations WHERE version = 5');
  t.equal(rows[0]?.name, 'gate_fixes', 'a refused history is left as it was');
  await c.query(`UPDATE renames.schema_migrations SET name = 'gate_fixes', sha256 = $1 WHERE version = 5`, [
    real[4]!.sha256,
  ]);
  await c.query(`UPDATE renames.schema_migrations SET name = 'gate_fixes' WHERE version = 4`);
  await t.rejects(
    migrate(c, 'renames', '"renames"', real),
    { code: 'migration_history_mismatch' },
    'the old name under another version',
  );
});

t.test('the trace context bound is added without scanning the operations table (NOT VALID)', async (t) => {
  const url = await createTestDatabase(t, { empty: true });
  const c = new pg.Client({ connectionString: url });
  c.on('error', () => undefined);
  await c.connect();
  t.teardown(() => c.end());
  await migrate(c, 'bound', '"bound"', readMigrations());
  const { rows } = await c.query<{ validated: boolean; def: string }>(
    `SELECT convalidated AS validated, pg_get_constraintdef(oid) AS def FROM pg_constraint
      WHERE conname = 'operations_trace_context_bounded' AND conrelid = 'bound.operations'::regclass`,
  );
  t.equal(rows.length, 1, 'the bound exists');
  t.equal(rows[0]?.validated, false, 'added NOT VALID: existing rows (all NULL) are not scanned');
  t.match(rows[0]?.def, /octet_length\(trace_context\) <= 1024/);
  t.match(rows[0]?.def, /NOT VALID/);
});
