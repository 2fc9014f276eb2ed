/**
 * `actionledger principal login-link` through the real CLI: it prints a one-time link (audited with who made
 * it) that starts one console session; a principal without a role, or unknown, gets no link.
 */
import t from 'tap';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AuditWriter } from '../../gate/index.js';
import { ConsoleSessions } from '../../principals/index.js';
import { LOGIN_LINK_COMMAND } from '../../server/console/plugin.js';
import { lastJson, runCli } from '../helpers/cli.js';
import { TEST_SECRET } from '../helpers/db.js';
import { auditRows, gateFixture, gateRoutes, gateSection } from '../helpers/gate.js';

t.test('login-link prints a one-time link that signs in once', async (t) => {
  const { config, pool, url } = await gateFixture(t);
  const cfg = join(mkdtempSync(join(tmpdir(), 'al-login-link-')), 'config.json');
  writeFileSync(cfg, JSON.stringify({ tools: gateRoutes(), gate: gateSection() }));
  const env = { DATABASE_URL: url, ACTIONLEDGER_CONFIG: cfg, ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET };
  const cli = (args: string[]) => runCli(args, env);
  const root = ['--break-glass', 'root'];

  t.equal((await cli(['principal', 'add', 'alice', '--kind', 'person', ...root])).code, 0);
  const roleless = await cli(['principal', 'login-link', 'alice', ...root]);
  t.equal(roleless.code, 1);
  t.match(lastJson(roleless.stdout), { ok: false, error: 'permission_denied' });
  const unknown = await cli(['principal', 'login-link', 'nobody', ...root]);
  t.match(lastJson(unknown.stdout), { ok: false, error: 'not_found' });

  await cli(['principal', 'grant', 'alice', '--tenant', 'tenant-a', '--role', 'supervisor', ...root]);
  const made = await cli(['principal', 'login-link', 'alice', '--url', 'https://ledger.example.com/', ...root]);
  t.equal(made.code, 0, made.stderr);
  const out = lastJson(made.stdout) as { ok: boolean; url: string; principal_id: string; expires_at: string };
  t.match(out, { ok: true, principal_id: 'alice', expires_at: String });
  const m = /^https:\/\/ledger\.example\.com\/console\/login\?link=([A-Za-z0-9_-]{43})$/.exec(out.url);
  t.ok(m, `the link: ${out.url}`);
  const defaulted = lastJson((await cli(['principal', 'login-link', 'alice', ...root])).stdout) as { url: string };
  t.match(defaulted.url, /^http:\/\/127\.0\.0\.1:7420\/console\/login\?link=/, 'the listener by default');
  // The command the sign-in page shows runs as written, its capitals filled in (no token set).
  const shown = LOGIN_LINK_COMMAND.replace('PRINCIPAL_ID', 'alice').replace('OPERATOR_NAME', 'root').split(' ');
  t.equal(shown[0], 'actionledger');
  const asShown = await cli(shown.slice(1));
  t.equal(asShown.code, 0, asShown.stderr);
  t.match(lastJson(asShown.stdout), { ok: true, principal_id: 'alice' }, 'the sign-in page’s command');
  t.match(lastJson((await cli(['principal', 'login-link', 'alice'])).stdout), { ok: false, error: 'unauthenticated' });

  const sessions = new ConsoleSessions(config, pool, new AuditWriter({ config, pool }));
  const started = await sessions.redeemLink(m?.[1] ?? '');
  t.equal(started.principal_id, 'alice');
  await t.rejects(sessions.redeemLink(m?.[1] ?? ''), { code: 'unauthenticated', details: { reason: 'used' } });
  const rows = await auditRows(pool, "action = 'token' AND outcome = 'login_link'");
  t.equal(rows.length, 3);
  t.match(rows[0], { principal_id: 'alice', detail: { by: 'break-glass:root' } });
  const { rows: stored } = await pool.query<{ link_sha256: string }>(
    'SELECT link_sha256 FROM actionledger.console_login_links',
  );
  t.notOk(
    stored.some((r) => r.link_sha256.includes(m?.[1] ?? '-')),
    'only the hash is stored',
  );
});
