/**
 * `actionledger gate call`, `gate confirm` and `gate execute` as a person at a terminal meets them: the real
 * CLI as a child process against a real PostgreSQL, the gate's answer on stdout and the exit code agreeing
 * with it; a call that reserves, one refused, one held for an approval decided with `gate show` / `gate
 * approve`, one held for a confirmation completed with `gate confirm` / `gate execute`.
 */
import t, { type Test } from 'tap';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createPool, type Pool } from '../../db/db.js';
import { createTestDatabase, TEST_SECRET } from '../helpers/db.js';
import { gateRoutes, gateSection } from '../helpers/gate.js';
import { runCli, type CliResult } from '../helpers/cli.js';

interface Env {
  env: NodeJS.ProcessEnv;
  pool: Pool;
  dir: string;
}

async function setup(t: Test): Promise<Env> {
  const url = await createTestDatabase(t);
  const dir = mkdtempSync(join(tmpdir(), 'al-gate-call-'));
  const cfg = join(dir, 'config.json');
  // delete_customer needs one approver here (two in the shared fixture), so one `gate approve` executes it, and
  // takes a free-text reason (what an agent fills from text it read).
  const schema = {
    type: 'object',
    additionalProperties: false,
    required: ['customer_id'],
    properties: {
      customer_id: { type: 'string', pattern: '^C-[0-9]{1,10}$' },
      reason: { type: 'string', maxLength: 200 },
    },
  };
  const gate = gateSection({ tools: { delete_customer: { schema, approval: { mode: 'always', approvers: 1 } } } });
  writeFileSync(cfg, JSON.stringify({ tools: gateRoutes(), gate }));
  const pool = createPool(url, { max: 2, statementTimeoutMs: 30_000, applicationName: 'test' });
  t.teardown(() => pool.end());
  const env = {
    DATABASE_URL: url,
    ACTIONLEDGER_CONFIG: cfg,
    ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET,
    TEST_BILLING_TOKEN: 'token-for-tests',
    LOG_LEVEL: 'warn',
  };
  return { env, pool, dir };
}

const context = (principal: string, role: string, step: string, turn = '1'): string[] => [
  '--tenant',
  'tenant-a',
  '--principal',
  principal,
  '--role',
  role,
  '--account',
  'acct-1',
  '--task',
  'task-1',
  '--step',
  step,
  '--conversation',
  'conv-1',
  '--turn',
  turn,
];

/** The one JSON document a command printed (failing the test when stdout holds anything else). */
function doc(t: Test, r: CliResult): Record<string, unknown> {
  const lines = r.stdout.split('\n').filter((l) => l !== '');
  t.equal(lines.length, 1, `one line on stdout (${r.stdout}${r.stderr})`);
  const parsed = JSON.parse(lines[0] ?? 'null') as Record<string, unknown>;
  t.equal(r.code, parsed.ok === true ? 0 : 1, 'the exit code agrees with ok');
  return parsed;
}

async function operation(pool: Pool, id: unknown): Promise<Record<string, unknown> | undefined> {
  const { rows } = await pool.query<Record<string, unknown>>(
    'SELECT tool_name, status, principal_id, task_id, workflow_step_id FROM actionledger.operations WHERE operation_id = $1',
    [String(id)],
  );
  return rows[0];
}

async function operationsOfStep(pool: Pool, step: string): Promise<number> {
  const { rows } = await pool.query<{ n: number }>(
    'SELECT count(*)::int AS n FROM actionledger.operations WHERE workflow_step_id = $1',
    [step],
  );
  return rows[0]?.n ?? -1;
}

t.test(
  'gate call: reserved, a retry is the same operation, a schema violation and a missing validator refused',
  async (t) => {
    const { env, pool } = await setup(t);
    const transfer = ['gate', 'call', ...context('agent-7', 'agent', 's-1'), '--tool', 'transfer_funds'];
    const args = '{"to_account":"ACC0000000001","amount":25}';

    const first = doc(t, await runCli([...transfer, '--args', args], env));
    t.match(first, {
      ok: true,
      status: 'reserved',
      created: true,
      operation_id: /^[0-9a-f-]{36}$/,
      effect_key: /^v1\.k1\.[0-9a-f]{64}$/,
    });
    t.same(first.next, [`actionledger show ${String(first.operation_id)}`], 'next: watch it');
    t.match(await operation(pool, first.operation_id), {
      tool_name: 'transfer_funds',
      status: 'pending',
      principal_id: 'agent-7',
      task_id: 'task-1',
      workflow_step_id: 's-1',
    });

    const again = doc(t, await runCli([...transfer, '--args', '{"amount":25.0,"to_account":"ACC0000000001"}'], env));
    t.match(again, { ok: true, status: 'reserved', created: false, operation_id: first.operation_id });

    const bad = await runCli(
      [
        'gate',
        'call',
        ...context('agent-7', 'agent', 's-2'),
        '--tool',
        'transfer_funds',
        '--args',
        '{"to_account":"x","amount":1}',
      ],
      env,
    );
    t.equal(bad.code, 1, 'refused: exit 1');
    t.match(doc(t, bad), { ok: false, error: 'invalid_arguments', message: /to_account/ });
    t.notOk('next' in JSON.parse(bad.stdout), 'a refusal names no next command');
    t.equal(await operationsOfStep(pool, 's-2'), 0, 'nothing reserved');

    const denied = doc(
      t,
      await runCli(
        ['gate', 'call', ...context('agent-7', 'support', 's-3'), '--tool', 'transfer_funds', '--args', args],
        env,
      ),
    );
    t.match(denied, { ok: false, error: 'permission_denied' }, 'the role table applies');

    // issue_refund runs the business validator order_owned, which the command line does not have.
    const refund = await runCli(
      [
        'gate',
        'call',
        ...context('agent-7', 'agent', 's-4'),
        '--tool',
        'issue_refund',
        '--args',
        '{"order_id":"O-1","amount":5,"currency":"GBP"}',
      ],
      env,
    );
    t.match(doc(t, refund), {
      ok: false,
      error: 'config_invalid',
      message: /order_owned.*does not run.*nothing was reserved/,
    });
    t.equal(await operationsOfStep(pool, 's-4'), 0, 'nothing reserved');
    const audited = await pool.query(
      "SELECT 1 FROM actionledger.gate_audit WHERE action = 'call' AND tool_name = 'issue_refund' AND outcome = 'config_invalid'",
    );
    t.equal(audited.rowCount, 1, 'the refused call is in the audit log');

    // update_document needs an approval that binds the document's version, which the command line cannot resolve.
    const doc1 = await runCli(
      [
        'gate',
        'call',
        ...context('editor-1', 'editor', 's-5'),
        '--tool',
        'update_document',
        '--args',
        '{"document_id":"DOC-1","status":"published"}',
      ],
      env,
    );
    t.match(doc(t, doc1), { ok: false, error: 'config_invalid', message: /binds resources of type document/ });
    const approvals = await pool.query('SELECT 1 FROM actionledger.gate_approvals');
    t.equal(approvals.rowCount, 0, 'no approval was requested');
  },
);

t.test('gate call held for an approval: gate show, gate approve with the hash, the operation exists', async (t) => {
  const { env, pool } = await setup(t);
  const held = doc(
    t,
    await runCli(
      [
        'gate',
        'call',
        ...context('admin-1', 'admin', 'del-1'),
        '--tool',
        'delete_customer',
        '--args',
        '{"customer_id":"C-9"}',
      ],
      env,
    ),
  );
  t.match(held, { ok: false, error: 'approval_required', request_id: /^[0-9a-f-]{36}$/ });
  const id = String(held.request_id);
  t.same(held.next, [
    `actionledger gate show ${id} --tenant tenant-a`,
    `actionledger gate approve ${id} --hash ENVELOPE_SHA256 --tenant tenant-a --role supervisor --break-glass APPROVER_NAME`,
  ]);
  t.equal(await operationsOfStep(pool, 'del-1'), 0, 'nothing reserved before the approval');

  const shown = doc(t, await runCli(['gate', 'show', id, '--tenant', 'tenant-a'], env));
  t.match(shown, {
    ok: true,
    status: 'pending',
    envelope: { tool: 'delete_customer', arguments: { customer_id: 'C-9' } },
  });
  const hash = String(shown.envelope_sha256);

  // The supervisor, and a token to act as them, made the documented way.
  const root = ['--break-glass', 'root'];
  t.equal((await runCli(['principal', 'add', 'sup-1', '--kind', 'person', ...root], env)).code, 0);
  const grant = ['principal', 'grant', 'sup-1', '--tenant', 'tenant-a', '--role', 'supervisor', ...root];
  t.equal((await runCli(grant, env)).code, 0);
  const made = doc(t, await runCli(['token', 'create', 'sup-1', '--tenant', 'tenant-a', '--json', ...root], env));
  const asSupervisor = { ...env, ACTIONLEDGER_TOKEN: String(made.token) };
  // `next` as printed, with the hash `gate show` displayed and the approver's name: it runs as written where
  // `gate call` ran (no ACTIONLEDGER_TOKEN), and the approver's own token is the other way, without --break-glass.
  const printed = String((held.next as string[])[1]);
  const approve = (h: string, who = 'sup-1'): string[] =>
    printed.replace('ENVELOPE_SHA256', h).replace('APPROVER_NAME', who).split(' ').slice(1);
  const unnamed = await runCli(printed.replace('ENVELOPE_SHA256', hash).split(' ').slice(1).slice(0, -2), env);
  t.match(doc(t, unnamed), { ok: false, error: 'unauthenticated' }, 'without --break-glass (and no token): refused');
  const beside = await runCli(approve(hash), asSupervisor);
  t.match(doc(t, beside), { ok: false, error: 'invalid_request' }, 'printed without a token: not for a token');

  const wrong = doc(t, await runCli(approve('f'.repeat(64)), env));
  t.match(wrong, { ok: false, error: 'approval_hash_mismatch' }, 'bound to the envelope shown');
  t.match(doc(t, await runCli(approve(hash, 'admin-1'), env)), { ok: false, error: 'self_approval_forbidden' });

  const approved = doc(t, await runCli(approve(hash), env));
  t.match(approved, { ok: true, operation_id: /^[0-9a-f-]{36}$/ });
  t.match(await operation(pool, approved.operation_id), {
    tool_name: 'delete_customer',
    principal_id: 'admin-1',
    workflow_step_id: 'del-1',
  });
  const audit = await pool.query(
    "SELECT principal_id, role FROM actionledger.gate_audit WHERE action = 'approve' AND subject_id = $1 ORDER BY id",
    [id],
  );
  t.same(audit.rows, [
    { principal_id: 'break-glass:sup-1', role: 'supervisor' },
    { principal_id: 'break-glass:sup-1', role: 'supervisor' },
  ]);

  // Where a token is set, the hint leaves --break-glass out, and runs as printed with the approver's token.
  const call2 = ['gate', 'call', ...context('admin-1', 'admin', 'del-2'), '--tool', 'delete_customer'];
  const held2 = doc(t, await runCli([...call2, '--args', '{"customer_id":"C-8"}'], asSupervisor));
  const id2 = String(held2.request_id);
  const printed2 = String((held2.next as string[])[1]);
  t.equal(printed2, `actionledger gate approve ${id2} --hash ENVELOPE_SHA256 --tenant tenant-a --role supervisor`);
  const hash2 = String(doc(t, await runCli(['gate', 'show', id2, '--tenant', 'tenant-a'], env)).envelope_sha256);
  const words2 = printed2.replace('ENVELOPE_SHA256', hash2).split(' ').slice(1);
  t.match(doc(t, await runCli(words2, asSupervisor)), { ok: true, operation_id: /^[0-9a-f-]{36}$/ });
});

t.test('gate show prints hidden characters as codes; gate approve needs --accept-hidden-characters', async (t) => {
  const { env, pool } = await setup(t);
  const args = JSON.stringify({ customer_id: 'C-7', reason: 'closed at the customer\u2019s request \u2066C-1\u2069' });
  const held = doc(
    t,
    await runCli(
      ['gate', 'call', ...context('admin-1', 'admin', 'del-h'), '--tool', 'delete_customer', '--args', args],
      env,
    ),
  );
  t.match(held, { ok: false, error: 'approval_required' });
  const id = String(held.request_id);
  const show = await runCli(['gate', 'show', id, '--tenant', 'tenant-a'], env);
  t.match(show.stdout, /\\u2066C-1\\u2069/, 'each hidden character printed as its code');
  t.notMatch(show.stdout, /[\u2066\u2069]/u, 'and never raw');
  const hash = String((JSON.parse(show.stdout) as { envelope_sha256: string }).envelope_sha256);
  const root = ['--break-glass', 'root'];
  const approve = ['gate', 'approve', id, '--hash', hash, '--tenant', 'tenant-a', '--role', 'supervisor'];
  const refused = doc(t, await runCli([...approve, ...root], env));
  t.match(refused, { ok: false, error: 'hidden_characters', message: /\\u2066/ });
  t.equal(await operationsOfStep(pool, 'del-h'), 0, 'nothing reserved without the flag');
  const approved = doc(t, await runCli([...approve, '--accept-hidden-characters', ...root], env));
  t.match(approved, { ok: true, operation_id: /^[0-9a-f-]{36}$/ });
  t.equal(await operationsOfStep(pool, 'del-h'), 1, 'approved with the flag');
});

t.test('right-to-left text: gate show lists it, gate approve needs --accept-hidden-characters', async (t) => {
  const { env, pool } = await setup(t);
  // No control character: a Hebrew letter alone draws "1234 5678" as "5678 1234" in a terminal that does bidi.
  const args = JSON.stringify({ customer_id: 'C-8', reason: 'duplicate of \u05d0 1234 5678' });
  const held = doc(
    t,
    await runCli(
      ['gate', 'call', ...context('admin-1', 'admin', 'del-r'), '--tool', 'delete_customer', '--args', args],
      env,
    ),
  );
  t.match(held, { ok: false, error: 'approval_required' });
  const id = String(held.request_id);
  const show = JSON.parse((await runCli(['gate', 'show', id, '--tenant', 'tenant-a'], env)).stdout) as {
    envelope_sha256: string;
    hidden_characters?: { path: string; class: string }[];
  };
  t.same(
    show.hidden_characters?.filter((h) => h.path === '/arguments/reason'),
    [{ path: '/arguments/reason', code: '\\u05D0', in: 'value', class: 'right_to_left' }],
    'gate show says what approving will need acknowledged',
  );
  const root = ['--break-glass', 'root'];
  const approve = [
    'gate',
    'approve',
    id,
    '--hash',
    show.envelope_sha256,
    '--tenant',
    'tenant-a',
    '--role',
    'supervisor',
  ];
  const refused = doc(t, await runCli([...approve, ...root], env));
  t.match(refused, { ok: false, error: 'hidden_characters', message: /right-to-left text at \/arguments\/reason/ });
  t.equal(await operationsOfStep(pool, 'del-r'), 0, 'nothing reserved without the flag');
  const approved = doc(t, await runCli([...approve, '--accept-hidden-characters', ...root], env));
  t.match(approved, { ok: true, operation_id: /^[0-9a-f-]{36}$/ });
});

t.test('gate call held for a confirmation: confirm in a later turn, then execute', async (t) => {
  const { env, pool, dir } = await setup(t);
  const argsFile = join(dir, 'email.json');
  writeFileSync(argsFile, '{"to":"a@example.org","subject":"hi","body":"hello"}');
  const held = doc(
    t,
    await runCli(
      ['gate', 'call', ...context('agent-7', 'agent', 'mail-1'), '--tool', 'send_email', '--args', `@${argsFile}`],
      env,
    ),
  );
  t.match(held, {
    ok: false,
    error: 'confirmation_required',
    request_id: /^[0-9a-f-]{36}$/,
    confirm_token: /^[\w-]{43}$/,
  });
  const token = String(held.confirm_token);
  const id = String(held.request_id);
  const next = held.next as string[];
  t.match(
    next[0],
    new RegExp(`^actionledger gate confirm .*${token.replace(/-/g, '\\-')}`),
    'next: confirm with the token',
  );
  t.match(next[0], / --turn 2( |$)/, 'in the next turn');
  t.match(next[1], new RegExp(`^actionledger gate execute ${id} .* --turn 2( |$)`));

  // The token goes after `--`: a token may begin with '-'.
  const sameTurn = doc(
    t,
    await runCli(['gate', 'confirm', ...context('agent-7', 'agent', 'mail-1', '1'), '--', token], env),
  );
  t.match(sameTurn, { ok: false, error: 'proposal_same_turn_confirm' }, 'not in the turn it was proposed in');

  const confirmed = doc(
    t,
    await runCli(['gate', 'confirm', '-', ...context('agent-7', 'agent', 'mail-1', '2')], env, { input: `${token}\n` }),
  );
  t.match(confirmed, { ok: true, status: 'confirmed', request_id: id });
  t.match((confirmed.next as string[])[0], new RegExp(`^actionledger gate execute ${id} `));
  t.equal(await operationsOfStep(pool, 'mail-1'), 0, 'a confirmation reserves nothing');

  const replay = doc(
    t,
    await runCli(['gate', 'confirm', ...context('agent-7', 'agent', 'mail-1', '3'), '--', token], env),
  );
  t.match(replay, { ok: false, error: 'invalid_state_transition' }, 'a confirmation counts once');

  const execute = ['gate', 'execute', id, ...context('agent-7', 'agent', 'mail-1', '2')];
  const mismatch = doc(
    t,
    await runCli([...execute, '--args', '{"to":"b@example.org","subject":"hi","body":"hello"}'], env),
  );
  t.match(mismatch, { ok: false, error: 'params_mismatch' }, 'other arguments than the proposed ones');
  t.equal(await operationsOfStep(pool, 'mail-1'), 0);

  const executed = doc(t, await runCli([...execute, '--args', `@${argsFile}`], env));
  t.match(executed, { ok: true, status: 'reserved', operation_id: /^[0-9a-f-]{36}$/, request_id: id });
  t.match(await operation(pool, executed.operation_id), { tool_name: 'send_email', workflow_step_id: 'mail-1' });
  const again = doc(t, await runCli(execute, env));
  t.match(again, { ok: true, operation_id: executed.operation_id, created: false }, 'execute is idempotent');
});

t.test('usage errors: bad --args JSON, an unreadable file, a missing flag: exit 2, nothing on stdout', async (t) => {
  // Nobody listens on this database: an invocation wrongly accepted fails with exit 1, never 2.
  const env = { DATABASE_URL: 'postgres://nobody@127.0.0.1:1/none', ACTIONLEDGER_CONFIG: '/nonexistent/config.json' };
  const call = ['gate', 'call', ...context('agent-7', 'agent', 's-1'), '--tool', 'transfer_funds'];
  const cases: [string[], RegExp, string?][] = [
    [[...call, '--args', '{"amount":'], /--args is not one strict JSON object/],
    [[...call, '--args', '[1,2]'], /--args is not one strict JSON object/],
    [[...call, '--args', '{"a":1,"a":2}'], /--args is not one strict JSON object: .*duplicate/],
    [[...call, '--args', '@/nonexistent/args.json'], /cannot read "\/nonexistent\/args.json"/],
    [[...call, '--args', '-'], /--args \(from stdin\) is not one strict JSON object/, 'nope'],
    [
      [...call.slice(0, call.indexOf('--step')), ...call.slice(call.indexOf('--step') + 2), '--args', '{}'],
      /missing --step/,
    ],
    [[...call], /missing --args/],
    [['gate', 'confirm', 'tok', ...context('agent-7', 'agent', 's-1').slice(0, -2)], /missing --turn/],
    [['gate', 'execute', ...context('agent-7', 'agent', 's-1')], /expected one REQUEST_ID/],
    [['gate', 'execute', 'a', 'b', ...context('agent-7', 'agent', 's-1')], /expected one REQUEST_ID/],
  ];
  for (const [args, message, input] of cases) {
    const r = await runCli(args, env, input === undefined ? {} : { input });
    const what = args.filter((a) => a.startsWith('--') || !a.includes(' ')).join(' ');
    t.equal(r.code, 2, `${what}: exit 2 (${r.stderr})`);
    t.match(r.stderr.split('\n')[0], message, `${what}: names the problem`);
    t.equal(r.stdout, '', `${what}: nothing on stdout`);
  }
});
