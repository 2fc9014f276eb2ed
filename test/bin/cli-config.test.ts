/**
 * A broken configuration as an operator meets it through the real `actionledger` binary: every problem at once,
 * on stderr one line per problem under a heading (exit 1, the refusal's code, no stack trace), and with `--json`
 * only the structured document on stdout.
 */
import t from 'tap';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { lastJson, runCli } from '../helpers/cli.js';
import { BROKEN_CONFIG, BROKEN_PATHS } from '../helpers/broken-config.js';
import { EXIT } from '../../bin/cli-util.js';

const STACK = /^\s+at /m;
const dir = mkdtempSync(join(tmpdir(), 'al-cli-config-'));
const broken = join(dir, 'broken.json');
writeFileSync(broken, JSON.stringify(BROKEN_CONFIG, null, 2));
const notJson = join(dir, 'not-json.json');
writeFileSync(notJson, '{"tools": {}, "tools": {}}');
// A database nobody listens on: the configuration is refused before anything is opened.
const env = (config: string): NodeJS.ProcessEnv => ({
  DATABASE_URL: 'postgres://nobody@127.0.0.1:1/none',
  ACTIONLEDGER_CONFIG: config,
});

/** The lines the readable form is expected to hold, among the ten (each a problem of BROKEN_CONFIG). */
const EXPECTED_LINES = [
  '  dispach: is not a known key (did you mean "dispatcher"?)',
  '  dispatcher.workers: must be >= 1 (got 0)',
  '  gate.tools.issue_refund.approval.mode: must be one of: auto, threshold, always, confirm (got "alwyas"; did you mean "always"?)',
  '  tools.issue_refund.compensation.tool: names "void_refnd", which /tools does not declare (did you mean "void_refund"?)',
  '  gate.tools.issue_refnd: has no provider route in /tools (did you mean "issue_refund"?)',
  '  effect_keys.active: names key "k2", which /effect_keys/keys does not declare (did you mean "k1"?)',
  '  reconciler.backoff_max_ms: must be at least backoff_initial_ms',
];

for (const argv of [['migrate'], ['status'], ['start', '--workers', '0']]) {
  t.test(`${argv.join(' ')}: a heading and one line per problem on stderr, the refusal on stdout`, async (t) => {
    const r = await runCli(argv, env(broken));
    t.equal(r.code, EXIT.refused, r.stderr);
    t.notMatch(r.stderr, STACK, 'no stack trace');
    const lines = r.stderr.split('\n').filter((l) => l !== '');
    const heading = lines.findIndex((l) => l.startsWith('actionledger: configuration '));
    t.equal(
      lines[heading],
      `actionledger: configuration ${broken} is invalid (${BROKEN_PATHS.length} problems):`,
      'the heading names the file and the count',
    );
    const listed = lines.slice(heading + 1, heading + 1 + BROKEN_PATHS.length);
    t.ok(
      listed.every((l) => l.startsWith('  ') && !l.includes('\\n')),
      'one indented line per problem, no escapes',
    );
    for (const line of EXPECTED_LINES) t.ok(listed.includes(line), line.trim());
    const refusal = lastJson(r.stdout) as { error: string; details: { issues: { path: string }[] } };
    t.equal(refusal.error, 'config_invalid');
    t.same(refusal.details.issues.map((i) => i.path).sort(), [...BROKEN_PATHS].sort());
  });
}

t.test('status --json: the structured document on stdout, no text list', async (t) => {
  const r = await runCli(['status', '--json'], env(broken));
  t.equal(r.code, EXIT.refused);
  const doc = JSON.parse(r.stdout) as {
    ok: boolean;
    error: string;
    details: { file: string; problems: string[]; issues: Record<string, unknown>[] };
  };
  t.match(doc, { ok: false, error: 'config_invalid', details: { file: broken } });
  t.equal(doc.details.problems.length, BROKEN_PATHS.length);
  t.match(
    doc.details.issues.find((i) => i.path === '/gate/tools/issue_refund/approval/mode'),
    { got: 'alwyas', allowed: ['auto', 'threshold', 'always', 'confirm'], suggestion: 'always' },
  );
  t.notMatch(r.stderr, /did you mean|is invalid \(/, 'the list is not repeated on stderr');
});

t.test('every command that takes --json: only the document then; the list without it', async (t) => {
  for (const argv of [['verify'], ['gate', 'kill-switch', 'list']]) {
    const json = await runCli([...argv, '--json'], env(broken));
    t.equal(json.code, EXIT.refused, `${argv.join(' ')} --json`);
    t.match(JSON.parse(json.stdout), { ok: false, error: 'config_invalid' }, 'one JSON document on stdout');
    t.notMatch(json.stderr, /did you mean/, `${argv.join(' ')} --json: no list on stderr`);
    const text = await runCli(argv, env(broken));
    t.equal(text.code, EXIT.refused);
    t.match(
      text.stderr,
      /^ {2}dispach: is not a known key \(did you mean "dispatcher"\?\)$/m,
      `${argv.join(' ')}: the list`,
    );
  }
});

t.test('a file that is not strict JSON: one line saying so', async (t) => {
  const r = await runCli(['migrate'], env(notJson));
  t.equal(r.code, EXIT.refused);
  t.match(
    r.stderr,
    /^actionledger: configuration .*not-json\.json is invalid \(1 problem\):\n {2}is not strict JSON: .*tools/m,
  );
  t.match(lastJson(r.stdout), { ok: false, error: 'config_invalid' });
  t.notMatch(r.stderr, STACK);
});
