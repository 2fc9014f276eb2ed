/**
 * `actionledger principal` and `actionledger token` through the real CLI: a principal is added, granted a
 * role, given a token (printed once, never listed with its hash), acts with it, loses its role (its pending
 * vote withdrawn), and its revoked token is refused by the next command.
 */
import t from 'tap';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { TEST_SECRET } from '../helpers/db.js';
import { lastJson, runCli } from '../helpers/cli.js';
import { auditRows, gateFixture, gateRoutes, gateSection, gctx } from '../helpers/gate.js';
import { tokenHash } from '../../principals/index.js';

t.test('principal and token lifecycle', async (t) => {
  const { gate, pool, url } = await gateFixture(t);
  const cfg = join(mkdtempSync(join(tmpdir(), 'al-principal-cli-')), 'config.json');
  writeFileSync(cfg, JSON.stringify({ tools: gateRoutes(), gate: gateSection() }));
  const env = { DATABASE_URL: url, ACTIONLEDGER_CONFIG: cfg, ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET };
  const root = ['--break-glass', 'root'];
  const cli = (args: string[], token?: string) =>
    runCli(args, token === undefined ? env : { ...env, ACTIONLEDGER_TOKEN: token });

  const anonymous = await cli(['principal', 'add', 'alice', '--kind', 'person']);
  t.equal(anonymous.code, 1, 'nobody named: refused');
  t.match(lastJson(anonymous.stdout), { ok: false, error: 'unauthenticated', message: /--break-glass NAME/ });
  t.equal((await cli(['principal', 'add', 'alice', '--kind', 'robot', ...root])).code, 2, 'a bad --kind: usage');

  const added = await cli(['principal', 'add', 'alice', '--kind', 'person', '--name', 'Alice Example', ...root]);
  t.equal(added.code, 0, added.stdout + added.stderr);
  t.match(lastJson(added.stdout), { ok: true, principal_id: 'alice', kind: 'person', added: true });
  t.match(lastJson((await cli(['principal', 'add', 'alice', '--kind', 'person', ...root])).stdout), {
    ok: true,
    added: false,
  });
  const granted = await cli(['principal', 'grant', 'alice', '--tenant', 'tenant-a', '--role', 'supervisor', ...root]);
  t.match(lastJson(granted.stdout), { ok: true, tenant_id: 'tenant-a', role: 'supervisor', granted: true });
  t.match(
    lastJson((await cli(['principal', 'grant', 'nobody', '--tenant', 'tenant-a', '--role', 'x', ...root])).stdout),
    {
      ok: false,
      error: 'not_found',
    },
  );

  const listed = await cli(['principal', 'list', '--json']);
  t.equal(listed.code, 0, listed.stderr);
  t.match(lastJson(listed.stdout), {
    ok: true,
    principals: [
      {
        principal_id: 'alice',
        kind: 'person',
        display_name: 'Alice Example',
        roles: [{ tenant_id: 'tenant-a', role: 'supervisor' }],
      },
    ],
  });
  t.same(lastJson((await cli(['principal', 'list', '--tenant', 'tenant-b', '--json'])).stdout), {
    ok: true,
    principals: [],
  });
  t.match((await cli(['principal', 'list'])).stdout, /alice\s+person\s+Alice Example\s+tenant-a:supervisor/);

  // Created as break-glass, shown once: in the JSON document, or in the table on stdout.
  const made = await cli(['token', 'create', 'alice', '--tenant', 'tenant-a', '--ttl-days', '7', '--json', ...root]);
  t.equal(made.code, 0, made.stdout + made.stderr);
  const created = lastJson(made.stdout) as { token: string; token_id: string; expires_at: string };
  t.match(created, { ok: true, principal_id: 'alice', tenant_id: 'tenant-a', token: /^alt_[A-Za-z0-9_-]{43}$/ });
  const days = (Date.parse(created.expires_at) - Date.now()) / 86_400_000;
  t.ok(days > 6.9 && days <= 7, `expires in 7 days (${days})`);
  const second = await cli(['token', 'create', 'alice', '--tenant', 'tenant-a', '--name', 'laptop', ...root]);
  t.equal(second.code, 0, second.stderr);
  const secondToken = /^token\s+(alt_\S+)$/m.exec(second.stdout)?.[1] ?? '';
  t.match(second.stdout, /^token_id\s+[0-9a-f-]{36}$/m, 'the table gives its id');
  t.match(second.stdout, /^expires_at\s+\d{4}-/m, 'and its expiry');
  t.match(second.stderr, /shown this once/);
  t.match(lastJson((await cli(['token', 'create', 'alice', '--tenant', 'tenant-b', ...root])).stdout), {
    ok: false,
    error: 'permission_denied',
  });

  const tokens = await cli(['token', 'list', '--principal', 'alice', '--json']);
  t.equal(tokens.code, 0, tokens.stderr);
  const rows = (lastJson(tokens.stdout) as { tokens: Record<string, unknown>[] }).tokens;
  t.equal(rows.length, 2);
  t.match(rows[0], { token_id: created.token_id, principal_id: 'alice', tenant_id: 'tenant-a', active: true });
  const table = (await cli(['token', 'list'])).stdout;
  for (const out of [tokens.stdout, table]) {
    for (const secret of [created.token, secondToken, tokenHash(created.token), tokenHash(secondToken)])
      t.notOk(out.includes(secret), 'neither a token nor its hash is listed');
    t.notMatch(out, /sha256|hash/i);
  }

  // Acting with the token: the actor is alice; a --tenant that disagrees with the token is refused.
  const bob = await cli(['principal', 'add', 'bob', '--kind', 'person'], created.token);
  t.match(lastJson(bob.stdout), { ok: true, added: true });
  const other = await cli(['principal', 'grant', 'bob', '--tenant', 'tenant-b', '--role', 'supervisor'], created.token);
  t.equal(other.code, 1);
  t.match(lastJson(other.stdout), { ok: false, error: 'invalid_request', message: /--tenant/ });
  const both = await cli(['principal', 'add', 'carol', '--kind', 'person', ...root], created.token);
  t.match(lastJson(both.stdout), { ok: false, error: 'invalid_request', message: /--break-glass/ });
  t.match(await auditRows(pool, "action = 'principal'"), [
    { outcome: 'added', principal_id: 'alice', detail: { by: 'break-glass:root', break_glass: true } },
    { outcome: 'added', principal_id: 'alice', detail: { by: 'break-glass:root', break_glass: true } },
    { outcome: 'added', principal_id: 'bob', detail: { by: 'alice' } },
  ]);
  t.notOk(
    'break_glass' in ((await auditRows(pool, "action = 'principal' AND principal_id = 'bob'"))[0]?.detail as object),
    'a token-made change is not marked break-glass',
  );

  // alice's pending vote on a two-approver approval is withdrawn with her role.
  const held = await gate.call(gctx({ role: 'admin', workflow_step_id: 'del-1' }), 'delete_customer', {
    customer_id: 'C-1',
  });
  const approvalId = !held.ok ? (held.request_id ?? '') : '';
  const view = await gate.approvals.show(approvalId, { tenant_id: 'tenant-a' });
  const vote = await cli(['gate', 'approve', approvalId, '--hash', view.envelope_sha256], created.token);
  t.match(lastJson(vote.stdout), { ok: true, status: 'pending_approvals' });
  // The role each vote was cast with, beside its approver (sql/0008): set here, so that what is tested is the
  // command's report of the withdrawn votes whichever version of the gate recorded the vote.
  await pool.query(
    "UPDATE actionledger.gate_approvals SET approver_roles = '{supervisor}' WHERE approval_id = $1 AND approvers = '{alice}'",
    [approvalId],
  );
  const revoked = await cli(['principal', 'revoke', 'alice', '--tenant', 'tenant-a', '--role', 'supervisor', ...root]);
  t.equal(revoked.code, 0, revoked.stdout + revoked.stderr);
  t.match(lastJson(revoked.stdout), { ok: true, principal_id: 'alice', votes_withdrawn: [approvalId] });
  t.same((await gate.approvals.show(approvalId, { tenant_id: 'tenant-a' })).approvers, []);

  // A revoked token is refused by the next command; nothing is done with it.
  const gone = await cli(['token', 'revoke', created.token_id, ...root]);
  t.match(lastJson(gone.stdout), { ok: true, token_id: created.token_id, revoked: true });
  const refused = await cli(['principal', 'add', 'dave', '--kind', 'person'], created.token);
  t.equal(refused.code, 1);
  t.match(lastJson(refused.stdout), { ok: false, error: 'unauthenticated', details: { reason: 'revoked' } });
  const names = (
    lastJson((await cli(['principal', 'list', '--json'])).stdout).principals as { principal_id: string }[]
  ).map((p) => p.principal_id);
  t.same(names, ['alice', 'bob'], 'dave was not added');
  t.match(lastJson((await cli(['token', 'list', '--principal', 'alice', '--json'])).stdout), {
    tokens: [{ token_id: created.token_id, active: false, revoked_at: /./ }, { active: true }],
  });
  t.match(lastJson((await cli(['token', 'revoke', created.token_id, ...root])).stdout), { ok: true, revoked: false });
  t.match(lastJson((await cli(['token', 'revoke', '00000000-0000-4000-8000-000000000000', ...root])).stdout), {
    ok: false,
    error: 'not_found',
  });
});
