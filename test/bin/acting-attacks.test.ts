/**
 * Attacks on who acts at the command line: a break-glass operator is a named person, so naming yourself as
 * the requester of an approval must not let you approve your own request; and a token whose role was revoked
 * with `gate revoke-role` acts with nothing.
 */
import t from 'tap';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { TEST_SECRET } from '../helpers/db.js';
import { lastJson, runCli } from '../helpers/cli.js';
import { count, gateFixture, gateRoutes, gateSection, gctx } from '../helpers/gate.js';
import { PrincipalStore } from '../../principals/index.js';

t.test('break-glass under the requester’s own name does not approve its own request', async (t) => {
  const over = { tools: { issue_refund: { limits: { per_conversation: { max_value: 5000 } } } } };
  const { gate, pool, url, config } = await gateFixture(t, { gate: over });
  const cfg = join(mkdtempSync(join(tmpdir(), 'al-acting-attacks-')), 'config.json');
  writeFileSync(cfg, JSON.stringify({ tools: gateRoutes(), gate: gateSection(over) }));
  const env = { DATABASE_URL: url, ACTIONLEDGER_CONFIG: cfg, ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET };
  const r = await gate.call(gctx({ principal_id: 'alice', workflow_step_id: 'big-1' }), 'issue_refund', {
    order_id: 'O-2',
    amount: 600,
    currency: 'GBP',
  });
  const id = !r.ok ? (r.request_id ?? '') : '';
  const hash = (await gate.approvals.show(id, { tenant_id: 'tenant-a' })).envelope_sha256;
  const glass = await runCli(
    ['gate', 'approve', id, '--hash', hash, '--tenant', 'tenant-a', '--role', 'supervisor', '--break-glass', 'alice'],
    env,
  );
  t.not(lastJson(glass.stdout).ok, true, 'alice, breaking glass, does not approve alice’s refund');
  t.equal(await count(pool, 'actionledger.operations'), 0, 'nothing reserved');

  // Two approvers needed: alice votes with her token, then again breaking glass under her own name.
  const store = new PrincipalStore(config, pool);
  await store.add('sup-alice', 'person', '', 'test');
  await store.grant('sup-alice', 'tenant-a', 'supervisor', 'test');
  const token = (await store.createToken('sup-alice', 'tenant-a', '', 1, 'test')).token;
  const d = await gate.call(
    gctx({ principal_id: 'admin-1', role: 'admin', workflow_step_id: 'del-1' }),
    'delete_customer',
    { customer_id: 'C-1' },
  );
  const del = !d.ok ? (d.request_id ?? '') : '';
  const delHash = (await gate.approvals.show(del, { tenant_id: 'tenant-a' })).envelope_sha256;
  const first = await runCli(['gate', 'approve', del, '--hash', delHash], { ...env, ACTIONLEDGER_TOKEN: token });
  t.match(lastJson(first.stdout), { ok: true, status: 'pending_approvals' });
  const twice = await runCli(
    ['gate', 'approve', del, '--hash', delHash, '--tenant', 'tenant-a', '--role', 'supervisor'].concat([
      '--break-glass',
      'sup-alice',
    ]),
    env,
  );
  t.match(lastJson(twice.stdout), { ok: false, error: 'self_approval_forbidden' }, 'one person counts once');
  t.equal(await count(pool, 'actionledger.operations'), 0, 'still nothing reserved');
});

t.test('a token whose role was revoked with gate revoke-role engages no kill switch', async (t) => {
  const { gate, pool, url, config } = await gateFixture(t);
  const cfg = join(mkdtempSync(join(tmpdir(), 'al-acting-attacks-')), 'config.json');
  const api = { permissions: { kill_switch: ['operator'] } };
  writeFileSync(cfg, JSON.stringify({ tools: gateRoutes(), gate: gateSection(), api }));
  const env = { DATABASE_URL: url, ACTIONLEDGER_CONFIG: cfg, ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET };
  const store = new PrincipalStore(config, pool);
  await store.add('ops-1', 'person', '', 'test');
  await store.grant('ops-1', 'tenant-a', 'operator', 'test');
  const token = (await store.createToken('ops-1', 'tenant-a', '', 1, 'test')).token;
  await gate.revokeRole('tenant-a', 'ops-1', 'operator', 'security-team');
  const engaged = await runCli(['gate', 'kill-switch', 'engage', '--tool', 'issue_refund', '--reason', 'x'], {
    ...env,
    ACTIONLEDGER_TOKEN: token,
  });
  t.match(lastJson(engaged.stdout), { ok: false, error: 'permission_denied' });
  t.equal(await count(pool, 'actionledger.gate_kill_switches'), 0, 'nothing engaged');
});
