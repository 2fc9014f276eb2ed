import t from 'tap';
import { mkdtempSync, writeFileSync, chmodSync, statSync, readdirSync } from 'node:fs';
import { spawn } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createTestDatabase, TEST_SECRET, baseToolConfig } from '../helpers/db.js';
import { BIN, runCli, lastJson, reserveArgs } from '../helpers/cli.js';
import { freePort } from '../helpers/net.js';
import { nodeCommand } from '../helpers/node-child.js';

t.test('reserve, show and status against DATABASE_URL', async (t) => {
  const url = await createTestDatabase(t);
  const dir = mkdtempSync(join(tmpdir(), 'al-cli-'));
  const cfg = join(dir, 'config.json');
  writeFileSync(cfg, JSON.stringify({ tools: baseToolConfig }));
  const env = { DATABASE_URL: url, ACTIONLEDGER_CONFIG: cfg, ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET };

  const first = await runCli(reserveArgs('s-1'), env);
  t.equal(first.code, 0, first.stderr);
  const r = lastJson(first.stdout);
  t.match(r, {
    ok: true,
    created: true,
    status: 'pending',
    operation_id: /^[0-9a-f-]{36}$/,
    effect_key: /^v1\.k1\.[0-9a-f]{64}$/,
  });
  t.equal(first.stdout.trim().split('\n').length, 1, 'stdout carries only the result; logs go to stderr');

  const replay = lastJson(
    (await runCli(reserveArgs('s-1', '{"currency":"EUR","amount":10.0,"order_id":"o-1"}'), env)).stdout,
  );
  t.same(replay, { ...r, created: false });

  const conflict = await runCli(reserveArgs('s-1', '{"order_id":"o-1","amount":10000,"currency":"EUR"}'), env);
  t.equal(conflict.code, 1);
  t.match(lastJson(conflict.stdout), { ok: false, error: 'operation_conflict', message: /arguments/ });

  const dup = await runCli(reserveArgs('s-2', '{"amount":10,"amount":10000}'), env);
  t.equal(dup.code, 1);
  t.match(lastJson(dup.stdout), { ok: false, error: 'invalid_arguments', message: /duplicate key/ });

  const usage = await runCli(['reserve', '--tool', 'issue_refund'], env);
  t.equal(usage.code, 2, 'missing options: usage error');

  const show = await runCli(['show', String(r.operation_id), '--json'], env);
  const shown = lastJson(show.stdout) as {
    operation: { status: string; arguments_json: unknown };
    history: { to_status: string; reason: string }[];
  };
  t.equal(shown.operation.status, 'pending');
  t.same(
    shown.history.map((h) => [h.to_status, h.reason]),
    [['pending', 'reserved']],
  );
  t.match(lastJson((await runCli(['show', '00000000-0000-0000-0000-000000000000'], env)).stdout), {
    ok: false,
    error: 'not_found',
  });

  const status = lastJson((await runCli(['status', '--json'], env)).stdout) as {
    by_status: Record<string, number>;
    outbox_depth: number;
  };
  t.equal(status.by_status.pending, 1);
  t.equal(status.outbox_depth, 1);

  for (const cmd of ['migrate', 'status', 'reserve', 'show', 'start']) {
    const h = await runCli([cmd, '--help'], env);
    t.equal(h.code, 0);
    t.match(h.stdout, /usage: actionledger/);
  }
});

t.test('a real database without an effect-key secret refuses to start', async (t) => {
  const url = await createTestDatabase(t);
  const dir = mkdtempSync(join(tmpdir(), 'al-cli-'));
  const cfg = join(dir, 'config.json');
  writeFileSync(cfg, JSON.stringify({ tools: baseToolConfig }));
  const r = await runCli(reserveArgs('s-1'), { DATABASE_URL: url, ACTIONLEDGER_CONFIG: cfg });
  t.equal(r.code, 1);
  t.match(lastJson(r.stdout), { ok: false, error: 'secret_missing' });
  const bad = join(dir, 'bad.json');
  writeFileSync(
    bad,
    JSON.stringify({ tools: { x: { ...baseToolConfig.issue_refund, endpoint: 'https://X.example/' } }, extra: true }),
  );
  const b = await runCli(['migrate'], {
    DATABASE_URL: url,
    ACTIONLEDGER_CONFIG: bad,
    ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET,
  });
  t.match(lastJson(b.stdout), { ok: false, error: 'config_invalid' });
  t.match(String(lastJson(b.stdout).message), /extra[\s\S]*|canonical/);
});

t.test('embedded default: CLI commands share the running service database, never a second cluster', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'al-embedded-'));
  chmodSync(dir, 0o711);
  const cfg = join(dir, 'config.json');
  writeFileSync(
    cfg,
    JSON.stringify({
      http: { port: await freePort() },
      database: { embedded_port: await freePort() },
      tools: baseToolConfig,
    }),
  );
  const env = { ACTIONLEDGER_CONFIG: cfg, ACTIONLEDGER_DATA_DIR: join(dir, 'data'), PATH: process.env.PATH };

  // Without a running service, the CLI starts the cluster for its own run and stops it after.
  const alone = await runCli(['--verbose', ...reserveArgs('s-1')], env);
  t.equal(alone.code, 0, alone.stderr);
  t.match(alone.stderr, /"started_here":true/);
  const secret = join(dir, 'data', 'effect-key-k1.secret');
  t.equal(statSync(secret).mode & 0o777, 0o600, 'generated secret is mode 0600');
  t.match(alone.stderr, /generated a development effect-key secret/);

  const service = spawn(...nodeCommand([BIN, 'start', '--workers', '0']), { env, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  service.stdout.on('data', (c: Buffer) => (out += c.toString()));
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`service did not start: ${out}`)), 30_000);
    service.stdout.on('data', () => {
      if (out.includes('actionledger listening')) {
        clearTimeout(timer);
        resolve();
      }
    });
  });
  t.match(out, /"started_here":true/);
  t.match(out, new RegExp(`"data_dir":"${join(dir, 'data')}"`), 'the log says where the data lives');

  const shared = await runCli([...reserveArgs('s-2'), '--verbose'], env);
  t.equal(shared.code, 0, shared.stderr);
  t.match(shared.stderr, /"started_here":false/, 'connected to the running cluster');
  const quiet = await runCli(['status', '--json'], env);
  t.equal(quiet.stderr, '', 'without --verbose, no log lines when nothing is wrong');
  const status = lastJson(quiet.stdout) as { by_status: Record<string, number> };
  t.equal(status.by_status.pending, 2, 'both reservations in the one cluster');
  t.equal(readdirSync(join(dir, 'data')).filter((f) => f === 'pg').length, 1);

  service.kill('SIGTERM');
  const code = await new Promise<number | null>((resolve) => service.on('exit', resolve));
  t.equal(code, 0, 'SIGTERM: clean exit');
});
