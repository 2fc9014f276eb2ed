/**
 * `npm test`: one PostgreSQL for the whole run, a template database migrated once, then the compiled test files
 * (node-tap tests), two at a time (test/runner.ts; three were no faster in one run on 2 cores). Each test file
 * clones the template (`CREATE DATABASE ... TEMPLATE`), so files run in parallel without sharing rows
 * (graphile-worker's arrangement).
 *
 * With DATABASE_URL set, that server is used as it is configured (its role needs CREATEDB); otherwise an
 * embedded PostgreSQL starts in a temporary folder, without fsync, and is removed afterwards.
 *
 * The test files (and every process they start) get a folder of this run as TMPDIR, removed at the end, so the
 * temporary folders they make (configurations, certificates, data folders) do not outlive the run, even those of
 * a file killed at its timeout.
 */
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { migrate } from '../db/migrate.js';
import { quoteSchemaName } from '../config/index.js';
import { freePort } from './helpers/net.js';
import { runFiles, testFiles } from './runner.js';

async function main(): Promise<number> {
  const scratch = mkdtempSync(join(tmpdir(), 'actionledger-test-tmp-'));
  try {
    return await withScratch(scratch);
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
}

async function withScratch(scratch: string): Promise<number> {
  // Tests start clusters as the postgres user (under root) in folders below this one.
  chmodSync(scratch, 0o711);
  let adminUrl = process.env.DATABASE_URL;
  let stop = (): Promise<void> => Promise.resolve();
  if (adminUrl === undefined || adminUrl === '') {
    const { openEmbeddedDatabase } = await import('../embedded/embedded.js');
    const dir = mkdtempSync(join(tmpdir(), 'actionledger-test-'));
    chmodSync(dir, 0o711); // the postgres user (as root, a separate one) must reach the cluster folder
    const db = await openEmbeddedDatabase({ dataDir: dir, port: await freePort() });
    adminUrl = db.url;
    stop = async () => {
      await db.stop();
      rmSync(dir, { recursive: true, force: true });
    };
    process.stdout.write(`# embedded PostgreSQL in ${dir}\n`);
    // A throwaway cluster: no fsync. Commits still write their WAL before they return, so a PostgreSQL process
    // killed by a test recovers every committed row; only an operating-system crash could lose them.
    const c = new pg.Client({ connectionString: adminUrl });
    await c.connect();
    await c.query('ALTER SYSTEM SET fsync = off');
    await c.query('SELECT pg_reload_conf()');
    await c.end();
  }
  const template = `al_template_${process.pid}`;
  // Every database a test file creates starts with this run's prefix, so the ones a killed file could not drop
  // are dropped here.
  const prefix = `al_t${process.pid}_`;
  const admin = new pg.Client({ connectionString: adminUrl });
  try {
    await admin.connect();
    const { rows } = await admin.query<{ server_version: string }>('SHOW server_version');
    process.stdout.write(`# PostgreSQL ${rows[0]?.server_version ?? '?'}\n`);
    await admin.query(`DROP DATABASE IF EXISTS ${template}`);
    await admin.query(`CREATE DATABASE ${template}`);
    const tplUrl = new URL(adminUrl);
    tplUrl.pathname = `/${template}`;
    const tpl = new pg.Client({ connectionString: tplUrl.toString() });
    await tpl.connect();
    await migrate(tpl, 'actionledger', quoteSchemaName('actionledger'));
    await tpl.end();

    const args = process.argv.slice(2);
    return await runFiles({
      files: args.length > 0 ? args : testFiles('dist/test'),
      jobs: 2,
      timeoutS: 300,
      env: {
        ...process.env,
        TMPDIR: scratch,
        AL_TEST_ADMIN_URL: adminUrl,
        AL_TEST_TEMPLATE: template,
        AL_TEST_DB_PREFIX: prefix,
      },
    });
  } finally {
    const { rows: left } = await admin
      .query<{ datname: string }>('SELECT datname FROM pg_database WHERE starts_with(datname, $1)', [prefix])
      .catch(() => ({ rows: [] as { datname: string }[] }));
    for (const { datname } of left)
      await admin.query(`DROP DATABASE IF EXISTS ${datname} WITH (FORCE)`).catch(() => undefined);
    await admin.query(`DROP DATABASE IF EXISTS ${template} WITH (FORCE)`).catch(() => undefined);
    await admin.end().catch(() => undefined);
    await stop();
  }
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`${(err as Error)?.stack ?? String(err)}\n`);
    process.exit(1);
  },
);
