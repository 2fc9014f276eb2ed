/**
 * The newcomer's path, end to end with real processes: `actionledger start` on the shipped example
 * configuration (embedded PostgreSQL, the development sandbox over mTLS, two dispatcher workers, the reconcile
 * schedule), then the CLI: reserve, watch it succeed, reconcile, verify, metrics, SIGTERM.
 */
import t from 'tap';
import { chmodSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { spawn } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BIN, lastJson, runCli } from '../helpers/cli.js';

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

t.test(
  'npm start on the example config: reserve with the CLI and watch it succeed; reconcile; verify; SIGTERM',
  async (t) => {
    const dir = mkdtempSync(join(tmpdir(), 'al-fleet-'));
    chmodSync(dir, 0o711);
    const [http, pg, provider, authorizer] = [await freePort(), await freePort(), await freePort(), await freePort()];
    const example = readFileSync(
      join(import.meta.dirname, '..', '..', '..', 'actionledger.config.json'),
      'utf8',
    ).replaceAll(':7443/', `:${provider}/`);
    const cfg = JSON.parse(example) as Record<string, Record<string, unknown>>;
    cfg.http = { host: '127.0.0.1', port: http };
    cfg.database = { embedded_port: pg };
    cfg.sandbox = { enabled: true, provider_port: provider, authorizer_port: authorizer };
    writeFileSync(join(dir, 'config.json'), JSON.stringify(cfg));
    const env = {
      PATH: process.env.PATH,
      ACTIONLEDGER_CONFIG: join(dir, 'config.json'),
      ACTIONLEDGER_DATA_DIR: join(dir, 'data'),
    };

    const service = spawn(process.execPath, [BIN, 'start', '--workers', '2'], {
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let log = '';
    service.stdout.on('data', (c: Buffer) => (log += c.toString()));
    service.stderr.on('data', (c: Buffer) => (log += c.toString()));
    const exited = new Promise<number | null>((resolve) => service.once('exit', (code) => resolve(code)));
    t.teardown(() => void service.kill('SIGKILL'));
    const deadline = Date.now() + 60_000;
    while (!log.includes('actionledger listening') && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 100));
    t.match(log, /actionledger listening/, 'the fleet started');
    t.match(log, /reconciliation scheduled/);

    const reserve = await runCli(
      [
        'reserve',
        '--tenant',
        'tenant-a',
        '--principal',
        'agent-7',
        '--task',
        'order-1',
        '--step',
        'refund',
        '--approval',
        'appr-1',
        '--policy',
        'v3',
        '--tool',
        'issue_refund',
        '--args',
        '{"order_id":"o-1","amount":1250,"currency":"EUR"}',
      ],
      env,
    );
    t.equal(reserve.code, 0, reserve.stderr);
    const id = String(lastJson(reserve.stdout).operation_id);
    let shown: Record<string, unknown> = {};
    while (Date.now() < deadline) {
      shown = lastJson((await runCli(['show', id, '--json'], env)).stdout);
      if ((shown.operation as { status?: string } | undefined)?.status === 'succeeded') break;
      await new Promise((r) => setTimeout(r, 200));
    }
    t.match(
      shown,
      { ok: true, operation: { status: 'succeeded', provider_receipt: /^op_/ } },
      'dispatched through the sandbox over mTLS',
    );

    const rec = await runCli(['reconcile', '--once', '--json'], env);
    t.equal(rec.code, 0, rec.stderr);
    t.match(
      lastJson(rec.stdout),
      { ok: true, reconcile: { examined: 0 }, gate: { approvals_expired: 0, proposals_expired: 0 } },
      'the pass also ran the gate housekeeping',
    );
    const verify = await runCli(['verify', '--json'], env);
    t.equal(verify.code, 0, verify.stdout);
    t.match(lastJson(verify.stdout), { ok: true, operations: 1, listings: 1, provider_effects: 1 });

    const metrics = await (await fetch(`http://127.0.0.1:${http}/metrics`)).text();
    t.match(
      metrics,
      /actionledger_dispatch_outcomes_total\{tool="issue_refund",provider="sandbox-billing",outcome="succeeded",worker="[12]"\} 1/,
      'worker metrics, aggregated, labelled by worker slot',
    );
    for (const worker of ['1', '2'])
      t.match(
        metrics,
        new RegExp(`actionledger_claims_total\\{worker="${worker}"\\} \\d`),
        `worker ${worker}'s claims`,
      );
    t.match(metrics, /actionledger_process_cpu_user_seconds_total\{worker="1"\}/, 'process metrics, one prefix');
    t.notMatch(metrics, /actionledger_process_process_/, 'no doubled prefix');
    t.match(metrics, /actionledger_reconcile_pass_duration_seconds/, 'reconciler metrics from the parent');
    t.match(metrics, /actionledger_operations\{status="succeeded"\} 1/);

    service.kill('SIGTERM');
    t.equal(await exited, 0, 'SIGTERM: exit 0');
  },
);
