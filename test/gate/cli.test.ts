/**
 * `actionledger gate`: a person approves by id and displayed hash, rejects, and works the kill switch from a
 * terminal; here as named break-glass operators (no token), each audited as such.
 */
import t from 'tap';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { TEST_SECRET } from '../helpers/db.js';
import { lastJson, runCli } from '../helpers/cli.js';
import { count, gateFixture, gateRoutes, gateSection, gctx } from '../helpers/gate.js';

t.test('show, approve with the displayed hash, reject, kill switch engage / list / lift, revoke role', async (t) => {
  const over = { tools: { issue_refund: { limits: { per_conversation: { max_value: 5000 } } } } };
  const { gate, pool, url } = await gateFixture(t, { gate: over });
  const dir = mkdtempSync(join(tmpdir(), 'al-gate-cli-'));
  const cfg = join(dir, 'config.json');
  writeFileSync(cfg, JSON.stringify({ tools: gateRoutes(), gate: gateSection(over) }));
  const env = {
    DATABASE_URL: url,
    ACTIONLEDGER_CONFIG: cfg,
    ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET,
    LOG_LEVEL: 'silent',
  };
  const who = ['--tenant', 'tenant-a', '--role', 'supervisor', '--break-glass', 'supervisor-7'];

  const a = await gate.call(gctx({ workflow_step_id: 'big-1' }), 'issue_refund', {
    order_id: 'O-1',
    amount: 450,
    currency: 'GBP',
  });
  const b = await gate.call(gctx({ workflow_step_id: 'big-2', conversation_id: 'conv-2' }), 'issue_refund', {
    order_id: 'O-2',
    amount: 600,
    currency: 'GBP',
  });
  t.match(a, { ok: true }, 'under the threshold: reserved');
  const id = !b.ok ? (b.request_id ?? '') : '';
  const shown = await runCli(['gate', 'show', id, '--tenant', 'tenant-a'], env);
  t.equal(shown.code, 0, shown.stdout + shown.stderr);
  const view = lastJson(shown.stdout) as { envelope_sha256: string; envelope: { arguments: unknown } };
  t.same(
    view.envelope.arguments,
    { order_id: 'O-2', amount: 600, currency: 'GBP' },
    'the person sees the real arguments',
  );

  const wrong = await runCli(['gate', 'approve', id, '--hash', 'f'.repeat(64), ...who], env);
  t.equal(wrong.code, 1);
  t.match(lastJson(wrong.stdout), { ok: false, error: 'approval_hash_mismatch' });
  const ok = await runCli(['gate', 'approve', id, '--hash', view.envelope_sha256, ...who], env);
  t.equal(ok.code, 0, ok.stdout + ok.stderr);
  t.match(lastJson(ok.stdout), { ok: true, status: 'reserved', request_id: id });
  t.equal(await count(pool, 'actionledger.operations'), 2);

  const c = await gate.call(gctx({ workflow_step_id: 'big-3', conversation_id: 'conv-3' }), 'issue_refund', {
    order_id: 'O-3',
    amount: 700,
    currency: 'GBP',
  });
  const rejected = await runCli(
    ['gate', 'reject', !c.ok ? (c.request_id ?? '') : '', '--reason', 'duplicate request', ...who],
    env,
  );
  t.match(lastJson(rejected.stdout), { ok: true, status: 'rejected' });
  t.equal(
    (
      await pool.query<{ reason: string | null }>(
        'SELECT status, reason FROM actionledger.gate_approvals WHERE approval_id = $1',
        [!c.ok ? c.request_id : ''],
      )
    ).rows[0]?.reason,
    'duplicate request',
  );

  const engage = await runCli(
    [
      'gate',
      'kill-switch',
      'engage',
      '--tenant',
      'tenant-a',
      '--tool',
      '*',
      '--break-glass',
      'oncall',
      '--reason',
      'incident 7',
    ],
    env,
  );
  t.equal(engage.code, 0, engage.stderr);
  t.match(
    await gate.call(gctx({ workflow_step_id: 'x' }), 'transfer_funds', { to_account: 'ACC0000000002', amount: 1 }),
    { ok: false, error: 'tool_disabled' },
  );
  t.match(lastJson((await runCli(['gate', 'kill-switch', 'list', '--json'], env)).stdout), {
    ok: true,
    kill_switches: [{ tenant_id: 'tenant-a', tool_name: '*', reason: 'incident 7' }],
  });
  t.equal(
    (
      await runCli(
        ['gate', 'kill-switch', 'lift', '--tenant', 'tenant-a', '--tool', '*', '--break-glass', 'oncall'],
        env,
      )
    ).code,
    0,
  );
  t.match(
    await gate.call(gctx({ workflow_step_id: 'x' }), 'transfer_funds', { to_account: 'ACC0000000002', amount: 1 }),
    { ok: true },
  );

  t.equal(
    (
      await runCli(
        [
          'gate',
          'revoke-role',
          '--tenant',
          'tenant-a',
          '--principal',
          'agent-1',
          '--role',
          'agent',
          '--break-glass',
          'security',
        ],
        env,
      )
    ).code,
    0,
  );
  t.match(
    await gate.call(gctx({ workflow_step_id: 'y' }), 'transfer_funds', { to_account: 'ACC0000000002', amount: 1 }),
    { ok: false, error: 'permission_denied' },
  );
  t.equal((await runCli(['gate', 'approve', id], env)).code, 2, 'usage error without the hash and identity');
  const audit = await pool.query<{ action: string; outcome: string; principal_id: string; detail: unknown }>(
    "SELECT action, outcome, principal_id, detail FROM actionledger.gate_audit WHERE action IN ('approve','execute','reject','kill_switch','role') ORDER BY id",
  );
  t.same(
    audit.rows.map((r) => `${r.action}:${r.outcome}:${r.principal_id}`),
    [
      'approve:approval_hash_mismatch:break-glass:supervisor-7',
      'approve:approved:break-glass:supervisor-7',
      'execute:reserved:break-glass:supervisor-7',
      'reject:rejected:break-glass:supervisor-7',
      'kill_switch:engaged:break-glass:oncall',
      'kill_switch:lifted:break-glass:oncall',
      'role:revoked:agent-1',
    ],
    'each row names the break-glass operator (a role row names the principal whose role it is)',
  );
  for (const r of audit.rows) t.match(r.detail, { break_glass: true }, `${r.action}:${r.outcome} says break_glass`);
  t.match(audit.rows.at(-1)?.detail, { by: 'break-glass:security', break_glass: true });
});
