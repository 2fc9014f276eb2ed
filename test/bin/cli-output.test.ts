/**
 * What scripts read from `actionledger`: the whole output however large (the process exits only after stdout
 * is written out), and the exit codes of docs/cli.md's table, each produced by a real invocation.
 */
import t, { type Test } from 'tap';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { baseToolConfig, ctx, ledgerFixture, TEST_SECRET, type LedgerFixture } from '../helpers/db.js';
import { dispatchEnv } from '../helpers/fleet.js';
import { runCli } from '../helpers/cli.js';
import { allCommands } from '../../bin/commands/index.js';
import { EXIT_MEANINGS, table } from '../../bin/cli-util.js';

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));
const UNKNOWN_ID = '00000000-0000-4000-8000-000000000000';

/** A database and a configuration whose argument bound lets one operation's arguments outgrow a pipe buffer. */
async function cliEnv(t: Test): Promise<{ env: NodeJS.ProcessEnv; fx: LedgerFixture }> {
  const bounds = { arguments: { max_bytes: 1_000_000 } };
  const fx = await ledgerFixture(t, bounds);
  const dir = mkdtempSync(join(tmpdir(), 'al-cli-out-'));
  const cfg = join(dir, 'config.json');
  writeFileSync(cfg, JSON.stringify({ tools: baseToolConfig, ...bounds }));
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

/** The exit codes docs/cli.md's "Exit codes" table lists, in order. */
function documentedExitCodes(): number[] {
  const doc = readFileSync(join(ROOT, 'docs', 'cli.md'), 'utf8');
  const section = doc.split(/^## Exit codes$/m)[1]?.split(/^## /m)[0] ?? '';
  return [...section.matchAll(/^\|\s*(\d+)\s*\|.+\|$/gm)].map((m) => Number(m[1]));
}

t.test('a JSON document far larger than a pipe buffer arrives whole through a pipe', async (t) => {
  const { env, fx } = await cliEnv(t);
  const note = 'n'.repeat(300_000);
  const r = await fx.ledger.reserve(ctx({ workflow_step_id: 'big' }), 'issue_refund', {
    order_id: 'o-big',
    amount: 1,
    currency: 'EUR',
    note,
  });
  const out = await runCli(['show', r.operation_id, '--json'], env, { timeoutMs: 150_000 });
  t.equal(out.code, 0, out.stderr);
  t.ok(out.stdout.length > 300_000, `all of it: ${out.stdout.length} bytes, not a pipe buffer's worth`);
  const doc = JSON.parse(out.stdout) as { ok: boolean; operation: { arguments_json: { note: string } } };
  t.equal(doc.operation.arguments_json.note, note, 'the document parses and carries the arguments');
});

t.test('a table cell is one line: a newline or any control character in a value is shown as its code', async (t) => {
  const forged = 'maintenance\ntenant-b  send_email    op  all good';
  t.equal(
    table([
      ['tool', 'reason'],
      ['issue_refund', forged],
      ['x', 'tab\there, cr\r, esc\u001b[2J, nel\u0085, ls\u2028'],
    ]),
    [
      'tool          reason',
      'issue_refund  maintenance\\u000Atenant-b  send_email    op  all good',
      'x             tab\\u0009here, cr\\u000D, esc\\u001B[2J, nel\\u0085, ls\\u2028',
    ].join('\n'),
  );
  // As a command prints it: a reason written through the API (or the database) with a newline in it.
  const { env, fx } = await cliEnv(t);
  await fx.pool.query(
    "INSERT INTO actionledger.gate_kill_switches (tenant_id, tool_name, engaged_by, reason) VALUES ('tenant-a', 'issue_refund', 'op', $1)",
    [forged],
  );
  const out = await runCli(['gate', 'kill-switch', 'list'], env);
  t.equal(out.code, 0, out.stderr);
  const lines = out.stdout.trimEnd().split('\n');
  t.equal(lines.length, 2, 'the heading and one row: no forged row');
  t.match(lines[1], /maintenance\\u000Atenant-b/);
});

t.test("docs/cli.md's exit codes: the same table as the code, and each one produced", async (t) => {
  const documented = documentedExitCodes();
  t.same(documented, Object.keys(EXIT_MEANINGS).map(Number), 'docs/cli.md lists exactly the codes the CLI knows');
  t.same(
    [...new Set(allCommands().flatMap((c) => c.exits))].sort(),
    documented,
    'the commands declare no code the table lacks',
  );

  const e = await dispatchEnv(t);
  // Point the provider listings at a path the provider does not serve: verify cannot read them.
  const raw = JSON.parse(readFileSync(e.configPath, 'utf8')) as { tools: Record<string, Record<string, unknown>> };
  for (const tool of Object.values(raw.tools)) tool.effects_listing_url = `${e.provider.url}/v1/no-such-listing`;
  const unreadable = join(e.dir, 'unreadable-listings.json');
  writeFileSync(unreadable, JSON.stringify(raw));

  const produced = new Map<number, string>();
  const run = async (args: string[], env: NodeJS.ProcessEnv, expect: number): Promise<void> => {
    const r = await runCli(args, env, { timeoutMs: 150_000 });
    t.equal(r.code, expect, `actionledger ${args.join(' ')}: exit ${expect} (${r.stdout}${r.stderr})`);
    if (r.code !== null) produced.set(r.code, args.join(' '));
  };
  await run(['status', '--json'], e.env, 0);
  await run(['show', UNKNOWN_ID, '--json'], e.env, 1);
  await run(['status', '--bogus'], e.env, 2);
  await run(['verify', '--json'], { ...e.env, ACTIONLEDGER_CONFIG: unreadable }, 3);
  t.same([...produced.keys()].sort(), documented, 'every documented code is produced by a real invocation');
});
