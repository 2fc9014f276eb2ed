/** `actionledger principal slack-link|slack-unlink` as a real child process over a fresh database. */
import t from 'tap';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { baseToolConfig, ledgerFixture, TEST_SECRET } from '../helpers/db.js';
import { lastJson, runCli } from '../helpers/cli.js';

t.test('a Slack user is linked to a principal holding a role there, unlinked, and both are audited', async (t) => {
  const fx = await ledgerFixture(t);
  const dir = mkdtempSync(join(tmpdir(), 'al-slack-link-'));
  const cfg = join(dir, 'config.json');
  writeFileSync(cfg, JSON.stringify({ tools: baseToolConfig }));
  const env = {
    DATABASE_URL: fx.url,
    ACTIONLEDGER_CONFIG: cfg,
    ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET,
    LOG_LEVEL: 'warn',
  };
  const root = ['--break-glass', 'root'];
  const where = ['--tenant', 'tenant-a', '--team', 'T0TEAM', ...root];

  const early = await runCli(['principal', 'slack-link', 'alice', 'U0ALICE', ...where], env);
  t.equal(early.code, 1, 'a principal without a role in the tenant cannot be linked');
  t.equal(lastJson(early.stdout).error, 'not_found');

  t.equal((await runCli(['principal', 'add', 'alice', '--kind', 'person', ...root], env)).code, 0);
  t.equal(
    (await runCli(['principal', 'grant', 'alice', '--tenant', 'tenant-a', '--role', 'supervisor', ...root], env)).code,
    0,
  );
  const linked = await runCli(['principal', 'slack-link', 'alice', 'U0ALICE', ...where], env);
  t.equal(linked.code, 0, linked.stderr);
  t.same(lastJson(linked.stdout), {
    ok: true,
    principal_id: 'alice',
    tenant_id: 'tenant-a',
    slack_team_id: 'T0TEAM',
    slack_user_id: 'U0ALICE',
  });
  const rows = await fx.pool.query(
    'SELECT tenant_id, slack_team_id, slack_user_id, principal_id, linked_by FROM actionledger.notification_slack_users',
  );
  t.same(rows.rows, [
    {
      tenant_id: 'tenant-a',
      slack_team_id: 'T0TEAM',
      slack_user_id: 'U0ALICE',
      principal_id: 'alice',
      linked_by: 'break-glass:root',
    },
  ]);

  const bad = await runCli(['principal', 'slack-link', 'alice', 'not a slack id', ...where], env);
  t.equal(bad.code, 2, 'a malformed Slack id is a usage error');

  const unlinked = await runCli(['principal', 'slack-unlink', 'U0ALICE', ...where], env);
  t.equal(unlinked.code, 0, unlinked.stderr);
  t.equal(lastJson(unlinked.stdout).removed, true);
  t.equal((await fx.pool.query('SELECT 1 FROM actionledger.notification_slack_users')).rowCount, 0);
  const audit = await fx.pool.query<{ outcome: string; detail: Record<string, unknown> }>(
    "SELECT outcome, detail FROM actionledger.gate_audit WHERE action = 'principal' AND outcome LIKE 'slack_%' ORDER BY id",
  );
  t.same(
    audit.rows.map((r) => [r.outcome, r.detail.break_glass]),
    [
      ['slack_linked', true],
      ['slack_unlinked', true],
    ],
  );
});
