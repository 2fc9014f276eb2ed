/** `--json`: one JSON document on stdout and nothing else, for every command that takes the option. */
import t, { type Test } from 'tap';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { baseToolConfig, ctx, ledgerFixture, TEST_SECRET, type LedgerFixture } from '../helpers/db.js';
import { runCli, type CliResult } from '../helpers/cli.js';
import { allCommands } from '../../bin/commands/index.js';

const UNKNOWN_ID = '00000000-0000-4000-8000-000000000000';

async function cliEnv(t: Test): Promise<{ env: NodeJS.ProcessEnv; fx: LedgerFixture }> {
  const fx = await ledgerFixture(t);
  const dir = mkdtempSync(join(tmpdir(), 'al-cli-json-'));
  const cfg = join(dir, 'config.json');
  writeFileSync(cfg, JSON.stringify({ tools: baseToolConfig }));
  return {
    fx,
    env: {
      DATABASE_URL: fx.url,
      ACTIONLEDGER_CONFIG: cfg,
      ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET,
      LOG_LEVEL: 'warn',
    },
  };
}

t.test('--json: one JSON document on stdout and nothing else, for every command that takes it', async (t) => {
  const { env, fx } = await cliEnv(t);
  const op = await fx.ledger.reserve(ctx(), 'issue_refund', { order_id: 'o-1', amount: 1, currency: 'EUR' });
  const dir = mkdtempSync(join(tmpdir(), 'al-cli-json-'));
  writeFileSync(join(dir, 'profile.json'), '{"profile_id":"p"}');
  const id = op.operation_id;
  const reserve = ['--tenant', 'tenant-a', '--principal', 'p', '--task', 'k', '--step', 's-2', '--approval', 'a'];
  const target = ['--tenant', 'tenant-a', '--tool', 'issue_refund', '--break-glass', 'oncall'];
  const role = ['--tenant', 'tenant-a', '--principal', 'p', '--role', 'agent', '--break-glass', 'security'];
  const reviewer = ['--tenant', 'tenant-a', '--role', 'supervisor', '--break-glass', 'a'];
  const root = ['--break-glass', 'root'];
  const grant = ['p-json', '--tenant', 'tenant-a', '--role', 'agent', ...root];
  const caller = ['--tenant', 'tenant-a', '--principal', 'p', '--role', 'agent', '--account', 'a', '--task', 'k'];
  const invocations: Record<string, string[]> = {
    migrate: [],
    status: [],
    reserve: [...reserve, '--policy', 'v', '--tool', 'issue_refund', '--args', '{"order_id":"o-2","amount":2}'],
    show: [id],
    reconcile: ['--once'],
    'review list': ['--reason', 'authorization:'],
    'review retry': ['--all', '--where-reason', 'authorization:', '--break-glass', 'carol', '--reason', 'x'],
    'review resolve-succeeded': [UNKNOWN_ID, '--break-glass', 'carol', '--reason', 'x', '--receipt', 're_1'],
    'review resolve-failed': [UNKNOWN_ID, '--break-glass', 'carol', '--reason', 'x'],
    'review compensate': [UNKNOWN_ID, '--break-glass', 'carol', '--reason', 'x'],
    verify: [],
    'profile keygen': ['--kind', 'ed25519', '--out-dir', join(dir, 'keys')],
    'profile sign': ['--profile', join(dir, 'profile.json'), '--key', join(dir, 'keys', 'profile-signing.key')],
    'profile verify': ['--profile', join(dir, 'profile.json'), '--signature', join(dir, 'none'), '--key', 'none'],
    'gate call': [...caller, '--step', 's-3', '--tool', 'issue_refund', '--args', '{"order_id":"o-3","amount":3}'],
    'gate confirm': ['no-such-token', ...caller, '--step', 's-4', '--turn', '2'],
    'gate execute': [UNKNOWN_ID, ...caller, '--step', 's-4'],
    'gate show': [UNKNOWN_ID, '--tenant', 'tenant-a'],
    'gate approve': [UNKNOWN_ID, '--hash', 'f'.repeat(64), ...reviewer],
    'gate reject': [UNKNOWN_ID, '--reason', 'no', ...reviewer],
    'gate kill-switch engage': [...target, '--reason', 'drill'],
    'gate kill-switch list': [],
    'gate kill-switch lift': target,
    'gate revoke-role': role,
    'gate restore-role': role,
    'gate expire': [],
    'principal add': ['p-json', '--kind', 'service', ...root],
    'principal grant': grant,
    'principal revoke': grant,
    'principal list': [],
    'principal login-link': ['p-json', ...root],
    'principal slack-link': ['p-json', 'U0JSON', '--tenant', 'tenant-a', '--team', 'T0JSON', ...root],
    'principal slack-unlink': ['U0JSON', '--tenant', 'tenant-a', '--team', 'T0JSON', ...root],
    'token create': ['p-json', '--tenant', 'tenant-a', ...root],
    'token revoke': [UNKNOWN_ID, ...root],
    'token list': [],
  };
  const withJson = allCommands().filter((c) => c.options.json !== undefined);
  t.same(withJson.map((c) => c.name).sort(), Object.keys(invocations).sort(), 'every command with --json is run here');
  // The kill switch is lifted after it is engaged; everything else may run at once.
  const lift = withJson.filter((c) => c.name === 'gate kill-switch lift');
  const rest = withJson.filter((c) => c.name !== 'gate kill-switch lift');
  const run = (name: string): Promise<CliResult> =>
    runCli([...name.split(' '), ...(invocations[name] ?? []), '--json'], env, { timeoutMs: 150_000 });
  const results = new Map<string, CliResult>();
  // Three at a time: each is a process that opens the database.
  for (let i = 0; i < rest.length; i += 3)
    await Promise.all(rest.slice(i, i + 3).map(async (c) => results.set(c.name, await run(c.name))));
  for (const c of lift) results.set(c.name, await run(c.name));
  for (const cmd of withJson) {
    const r = results.get(cmd.name) ?? { code: null, stdout: '', stderr: '' };
    const what = `${cmd.name} --json`;
    t.equal(r.stdout.split('\n').filter((l) => l !== '').length, 1, `${what}: one line (${r.stdout}${r.stderr})`);
    let doc: unknown;
    t.doesNotThrow(() => {
      doc = JSON.parse(r.stdout) as unknown;
    }, `${what}: stdout is one JSON document`);
    t.type((doc as { ok?: unknown })?.ok, 'boolean', `${what}: says whether it worked`);
    t.equal(r.code, (doc as { ok?: boolean })?.ok === true ? 0 : 1, `${what}: the exit code agrees with ok`);
  }
});
