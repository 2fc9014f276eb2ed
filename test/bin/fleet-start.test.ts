/**
 * The newcomer's path, end to end with real processes: `actionledger start` on the shipped example
 * configuration (embedded PostgreSQL, the development sandbox over mTLS, two dispatcher workers, the reconcile
 * schedule), then the README's quick start with the CLI: a call through the gate that is reserved and succeeds,
 * one held for an approval that a supervisor approves and that succeeds, a direct reservation the example
 * configuration denies at dispatch; then reconcile, verify, metrics, SIGTERM.
 */
import t, { type Test } from 'tap';
import { chmodSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { execFile, spawn } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BIN, lastJson, runCli } from '../helpers/cli.js';
import { freePort } from '../helpers/net.js';
import { nodeCommand } from '../helpers/node-child.js';

t.test(
  'npm start on the example config: gate call, an approval, a denied direct reservation; reconcile; verify; SIGTERM',
  async (t) => {
    const dir = mkdtempSync(join(tmpdir(), 'al-fleet-'));
    chmodSync(dir, 0o711);
    const [http, pg, provider, authorizer] = [await freePort(), await freePort(), await freePort(), await freePort()];
    // Its tools are written as paths of the sandbox provider: they follow sandbox.provider_port.
    const example = readFileSync(join(import.meta.dirname, '..', '..', '..', 'actionledger.config.json'), 'utf8');
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

    const service = spawn(...nodeCommand([BIN, 'start', '--workers', '2']), {
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

    await overHttp(t, `http://127.0.0.1:${http}`, env, settled);

    const rec = await runCli(['reconcile', '--once', '--json'], env);
    t.equal(rec.code, 0, rec.stderr);
    t.match(
      lastJson(rec.stdout),
      { ok: true, reconcile: { examined: 0 }, gate: { approvals_expired: 0, proposals_expired: 0 } },
      'the pass also ran the gate housekeeping',
    );
    const verify = await runCli(['verify', '--json'], env);
    t.equal(verify.code, 0, verify.stdout);
    t.match(lastJson(verify.stdout), { ok: true, operations: 7, listings: 1, provider_effects: 5 });

    const metrics = await (await fetch(`http://127.0.0.1:${http}/metrics`)).text();
    // Which worker slot dispatched which operation is up to their claims; together they dispatched all five.
    const outcomes = [
      ...metrics.matchAll(
        /actionledger_dispatch_outcomes_total\{tool="issue_refund",provider="sandbox-billing",outcome="succeeded",worker="([12])"\} (\d+)/g,
      ),
    ];
    t.ok(outcomes.length > 0, 'worker metrics, aggregated, labelled by worker slot');
    t.equal(
      outcomes.reduce((sum, m) => sum + Number(m[2]), 0),
      5,
      'the slots’ outcome counts add up to the five dispatched',
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
    t.match(metrics, /actionledger_operations\{status="succeeded"\} 5/);
    // The API is served by both workers: its counters carry the slot of the worker that answered.
    t.equal(
      sumOf(metrics, 'actionledger_gate_calls_total', 'tool="issue_refund",outcome="approval_required"'),
      2,
      'gate calls, summed over the workers',
    );
    t.equal(sumOf(metrics, 'actionledger_api_requests_total', 'route="/v1/calls",method="POST",status="200"'), 3);

    service.kill('SIGTERM');
    t.equal(await exited, 0, 'SIGTERM: exit 0');
  },
);

/**
 * The README's quick start over HTTP against the running fleet: principals and tokens made on the command line
 * (break-glass), then `curl` as printed there (a call reserved and dispatched, one held, the envelope read and
 * approved by its hash, a direct reservation refused at dispatch; task ids of their own, the command-line flows
 * above having used the README's), then the Python client.
 */
async function overHttp(
  t: Test,
  base: string,
  env: NodeJS.ProcessEnv,
  settled: (id: string) => Promise<Record<string, unknown>>,
): Promise<void> {
  const cli = async (args: string[]) => {
    const r = await runCli([...args, '--break-glass', 'admin'], env);
    t.equal(r.code, 0, `${args.join(' ')}: ${r.stdout}${r.stderr}`);
    return lastJson(r.stdout);
  };
  const tokens: Record<string, string> = {};
  for (const [who, kind, role] of [
    ['agent-7', 'service', 'agent'],
    ['alice', 'person', 'supervisor'],
    ['svc-billing', 'service', 'service'],
  ] as const) {
    await cli(['principal', 'add', who, '--kind', kind]);
    await cli(['principal', 'grant', who, '--tenant', 'tenant-a', '--role', role]);
    tokens[who] = String((await cli(['token', 'create', who, '--tenant', 'tenant-a', '--json'])).token);
  }
  const curl = async (path: string, token: string, body?: string): Promise<Record<string, unknown>> => {
    const args = ['-s', `${base}${path}`, '-H', `authorization: Bearer ${token}`];
    if (body !== undefined) args.push('-H', 'content-type: application/json', '-d', body);
    const { stdout } = await run('curl', args);
    return JSON.parse(stdout) as Record<string, unknown>;
  };
  const agent = tokens['agent-7'] ?? '';
  const alice = tokens.alice ?? '';
  const under = await curl(
    '/v1/calls',
    agent,
    '{"tool":"issue_refund","arguments":{"order_id":"o-1","amount":1250,"currency":"EUR"},"task_id":"refund-52","workflow_step_id":"1"}',
  );
  t.match(under, { ok: true, status: 'reserved', created: true }, 'reserved at once');
  t.match(await settled(String(under.operation_id)), { operation: { status: 'succeeded' } });
  const held = await curl(
    '/v1/calls',
    agent,
    '{"tool":"issue_refund","arguments":{"order_id":"o-2","amount":7500,"currency":"EUR"},"task_id":"refund-53","workflow_step_id":"1"}',
  );
  t.match(held, { ok: false, error: 'approval_required' });
  const shown = await curl(`/v1/approvals/${String(held.request_id)}`, alice);
  t.match(shown, { ok: true, status: 'pending', envelope: { effect: 'Refund 7500 EUR (minor units) on order o-2' } });
  const hash = JSON.stringify({ envelope_sha256: shown.envelope_sha256 });
  t.match(await curl(`/v1/approvals/${String(held.request_id)}/approve`, agent, hash), {
    ok: false,
    error: 'permission_denied',
  });
  const approved = await curl(`/v1/approvals/${String(held.request_id)}/approve`, alice, hash);
  t.match(approved, { ok: true, status: 'reserved' });
  t.match(await curl(`/v1/operations/${String(approved.operation_id)}`, agent), {
    ok: true,
    operation: { status: /^(pending|executing|succeeded)$/ },
  });
  t.match(await settled(String(approved.operation_id)), { operation: { status: 'succeeded' } });
  const direct = await curl(
    '/v1/operations',
    tokens['svc-billing'] ?? '',
    '{"tool":"issue_refund","arguments":{"order_id":"o-3","amount":100,"currency":"EUR"},"task_id":"nightly-8","workflow_step_id":"1","approval_id":"appr-1","policy_version":"v3"}',
  );
  t.match(direct, { ok: true, created: true, status: 'pending' });
  t.match(await settled(String(direct.operation_id)), { operation: { status: 'needs_review' } });

  const script = join(import.meta.dirname, '..', '..', '..', 'examples', 'python', 'refund_with_approval.py');
  const py = await run('python3', [script, base, agent, alice, 'py-1']);
  const steps = py.stdout
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as Record<string, unknown>);
  t.match(
    steps,
    [
      { step: 'call', answer: { error: 'approval_required' } },
      { step: 'envelope', envelope_sha256: /^[0-9a-f]{64}$/ },
      { step: 'requester-approves', status: 403, error: 'permission_denied' },
      { step: 'approve', answer: { ok: true, status: 'reserved' } },
      { step: 'outcome', status: 'succeeded' },
    ],
    'the Python client (standard library only): call, approve as a second principal, succeeded',
  );
}

/** The sum of a counter's series that begin with `labels` (followed by the `worker` label) over the workers. */
function sumOf(metrics: string, name: string, labels: string): number {
  let sum = 0;
  for (const line of metrics.split('\n'))
    if (line.startsWith(`${name}{${labels},worker="`)) sum += Number(line.slice(line.lastIndexOf(' ') + 1));
  return sum;
}

/** Runs a program to its end; rejects with its output when it fails. */
function run(file: string, args: string[]): Promise<{ stdout: string; stderr: string }> {
  return new Promise((resolve, reject) =>
    execFile(file, args, { timeout: 90_000 }, (err, stdout, stderr) =>
      err === null
        ? resolve({ stdout, stderr })
        : reject(new Error(`${file} failed: ${err.message}\n${stdout}${stderr}`)),
    ),
  );
}
