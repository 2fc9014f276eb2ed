/**
 * A REAL full disk under `actionledger start`: the test's database lives in a PostgreSQL tablespace on a small
 * tmpfs, and a filler file takes the rest of it. Then `/readyz` is 503 `storage_full` (found by the write probe,
 * with no traffic), `actionledger_database_writable` is 0 with that reason, a reservation over HTTP is 503
 * `storage_full` with Retry-After, and `/healthz` stays 200 (liveness). The filler deleted, `/readyz` is 200 again
 * by itself, with no restart, and the same reservation goes through.
 *
 * Mounting a tmpfs needs root; as another user the test is skipped, saying so.
 */
import t from 'tap';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chownSync, closeSync, mkdirSync, mkdtempSync, openSync, rmSync, writeSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { createPool } from '../../db/db.js';
import { createLogger } from '../../core/log.js';
import { Metrics } from '../../core/metrics.js';
import { AuditWriter } from '../../gate/index.js';
import { PrincipalStore } from '../../principals/index.js';
import { BIN } from '../helpers/cli.js';
import { baseToolConfig, TEST_SECRET, testConfig } from '../helpers/db.js';
import { spawnService, type ServiceProcess } from '../helpers/fleet.js';
import { freePort } from '../helpers/net.js';
import { request } from '../helpers/api.js';

const isRoot = process.getuid?.() === 0;

/** The OS user the embedded cluster runs as under root (test/run.ts); it must own the tablespace folder. */
function postgresIds(): { uid: number; gid: number } {
  const id = (flag: string) => Number(execFileSync('id', [flag, 'postgres']).toString().trim());
  return { uid: id('-u'), gid: id('-g') };
}

async function admin<T>(fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const c = new pg.Client({ connectionString: process.env.AL_TEST_ADMIN_URL });
  await c.connect();
  try {
    return await fn(c);
  } finally {
    await c.end();
  }
}

/** Writes zeros into `path` until the file system is full; returns the bytes written. */
function fill(path: string): number {
  const fd = openSync(path, 'w');
  const chunk = Buffer.alloc(1 << 20);
  let written = 0;
  try {
    for (;;) {
      const n = writeSync(fd, chunk);
      written += n;
      if (n < chunk.length) break;
    }
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOSPC') throw err;
  } finally {
    closeSync(fd);
  }
  return written;
}

t.test(
  'a full disk: readyz 503 storage_full, the API 503; space freed: ready again without a restart',
  { skip: isRoot ? false : 'mounting a tmpfs for a real full disk needs root' },
  async (t) => {
    const mount = mkdtempSync(join(tmpdir(), 'al-full-disk-'));
    const { uid, gid } = postgresIds();
    execFileSync('mount', ['-t', 'tmpfs', '-o', `size=64m,mode=0700,uid=${uid},gid=${gid}`, 'tmpfs', mount]);
    const suffix = randomBytes(4).toString('hex');
    const space = `al_full_${suffix}`;
    const db = `al_full_db_${suffix}`;
    const filler = join(mount, 'filler');
    // Set once the service is spawned; the teardown below is registered before, to run after it.
    const running: { service?: ServiceProcess } = {};
    // Reverse order: the service, the database, the tablespace, the mount.
    t.teardown(async () => {
      const { service } = running;
      await service?.killGroup();
      rmSync(filler, { force: true });
      await admin(async (c) => {
        await c.query(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`);
        await c.query(`DROP TABLESPACE IF EXISTS ${space}`);
      });
      execFileSync('umount', [mount]);
      rmSync(mount, { recursive: true, force: true });
    });

    const location = join(mount, 'tablespace');
    mkdirSync(location);
    chownSync(location, uid, gid);
    await admin(async (c) => {
      await c.query(`CREATE TABLESPACE ${space} LOCATION '${location}'`);
      await c.query(`CREATE DATABASE ${db} TEMPLATE ${process.env.AL_TEST_TEMPLATE ?? ''} TABLESPACE ${space}`);
    });
    const url = new URL(process.env.AL_TEST_ADMIN_URL ?? '');
    url.pathname = `/${db}`;

    // A principal allowed direct reservations, and its token, made through the real store before the disk fills.
    const overrides = { api: { permissions: { reserve: ['service'] } } };
    const config = testConfig(url.toString(), overrides);
    const pool = createPool(url.toString(), { max: 2, statementTimeoutMs: 30_000, applicationName: 'test' });
    const log = createLogger({ level: 'silent', name: 'test' });
    const store = new PrincipalStore(
      config,
      pool,
      new AuditWriter({ config, pool, log, metrics: new Metrics({ defaultMetrics: false }) }),
    );
    await store.add('svc-1', 'service', 'svc-1', 'test');
    await store.grant('svc-1', 'tenant-a', 'service', 'test');
    const token = (await store.createToken('svc-1', 'tenant-a', 'test', 1, 'test')).token;
    await pool.end();

    const dir = mkdtempSync(join(tmpdir(), 'al-full-disk-cfg-'));
    t.teardown(() => rmSync(dir, { recursive: true, force: true }));
    const port = await freePort();
    writeFileSync(
      join(dir, 'config.json'),
      JSON.stringify({
        tools: baseToolConfig,
        ...overrides,
        http: { host: '127.0.0.1', port, write_probe_interval_ms: 200 },
        reconciler: { enabled: false },
      }),
    );
    const service = spawnService(BIN, ['--workers', '0'], {
      ACTIONLEDGER_CONFIG: join(dir, 'config.json'),
      ACTIONLEDGER_DATA_DIR: join(dir, 'data'),
      DATABASE_URL: url.toString(),
      ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET,
      TEST_BILLING_TOKEN: 'token-for-tests',
      LOG_LEVEL: 'info',
    });
    running.service = service;
    await service.waitFor(/actionledger listening/);
    const base = `http://127.0.0.1:${port}`;
    const get = (path: string) => request(base, 'GET', path);
    // A reservation whose arguments are large and random: stored out of line, they need new pages of their own.
    const reserve = (step: string) =>
      request(base, 'POST', '/v1/operations', {
        token,
        body: {
          tool: 'issue_refund',
          arguments: { order_id: 'o-1', amount: 10, currency: 'EUR', note: randomBytes(16_384).toString('base64') },
          task_id: 'task-disk',
          workflow_step_id: step,
          approval_id: 'approval-1',
          policy_version: 'policy-1',
        },
      });
    const until = async (what: () => Promise<boolean>) => {
      const deadline = Date.now() + 30_000;
      while (!(await what()) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
    };

    t.match(await get('/readyz'), { status: 200, body: { ok: true } }, 'ready before the disk fills');
    t.match((await get('/metrics')).text, /actionledger_database_writable\{reason=""\} 1/);

    const filled = fill(filler);
    t.ok(filled > 0, `the tmpfs is full (filler of ${filled} bytes)`);
    await until(async () => (await get('/readyz')).status === 503);
    const ready = await get('/readyz');
    t.match(
      ready,
      { status: 503, body: { ok: false, error: 'storage_full', details: { sqlstate: '53100' } } },
      'not ready, found by the write probe alone',
    );
    t.equal((await get('/healthz')).status, 200, 'still live: a restart frees no disk');
    t.match((await get('/metrics')).text, /actionledger_database_writable\{reason="storage_full"\} 0/);
    const refused = await reserve('s-1');
    t.equal(refused.status, 503, refused.text);
    t.match(refused.body, { ok: false, error: 'storage_full', retry_after_s: 1 });
    t.equal(refused.headers.get('retry-after'), '1');

    rmSync(filler);
    await until(async () => (await get('/readyz')).status === 200);
    t.match(await get('/readyz'), { status: 200, body: { ok: true } }, 'ready again by itself');
    t.match((await get('/metrics')).text, /actionledger_database_writable\{reason=""\} 1/);
    t.match(
      await reserve('s-1'),
      { status: 200, body: { ok: true, created: true } },
      'the same reservation goes through',
    );
    t.ok(service.exited !== undefined && !/start failed/.test(service.stdout()), 'the same process throughout');
    t.match(service.stdout(), /the database refuses writes/);
    t.match(service.stdout(), /the database takes writes again/);
  },
);
