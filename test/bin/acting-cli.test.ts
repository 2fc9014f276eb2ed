/**
 * Who acts on the command line: the principal of the token in ACTIONLEDGER_TOKEN (its tenant, its role), or a
 * named break-glass operator; never whoever a flag names. Each case through the real CLI, its audit row read
 * back from the database.
 */
import t from 'tap';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { TEST_SECRET } from '../helpers/db.js';
import { lastJson, runCli } from '../helpers/cli.js';
import { auditRows, gateFixture, gateRoutes, gateSection, gctx } from '../helpers/gate.js';
import { PrincipalStore } from '../../principals/index.js';

const UNKNOWN_ID = '00000000-0000-4000-8000-000000000000';

t.test('approving, the kill switch and review as a token or as break-glass', async (t) => {
  const over = { tools: { issue_refund: { limits: { per_conversation: { max_value: 5000 } } } } };
  const { gate, pool, url, config } = await gateFixture(t, { gate: over });
  const cfg = join(mkdtempSync(join(tmpdir(), 'al-acting-cli-')), 'config.json');
  const api = { permissions: { review: ['supervisor'], kill_switch: ['supervisor'] } };
  writeFileSync(cfg, JSON.stringify({ tools: gateRoutes(), gate: gateSection(over), api }));
  const env = { DATABASE_URL: url, ACTIONLEDGER_CONFIG: cfg, ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET };
  const cli = (args: string[], token?: string) =>
    runCli(args, token === undefined ? env : { ...env, ACTIONLEDGER_TOKEN: token });

  const store = new PrincipalStore(config, pool);
  const token = async (id: string, tenant: string, roles: string[]): Promise<string> => {
    await store.add(id, 'person', '', 'test');
    for (const r of roles) await store.grant(id, tenant, r, 'test');
    return (await store.createToken(id, tenant, '', 1, 'test')).token;
  };
  const supA = await token('sup-a', 'tenant-a', ['supervisor']);
  const supB = await token('sup-b', 'tenant-b', ['supervisor']);
  const multi = await token('multi', 'tenant-a', ['supervisor', 'auditor']);
  const auditor = await token('aud', 'tenant-a', ['auditor']);
  const agent = await token('agent-9', 'tenant-a', ['agent']);

  const approval = async (step: string): Promise<{ id: string; hash: string }> => {
    const r = await gate.call(gctx({ workflow_step_id: step, conversation_id: step }), 'issue_refund', {
      order_id: 'O-2',
      amount: 600,
      currency: 'GBP',
    });
    const id = !r.ok ? (r.request_id ?? '') : '';
    return { id, hash: (await gate.approvals.show(id, { tenant_id: 'tenant-a' })).envelope_sha256 };
  };
  const approve = (a: { id: string; hash: string }, extra: string[], tok?: string) =>
    cli(['gate', 'approve', a.id, '--hash', a.hash, ...extra], tok);

  // Another tenant's token: the approval is as absent as a random id, and nothing is recorded on it.
  const first = await approval('big-1');
  const foreign = await approve(first, [], supB);
  const random = await approve({ id: UNKNOWN_ID, hash: first.hash }, [], supB);
  t.equal(foreign.code, 1);
  t.match(lastJson(foreign.stdout), { ok: false, error: 'not_found' });
  t.same(
    { ...lastJson(foreign.stdout), request_id: undefined },
    { ...lastJson(random.stdout), request_id: undefined },
    "another tenant's approval looks like one that does not exist",
  );

  // Flags that disagree with the token are refused, naming the flag; so is --break-glass beside a token.
  const disagree: [string[], RegExp][] = [
    [['--approver', 'someone-else'], /--approver/],
    [['--tenant', 'tenant-b'], /--tenant/],
    [['--break-glass', 'alice', '--role', 'supervisor', '--tenant', 'tenant-a'], /--break-glass/],
  ];
  for (const [flags, names] of disagree) {
    const r = await approve(first, flags, supA);
    t.equal(r.code, 1, flags.join(' '));
    t.match(lastJson(r.stdout), { ok: false, error: 'invalid_request', message: names });
  }
  t.match(lastJson((await approve(first, [], multi)).stdout), {
    ok: false,
    error: 'invalid_request',
    message: /several roles/,
  });
  t.match(lastJson((await approve(first, ['--role', 'admin'], multi)).stdout), {
    ok: false,
    error: 'permission_denied',
  });
  t.match(lastJson((await approve(first, [], auditor)).stdout), { ok: false, error: 'permission_denied' });
  for (const bad of ['alt_' + 'A'.repeat(43), 'not-a-token']) {
    const r = await approve(first, [], bad);
    t.equal(r.code, 1);
    t.match(lastJson(r.stdout), { ok: false, error: 'unauthenticated' });
  }
  await pool.query(
    "UPDATE actionledger.api_tokens SET created_at = now() - interval '2 days', expires_at = now() - interval '1 day' WHERE principal_id = 'aud'",
  );
  t.match(lastJson((await approve(first, [], auditor)).stdout), {
    ok: false,
    error: 'unauthenticated',
    details: { reason: 'expired' },
  });

  // The token's principal approves, with its role in its tenant (--tenant and --approver may agree).
  const ok = await approve(first, ['--tenant', 'tenant-a', '--approver', 'sup-a'], supA);
  t.equal(ok.code, 0, ok.stdout + ok.stderr);
  t.match(lastJson(ok.stdout), { ok: true, status: 'reserved' });
  const approved = await auditRows(pool, "action = 'approve' AND outcome = 'approved'");
  t.match(approved, [{ tenant_id: 'tenant-a', principal_id: 'sup-a', role: 'supervisor', subject_id: first.id }]);
  t.notOk('break_glass' in (approved[0]?.detail as object), 'not marked break-glass');
  t.match(await auditRows(pool, 'subject_id = $1 AND principal_id = $2', [first.id, 'sup-b']), []);

  // Without a token: a named break-glass operator, with a real approver role, audited as such.
  const second = await approval('big-2');
  const nobody = await approve(second, ['--tenant', 'tenant-a', '--role', 'supervisor']);
  t.equal(nobody.code, 1);
  t.match(lastJson(nobody.stdout), { ok: false, error: 'unauthenticated', message: /--break-glass NAME/ });
  t.equal((await approve(second, ['--tenant', 'tenant-a', '--break-glass', 'alice'])).code, 2, 'no --role: usage');
  const notApprover = await approve(second, ['--tenant', 'tenant-a', '--role', 'agent', '--break-glass', 'alice']);
  t.match(lastJson(notApprover.stdout), { ok: false, error: 'invalid_request', message: /--role/ });
  const glass = await approve(second, ['--tenant', 'tenant-a', '--role', 'supervisor', '--break-glass', 'alice']);
  t.equal(glass.code, 0, glass.stdout + glass.stderr);
  t.match(await auditRows(pool, "action = 'approve' AND subject_id = $1", [second.id]), [
    { outcome: 'approved', principal_id: 'break-glass:alice', role: 'supervisor', detail: { break_glass: true } },
  ]);

  // The kill switch: a token needs the kill_switch capability and acts in its own tenant only.
  const engage = ['gate', 'kill-switch', 'engage', '--tool', 'issue_refund', '--reason', 'drill'];
  t.match(lastJson((await cli(engage, multi)).stdout), { ok: true, tenant_id: 'tenant-a' });
  t.match(lastJson((await cli([...engage, '--tenant', '*'], supA)).stdout), {
    ok: false,
    error: 'invalid_request',
    message: /--tenant/,
  });
  const lift = await cli(['gate', 'kill-switch', 'lift', '--tool', 'issue_refund', '--actor', 'multi'], multi);
  t.match(lastJson(lift.stdout), { ok: true, engaged: false });
  t.match(await auditRows(pool, "action = 'kill_switch'"), [
    { outcome: 'engaged', tenant_id: 'tenant-a', principal_id: 'multi' },
    { outcome: 'lifted', tenant_id: 'tenant-a', principal_id: 'multi' },
  ]);

  // Review: another tenant's operation is refused as absent (and audited); its own tenant's is reviewed.
  const call = await gate.call(gctx({ tenant_id: 'tenant-b', workflow_step_id: 'tb-1' }), 'transfer_funds', {
    to_account: 'ACC0000000002',
    amount: 1,
  });
  const opB = call.ok ? (call.operation_id ?? '') : '';
  const review = ['review', 'resolve-failed', opB, '--reason', 'not wanted'];
  t.match(lastJson((await cli(review, supA)).stdout), { ok: false, error: 'not_found' });
  t.match(lastJson((await cli(review, supB)).stdout), { ok: false, error: 'invalid_state_transition' });
  t.match(await auditRows(pool, "action = 'review:resolve_failed'"), [
    { outcome: 'not_found', tenant_id: 'tenant-a', principal_id: 'sup-a', subject_id: opB },
    { outcome: 'invalid_state_transition', principal_id: 'sup-b', subject_id: opB },
  ]);
  t.match(lastJson((await cli(review, agent)).stdout), { ok: false, error: 'permission_denied' }, 'no review role');
  t.match(lastJson((await cli(engage, agent)).stdout), { ok: false, error: 'permission_denied' }, 'nor kill_switch');
});
