/**
 * Forward-only migrations: numbered `.sql` files in `sql/`, applied in order, each in its own transaction,
 * under a session advisory lock so any number of processes starting at once apply each file exactly once.
 *
 * History is checked before anything is applied: every applied version must still exist with the same name
 * and sha256, and applied versions must be exactly the first N files. Edited, removed, renamed or
 * out-of-order history refuses with `migration_history_mismatch` and applies nothing. The one exception is
 * {@link RENAMED_MIGRATIONS}: a file renamed with its content unchanged (same sha256) is accepted under its old
 * recorded name, and the record is updated to the new name.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { ActionLedgerError } from '../core/errors.js';
import { sha256Hex } from '../core/json.js';

export interface Migration {
  version: number;
  name: string;
  sql: string;
  sha256: string;
}

const FILE = /^(\d{4})_([a-z0-9_]+)\.sql$/;

/** Migration files renamed after release, content unchanged: an applied version recorded as `from` is `to`. */
export const RENAMED_MIGRATIONS: readonly { version: number; from: string; to: string }[] = [
  { version: 5, from: 'gate_fixes', to: 'gate_caps_keyed_without_currency' },
];

/** Whether an applied row recorded as `recorded` is the file `file` under a name listed in RENAMED_MIGRATIONS. */
function isRename(file: Migration, recorded: { version: number; name: string; sha256: string }): boolean {
  return (
    file.sha256 === recorded.sha256 &&
    RENAMED_MIGRATIONS.some((r) => r.version === recorded.version && r.from === recorded.name && r.to === file.name)
  );
}

/** The repository's `sql/` folder, found from this module (works from `dist/` and from source). */
export function defaultMigrationsDir(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 4; i++) {
    try {
      if (readdirSync(join(dir, 'sql')).some((f) => FILE.test(f))) return join(dir, 'sql');
    } catch {
      // keep walking up
    }
    dir = dirname(dir);
  }
  throw new Error('cannot find the sql/ migrations folder');
}

export function readMigrations(dir = defaultMigrationsDir()): Migration[] {
  const files = readdirSync(dir)
    .filter((f) => f.endsWith('.sql'))
    .sort();
  return files.map((file, i) => {
    const m = FILE.exec(file);
    if (m === null)
      throw new ActionLedgerError('migration_history_mismatch', `migration file name ${file} is not NNNN_name.sql`);
    const version = Number(m[1]);
    if (version !== i + 1)
      throw new ActionLedgerError(
        'migration_history_mismatch',
        `migration ${file} breaks the numbering: expected ${String(i + 1).padStart(4, '0')}`,
      );
    const sql = readFileSync(join(dir, file), 'utf8');
    return { version, name: m[2] ?? '', sql, sha256: sha256Hex(sql) };
  });
}

export interface MigrateResult {
  applied: number[];
  current: number;
}

/**
 * Applies pending migrations to `schemaQuoted`. Returns the versions this call applied (empty when another
 * process got there first). Throws `migration_history_mismatch`; SQL errors propagate with the file named.
 */
export async function migrate(
  client: pg.ClientBase,
  schema: string,
  schemaQuoted: string,
  migrations: Migration[] = readMigrations(),
): Promise<MigrateResult> {
  // One lock key per schema: two schemas in one database migrate independently.
  await client.query('SELECT pg_advisory_lock(hashtextextended($1, 0))', [`actionledger:migrate:${schema}`]);
  try {
    await client.query(`CREATE SCHEMA IF NOT EXISTS ${schemaQuoted}`);
    await client.query(
      `CREATE TABLE IF NOT EXISTS ${schemaQuoted}.schema_migrations (
         version integer PRIMARY KEY,
         name text NOT NULL,
         sha256 text NOT NULL,
         applied_at timestamptz NOT NULL DEFAULT now()
       )`,
    );
    const { rows } = await client.query<AppliedRow>(
      `SELECT version, name, sha256 FROM ${schemaQuoted}.schema_migrations ORDER BY version`,
    );
    const renamed = checkHistory(rows, migrations);
    // Only after the whole history checked out: record the renamed files' new names.
    for (const file of renamed)
      await client.query(`UPDATE ${schemaQuoted}.schema_migrations SET name = $2 WHERE version = $1`, [
        file.version,
        file.name,
      ]);
    const applied: number[] = [];
    for (const m of migrations.slice(rows.length)) {
      await client.query('BEGIN');
      try {
        await client.query(`SET LOCAL search_path TO ${schemaQuoted}`);
        await client.query(m.sql);
        await client.query(
          `INSERT INTO ${schemaQuoted}.schema_migrations (version, name, sha256) VALUES ($1, $2, $3)`,
          [m.version, m.name, m.sha256],
        );
        await client.query('COMMIT');
      } catch (err) {
        await client.query('ROLLBACK').catch(() => undefined);
        throw new Error(`migration ${m.version}_${m.name}.sql failed: ${(err as Error).message}`, { cause: err });
      }
      applied.push(m.version);
    }
    return { applied, current: migrations.length };
  } finally {
    await client
      .query('SELECT pg_advisory_unlock(hashtextextended($1, 0))', [`actionledger:migrate:${schema}`])
      .catch(() => undefined);
  }
}

interface AppliedRow {
  version: number;
  name: string;
  sha256: string;
}

/**
 * Checks the applied history against the files (each applied row is the file of its number, unedited) and
 * returns the files applied under a name listed in {@link RENAMED_MIGRATIONS}. Throws `migration_history_mismatch`.
 */
function checkHistory(rows: AppliedRow[], migrations: Migration[]): Migration[] {
  const renamed: Migration[] = [];
  rows.forEach((row, i) => {
    const file = migrations[i];
    if (row.version !== i + 1) throw mismatch(`applied history has version ${row.version} where ${i + 1} was expected`);
    if (file === undefined) throw mismatch(`database has migration ${row.version} (${row.name}) that sql/ does not`);
    if (isRename(file, row)) renamed.push(file);
    else if (file.name !== row.name || file.sha256 !== row.sha256) {
      throw mismatch(`migration ${row.version} (${row.name}) was edited after it was applied`);
    }
  });
  return renamed;
}

/**
 * For read-only commands: checks, without writing or locking anything, that `schemaQuoted` holds exactly the
 * migrations in `sql/`. Throws `schema_not_migrated` (missing or behind: run `actionledger migrate`) or
 * `migration_history_mismatch`. A migration applied under its old name (RENAMED_MIGRATIONS) counts as applied.
 */
export async function checkMigrated(
  client: pg.ClientBase,
  schemaQuoted: string,
  migrations: Migration[] = readMigrations(),
): Promise<void> {
  const { rows: exists } = await client.query<{ table: string | null }>('SELECT to_regclass($1)::text AS table', [
    `${schemaQuoted}.schema_migrations`,
  ]);
  const applied =
    exists[0]?.table == null
      ? []
      : (
          await client.query<AppliedRow>(
            `SELECT version, name, sha256 FROM ${schemaQuoted}.schema_migrations ORDER BY version`,
          )
        ).rows;
  checkHistory(applied, migrations);
  if (applied.length < migrations.length) {
    throw new ActionLedgerError(
      'schema_not_migrated',
      `the database schema has ${applied.length} of ${migrations.length} migrations: run \`actionledger migrate\` (or start the service) with a role that may change the schema`,
      { details: { applied: applied.length, expected: migrations.length } },
    );
  }
}

function mismatch(message: string): ActionLedgerError {
  return new ActionLedgerError('migration_history_mismatch', `${message}; refusing to migrate`);
}
