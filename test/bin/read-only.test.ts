import t, { type Test } from 'tap';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { createTestDatabase, TEST_SECRET, baseToolConfig } from '../helpers/db.js';
import { runCli, lastJson, reserveArgs } from '../helpers/cli.js';

function configFile(): string {
  const cfg = join(mkdtempSync(join(tmpdir(), 'al-ro-')), 'config.json');
  writeFileSync(cfg, JSON.stringify({ tools: baseToolConfig }));
  return cfg;
}

/** A login role that may read the schema's tables and nothing else; dropped at teardown. */
async function readerUrl(t: Test, url: string, grant: { schema?: boolean } = {}): Promise<string> {
  const role = `al_reader_${randomBytes(4).toString('hex')}`;
  const password = randomBytes(12).toString('hex');
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  await admin.query(`CREATE ROLE ${role} LOGIN PASSWORD '${password}'`);
  if (grant.schema !== false) {
    await admin.query(`GRANT USAGE ON SCHEMA actionledger TO ${role}`);
    await admin.query(`GRANT SELECT ON ALL TABLES IN SCHEMA actionledger TO ${role}`);
  }
  await admin.end();
  // Registered after the database's teardown, so it runs after the database (and the grants in it) are gone.
  t.teardown(async () => {
    const a = new pg.Client({ connectionString: url.replace(/\/[^/]*$/, '/postgres') });
    await a.connect();
    await a.query(`DROP ROLE IF EXISTS ${role}`).catch(() => undefined);
    await a.end();
  });
  const u = new URL(url);
  u.username = role;
  u.password = password;
  return u.toString();
}

t.test(
  'status, show, review list, kill-switch list, principal and token list, verify run under a role that may only SELECT',
  async (t) => {
    const url = await createTestDatabase(t);
    const cfg = configFile();
    const writer = { DATABASE_URL: url, ACTIONLEDGER_CONFIG: cfg, ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET };
    const reserved = await runCli(reserveArgs('s-1'), writer);
    t.equal(reserved.code, 0, reserved.stderr);
    const id = String(lastJson(reserved.stdout).operation_id);

    // No effect-key secret either: reading the ledger mints nothing.
    const reader = { DATABASE_URL: await readerUrl(t, url), ACTIONLEDGER_CONFIG: cfg };
    const status = await runCli(['status', '--json'], reader);
    t.equal(status.code, 0, status.stdout + status.stderr);
    t.match(lastJson(status.stdout), { ok: true, by_status: { pending: 1 } });
    const show = await runCli(['show', id, '--json'], reader);
    t.equal(show.code, 0, show.stdout + show.stderr);
    t.match(lastJson(show.stdout), { ok: true, operation: { operation_id: id, status: 'pending' } });

    const listed = await runCli(['review', 'list', '--json'], reader);
    t.equal(listed.code, 0, listed.stdout + listed.stderr);
    t.match(lastJson(listed.stdout), { ok: true, operations: [], total: 0 });
    const switches = await runCli(['gate', 'kill-switch', 'list', '--json'], reader);
    t.equal(switches.code, 0, switches.stdout + switches.stderr);
    t.same(lastJson(switches.stdout), { ok: true, kill_switches: [] });
    const principals = await runCli(['principal', 'list', '--json'], reader);
    t.equal(principals.code, 0, principals.stdout + principals.stderr);
    t.same(lastJson(principals.stdout), { ok: true, principals: [] });
    const tokens = await runCli(['token', 'list', '--json'], reader);
    t.equal(tokens.code, 0, tokens.stdout + tokens.stderr);
    t.same(lastJson(tokens.stdout), { ok: true, tokens: [] });
    // verify checks every effect key, so it reads the secret; it still writes nothing.
    const verified = await runCli(['verify', '--json'], { ...reader, ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET });
    t.equal(verified.code, 0, verified.stdout + verified.stderr);
    t.match(lastJson(verified.stdout), { ok: true, operations: 1, discrepancies: [] });

    // A role that may not even read the schema: every read-only command refuses in one JSON line, never a stack.
    const stranger = { DATABASE_URL: await readerUrl(t, url, { schema: false }), ACTIONLEDGER_CONFIG: cfg };
    for (const argv of [['status'], ['show', id], ['review', 'list'], ['gate', 'kill-switch', 'list'], ['verify']]) {
      const r = await runCli(argv, { ...stranger, ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET });
      t.equal(r.code, 1, argv.join(' '));
      t.match(
        lastJson(r.stdout),
        { ok: false, error: 'database_error', details: { sqlstate: '42501' } },
        argv.join(' '),
      );
      t.notMatch(r.stderr, /\n\s+at /, `${argv.join(' ')}: no stack trace`);
    }

    const migrate = await runCli(['migrate'], reader);
    t.equal(migrate.code, 1, 'the reader cannot migrate: the fence is the role, not the command');
  },
);

t.test('a read-only command on a schema behind sql/ refuses and creates nothing', async (t) => {
  const url = await createTestDatabase(t, { empty: true });
  const env = { DATABASE_URL: url, ACTIONLEDGER_CONFIG: configFile() };
  for (const argv of [['status'], ['show', '6f1c2b9e-0d4a-4c52-9a57-3e0f1b2c4d5e'], ['review', 'list']]) {
    const r = await runCli(argv, env);
    t.equal(r.code, 1, argv.join(' '));
    t.match(lastJson(r.stdout), {
      ok: false,
      error: 'schema_not_migrated',
      message: /actionledger migrate/,
      details: { applied: 0, expected: Number },
    });
  }
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  const { rows } = await c.query("SELECT 1 FROM pg_namespace WHERE nspname = 'actionledger'");
  await c.end();
  t.equal(rows.length, 0, 'no schema was created');

  const migrated = await runCli(['migrate'], env);
  t.equal(migrated.code, 0, migrated.stderr);
  t.equal((await runCli(['status'], env)).code, 0, 'after migrate, status runs');
});
