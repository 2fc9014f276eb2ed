/**
 * A fresh database per test file, cloned from the run's migrated template (test/run.ts), plus the compiled
 * configuration and ledger that most tests need.
 */
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import type { Test } from 'tap';
import { compileConfig, type Config } from '../../config/index.js';
import { createPool, type Pool } from '../../db/db.js';
import { Secret } from '../../core/secret.js';
import { EffectKeyer, Ledger } from '../../ledger/index.js';

export const TEST_SECRET = 'test-effect-key-secret-0123456789abcdef';

function adminUrl(): string {
  const url = process.env.AL_TEST_ADMIN_URL;
  if (url === undefined) throw new Error('run the tests with `npm test` (test/run.ts sets AL_TEST_ADMIN_URL)');
  return url;
}

/** Creates a database: cloned from the migrated template, or empty with `empty: true`. Dropped at teardown. */
export async function createTestDatabase(t: Test, options: { empty?: boolean } = {}): Promise<string> {
  const name = `${process.env.AL_TEST_DB_PREFIX ?? 'al_t_'}${randomBytes(6).toString('hex')}`;
  const admin = new pg.Client({ connectionString: adminUrl() });
  await admin.connect();
  const template = options.empty === true ? 'template0' : (process.env.AL_TEST_TEMPLATE ?? '');
  // The template may be briefly busy while another file clones it; retry that one error.
  for (let i = 0; ; i++) {
    try {
      await admin.query(`CREATE DATABASE ${name} TEMPLATE ${template}`);
      break;
    } catch (err) {
      if (i > 50 || !/being accessed by other users/.test((err as Error).message)) throw err;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  await admin.end();
  t.teardown(async () => {
    const a = new pg.Client({ connectionString: adminUrl() });
    await a.connect();
    await a.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await a.end();
  });
  const url = new URL(adminUrl());
  url.pathname = `/${name}`;
  return url.toString();
}

export const baseToolConfig = {
  issue_refund: {
    provider_id: 'billing-test',
    endpoint: 'https://localhost:9443/v1/refunds',
    allowed_tenants: ['tenant-a', 'tenant-b'],
    credential_env: 'TEST_BILLING_TOKEN',
    idempotency: { mechanism: 'header', name: 'Idempotency-Key' },
    definitive_failure_statuses: [400, 422],
  },
  send_email: {
    provider_id: 'mail-test',
    endpoint: 'https://localhost:9444/v2/messages',
    allowed_tenants: ['tenant-a'],
    idempotency: { mechanism: 'header', name: 'Idempotency-Key' },
  },
};

export function testConfig(url: string, overrides: Record<string, unknown> = {}, env: NodeJS.ProcessEnv = {}): Config {
  return compileConfig(
    { tools: baseToolConfig, ...overrides },
    { DATABASE_URL: url, ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET, TEST_BILLING_TOKEN: 'token-for-tests', ...env },
  );
}

export function testKeyer(secret = TEST_SECRET, keyId = 'k1'): EffectKeyer {
  return new EffectKeyer({ active: keyId, secrets: new Map([[keyId, new Secret(Buffer.from(secret))]]) });
}

export interface LedgerFixture {
  url: string;
  config: Config;
  pool: Pool;
  ledger: Ledger;
}

/** A migrated database, its pool and a ledger over it; all closed at teardown. */
export async function ledgerFixture(t: Test, overrides: Record<string, unknown> = {}): Promise<LedgerFixture> {
  const url = await createTestDatabase(t);
  const config = testConfig(url, overrides);
  const pool = createPool(url, { max: 30, statementTimeoutMs: 30_000, applicationName: 'test' });
  const ledger = new Ledger(config, pool, testKeyer());
  t.teardown(async () => {
    ledger.stop();
    await pool.end();
  });
  return { url, config, pool, ledger };
}

export const ctx = (over: Partial<Record<string, string>> = {}) => ({
  tenant_id: 'tenant-a',
  principal_id: 'principal-1',
  task_id: 'task-1',
  workflow_step_id: 'step-1',
  approval_id: 'approval-1',
  policy_version: 'policy-1',
  ...over,
});

/**
 * Records, for every connection `pool` opens from now on, each write its socket is given (a corked socket's
 * buffered messages come as one `_writev`), as text.
 */
export function recordSocketWrites(pool: pg.Pool): string[] {
  const writes: string[] = [];
  type Chunk = { chunk: Buffer | string };
  type Stream = {
    _write(chunk: Buffer | string, encoding: string, cb: (err?: Error) => void): void;
    _writev?(chunks: Chunk[], cb: (err?: Error) => void): void;
  };
  const text = (c: Buffer | string): string => (typeof c === 'string' ? c : c.toString('latin1'));
  pool.on('connect', (client) => {
    const stream = (client as unknown as { connection: { stream: Stream } }).connection.stream;
    const write = stream._write.bind(stream);
    stream._write = (chunk, encoding, cb) => {
      writes.push(text(chunk));
      write(chunk, encoding, cb);
    };
    const writev = stream._writev?.bind(stream);
    if (writev !== undefined)
      stream._writev = (chunks, cb) => {
        writes.push(chunks.map((c) => text(c.chunk)).join(''));
        writev(chunks, cb);
      };
  });
  return writes;
}
