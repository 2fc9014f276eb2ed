/**
 * The newcomer's path, end to end with real processes: `actionledger start` on the shipped example
 * configuration (embedded PostgreSQL, the development sandbox over mTLS, two dispatcher workers, the reconcile
 * schedule), then the README's quick start with the CLI: a call through the gate that is reserved and succeeds,
 * one held for an approval that a supervisor approves and that succeeds, a direct reservation the example
 * configuration denies at dispatch; then reconcile, verify, metrics, SIGTERM.
 */
import t from 'tap';
import { chmodSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { spawn } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BIN, lastJson, runCli } from '../helpers/cli.js';
import { freePort } from '../helpers/net.js';

t.test(
  'npm start on the example config: gate call, an approval, a denied direct reservation; reconcile; verify; SIGTERM',
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

    const agent = (task: string): string[] => [
      ...['gate', 'call', '--tenant', 'tenant-a', '--principal', 'agent-7', '--role', 'agent', '--account', 'acct-1'],
      ...['--task', task, '--step', '1', '--tool', 'issue_refund'],
    ];
    /** The operation's row once it has left pending and executing (or the last one seen within a minute). */
    const settled = async (id: string): Promise<Record<string, unknown>> => {
      let shown: Record<string, unknown> = {};
      const until = Date.now() + 60_000;
      while (Date.now() < until) {
        shown = lastJson((await runCli(['show', id, '--json'], env)).stdout);
        const status = (shown.operation as { status?: string } | undefined)?.status;
        if (status !== undefined && status !== 'pending' && status !== 'executing') break;
        await new Promise((r) => setTimeout(r, 200));
      }
      return shown;
    };

    // Under the approval threshold: reserved by the gate, dispatched.
    const call = await runCli(
      [...agent('refund-42'), '--args', '{"order_id":"o-1","amount":1250,"currency":"EUR"}'],
      env,
    );
    t.equal(call.code, 0, call.stderr);
    const id = String(lastJson(call.stdout).operation_id);
    t.match(
      await settled(id),
      { ok: true, operation: { status: 'succeeded', provider_receipt: /^op_/ } },
      'dispatched through the sandbox over mTLS',
    );

    // Over it: held for a supervisor, who approves the envelope's hash; then dispatched.
    const held = lastJson(
      (await runCli([...agent('refund-43'), '--args', '{"order_id":"o-2","amount":7500,"currency":"EUR"}'], env))
        .stdout,
    );
    t.match(held, { ok: false, error: 'approval_required' });
    const approvalId = String(held.request_id);
    const shownApproval = lastJson((await runCli(['gate', 'show', approvalId, '--tenant', 'tenant-a'], env)).stdout);
    const approve = await runCli(
      ['gate', 'approve', approvalId, '--hash', String(shownApproval.envelope_sha256)].concat([
        '--tenant',
        'tenant-a',
        '--role',
        'supervisor',
        '--break-glass',
        'alice',
      ]),
      env,
    );
    t.equal(approve.code, 0, approve.stdout);
    const approvedId = String(lastJson(approve.stdout).operation_id);
    t.match(await settled(approvedId), { operation: { status: 'succeeded' } }, 'the approved refund was dispatched');

    // A direct reservation skips the gate: the example config denies it at dispatch, nothing is sent.
    const direct = await runCli(
      [
        ...['reserve', '--tenant', 'tenant-a', '--principal', 'svc-billing', '--task', 'nightly-7', '--step', '1'],
        ...['--approval', 'appr-1', '--policy', 'v3', '--tool', 'issue_refund'],
        ...['--args', '{"order_id":"o-3","amount":100,"currency":"EUR"}'],
      ],
      env,
    );
    t.equal(direct.code, 0, direct.stderr);
    t.match(
      await settled(String(lastJson(direct.stdout).operation_id)),
      { operation: { status: 'needs_review', review_reason: /^authorization:/ } },
      'gate.direct_reservations deny: refused at dispatch',
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
    t.match(lastJson(verify.stdout), { ok: true, operations: 3, listings: 1, provider_effects: 2 });

    const metrics = await (await fetch(`http://127.0.0.1:${http}/metrics`)).text();
    t.match(
      metrics,
      /actionledger_dispatch_outcomes_total\{tool="issue_refund",provider="sandbox-billing",outcome="succeeded",worker="[12]"\} [12]/,
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
    t.match(metrics, /actionledger_operations\{status="succeeded"\} 2/);

    service.kill('SIGTERM');
    t.equal(await exited, 0, 'SIGTERM: exit 0');
  },
);
