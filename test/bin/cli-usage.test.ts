/**
 * `actionledger` as an operator meets it: every bad invocation is a one-line usage error (exit 2, no stack
 * trace), and every command and subcommand has help naming each option it parses, an example and its exit
 * codes. The option lists come from the commands' own tables, which are also what their parsers accept.
 */
import t from 'tap';
import { readdirSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { runCli } from '../helpers/cli.js';
import { allCommands, COMMANDS } from '../../bin/commands/index.js';
import { helpText, resolveCommand, usageLines, type Command } from '../../bin/cli-util.js';

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));
// A database nobody listens on: an invocation wrongly accepted fails (exit 1), it never hangs or starts one.
const ENV = { DATABASE_URL: 'postgres://nobody@127.0.0.1:1/none', ACTIONLEDGER_CONFIG: '/nonexistent/config.json' };
const STACK = /^\s+at /m;

/** Through the real CLI (each is a process start: a handful, covering every kind of mistake). */
const BAD: [string[], RegExp][] = [
  [[], /missing command/],
  [['constructor'], /unknown command "constructor"/],
  [['__proto__'], /unknown command "__proto__"/],
  [['toString'], /unknown command "toString"/],
  [['help', 'constructor'], /unknown command "constructor"/],
  [['status', '--bogus'], /--bogus/],
  [['show', '--bogus'], /--bogus/],
  [['dispatcher', '--concurrency', '-1'], /--concurrency/],
  [['dispatcher', '--concurrency', '1.5'], /--concurrency must be an integer/],
  [['start', '--workers', '65'], /--workers must be an integer from 0 to 64/],
  [['reserve', '--tool', 'issue_refund'], /missing --tenant/],
  [['gate', 'toString'], /unknown subcommand "toString"/],
  [['gate', 'kill-switch', 'engage', '--tenant', 't', '--tool', '*', '--actor', 'a'], /missing --reason/],
  [['profile', 'frob'], /unknown subcommand "frob"/],
  [['hasOwnProperty', '--json'], /unknown command/],
  [['nope'], /unknown command "nope"/],
  [['help', 'gate', 'nope'], /no subcommand "nope"/],
];

/** The same checks, run in this process through the same command table (no process start each). */
const BAD_HERE: [string[], RegExp][] = [
  [['status', 'extra'], /extra/],
  [['status', '--json=yes'], /--json/],
  [['show'], /OPERATION_ID/],
  [['show', 'a', 'b'], /OPERATION_ID/],
  [['migrate', '--force'], /--force/],
  [['verify', '--all'], /--all/],
  [['reserve', '--tenant'], /--tenant/],
  [['dispatcher', '--concurrency=-1'], /--concurrency must be an integer from 1 to 1024/],
  [['dispatcher', '--concurrency', '0'], /--concurrency must be an integer/],
  [['dispatcher', '--concurrency', 'lots'], /--concurrency must be an integer/],
  [['dispatcher', '--concurrency', '99999'], /--concurrency must be an integer/],
  [['dispatcher', '--concurrency', ''], /--concurrency must be an integer/],
  [['dispatcher', '--workers', '2'], /--workers/],
  [['start', '--workers', '-1'], /--workers/],
  [['start', '--workers', '1e3'], /--workers must be an integer/],
  [['start', '--concurrency', '0x10'], /--concurrency must be an integer/],
  [['start', '--bogus'], /--bogus/],
  [['reconcile', '--json'], /--json goes with --once/],
  [['reconcile', '--twice'], /--twice/],
  [['review'], /missing subcommand \(expected list, retry, resolve-succeeded, resolve-failed, compensate\)/],
  [['review', 'undo', 'id', '--actor', 'a', '--reason', 'r'], /unknown subcommand "undo"/],
  [['review', 'retry', 'id', '--receipt', 'r'], /--receipt/],
  [['review', 'retry', 'id', '--bogus'], /--bogus/],
  [['review', 'retry'], /expected one OPERATION_ID/],
  [['review', 'retry', 'a', 'b'], /expected one OPERATION_ID/],
  [['review', 'retry', 'id', '--where-reason', 'x:'], /--where-reason go with --all only/],
  [['review', 'retry', 'id', '--dry-run'], /--dry-run go with --all only/],
  [['review', 'retry', '--all', '--actor', 'a', '--reason', 'r'], /--all needs --where-reason/],
  [['review', 'retry', '--all', '--tool', 'issue_refund', '--dry-run'], /--all needs --where-reason/],
  [['review', 'retry', 'id', '--all', '--where-reason', 'x:', '--actor', 'a', '--reason', 'r'], /no OPERATION_ID/],
  [['review', 'retry', '--all', '--where-reason', 'x:', '--approval', 'ap'], /--approval and --policy go with one/],
  [['review', 'retry', '--all', '--where-reason', 'x:', '--break-glass', 'a'], /missing --reason/],
  [['review', 'retry', '--all', '--where-reason', '', '--dry-run'], /--where-reason must not be empty/],
  [['review', 'retry', '--all', '--where-reason', 'x:', '--older-than', '2w', '--dry-run'], /--older-than must be/],
  [['review', 'resolve-failed', 'id', '--receipt', 'r'], /--receipt/],
  [['review', 'list', 'extra'], /extra/],
  [['review', 'list', '--older-than', '15'], /--older-than must be a duration/],
  [['review', 'list', '--older-than', '0s'], /--older-than must be a duration/],
  [['review', 'list', '--older-than', '-5m'], /--older-than/],
  [['review', 'list', '--limit', '0'], /--limit must be an integer from 1 to 10000/],
  [['review', 'list', '--limit', 'all'], /--limit must be an integer/],
  [['review', 'list', '--by', 'color'], /--by must be one of reason, tool, tenant/],
  [['review', 'list', '--by', 'reason', '--limit', '5'], /--limit does not go with --by/],
  [['review', 'list', '--where-reason', 'x'], /--where-reason/],
  [['profile'], /missing subcommand/],
  [['profile', 'keygen', '--kind', 'rsa', '--out-dir', '/nonexistent/keys'], /--kind must be/],
  [['profile', 'sign', '--profile', 'p'], /missing --key/],
  [['gate'], /missing subcommand/],
  [['gate', 'show', '--tenant', 't'], /APPROVAL_ID/],
  [
    ['gate', 'call', '--tenant', 't', '--tool', 'x', '--args', '{}'],
    /missing --principal, --role, --account, --task, --step/,
  ],
  [['gate', 'confirm', '--turn', '2'], /missing --tenant, --principal, --role, --account, --task, --step/],
  [['gate', 'execute', '--tenant', 't', '--args'], /--args/],
  [['gate', 'show', 'id'], /missing --tenant/],
  [['gate', 'show', 'id', '--tenant', 't', '--hash', 'h'], /--hash/],
  [['gate', 'approve', 'id'], /missing --hash/],
  [['gate', 'approve', 'id', '--hash', 'h', '--break-glass', 'a'], /missing --tenant, --role \(with --break-glass/],
  [
    ['gate', 'approve', 'id', '--hash', 'h', '--tenant', 't', '--role', 'r', '--break-glass', ''],
    /--break-glass is empty/,
  ],
  [['gate', 'kill-switch', 'lift', '--tool', '*', '--break-glass', 'a'], /missing --tenant \(with --break-glass/],
  [['gate', 'reject', 'id', '--tenant', 't', '--approver', 'a', '--role', 'r'], /missing --reason/],
  [['gate', 'kill-switch'], /missing subcommand/],
  [['gate', 'kill-switch', 'lift', '--tenant', 't', '--tool', '*', '--actor', 'a', '--reason', 'r'], /--reason/],
  [['gate', 'kill-switch', 'list', 'extra'], /extra/],
  [['gate', 'revoke-role', '--tenant', 't'], /missing --principal, --role$/],
  [['principal'], /missing subcommand \(expected add, grant, revoke, list, login-link, slack-link, slack-unlink\)/],
  [['principal', 'add', '--kind', 'person'], /expected one PRINCIPAL_ID/],
  [['principal', 'add', 'p', '--kind', 'robot'], /--kind must be service or person/],
  [['principal', 'grant', 'p', '--role', 'r'], /missing --tenant/],
  [['principal', 'list', 'extra'], /extra/],
  [['token', 'create', 'p', '--tenant', 't', '--ttl-days', '0'], /--ttl-days must be an integer from 1 to 3650/],
  [['token', 'create', 'p', 'q', '--tenant', 't'], /expected one PRINCIPAL_ID/],
  [['token', 'revoke'], /expected one TOKEN_ID/],
  [['token', 'list', '--hash'], /--hash/],
  [['gate', 'expire', '--now'], /--now/],
];

/** Runs `fn` over `items`, `limit` at a time, results in order. */
async function mapLimit<T, R>(items: readonly T[], limit: number, fn: (item: T) => Promise<R>): Promise<R[]> {
  const out: R[] = [];
  let next = 0;
  const worker = async (): Promise<void> => {
    for (let i = next++; i < items.length; i = next++) out[i] = await fn(items[i] as T);
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return out;
}

/** Runs a command in this process and returns its exit code and what it wrote to stderr (usage errors only). */
async function runHere(cmd: Command, argv: string[]): Promise<{ code: number; stderr: string }> {
  const write = process.stderr.write.bind(process.stderr);
  let stderr = '';
  const capture = (chunk: string | Uint8Array): boolean => {
    stderr += String(chunk);
    return true;
  };
  process.stderr.write = capture;
  try {
    return { code: await cmd.run(argv), stderr };
  } finally {
    process.stderr.write = write;
  }
}

t.test('bad invocations: exit 2, one line naming the problem, no stack trace, nothing on stdout', async (t) => {
  const results = await mapLimit(BAD, 4, ([args]) => runCli(args, ENV));
  BAD.forEach(([args, message], i) => {
    const r = results[i] ?? { code: null, stdout: '', stderr: '' };
    const what = `actionledger ${args.join(' ')}`;
    t.equal(r.code, 2, `${what}: exit 2 (${r.stderr})`);
    t.match(r.stderr.split('\n')[0], message, `${what}: the first line names the problem`);
    t.notMatch(r.stderr, STACK, `${what}: no stack trace`);
    t.notMatch(r.stderr, /TypeError|is not a function/, `${what}: no crash`);
    t.equal(r.stdout, '', `${what}: nothing on stdout`);
  });
  for (const [args, message] of BAD_HERE) {
    const found = resolveCommand(COMMANDS, args);
    const what = `actionledger ${args.join(' ')}`;
    if (found === undefined) {
      t.fail(`${what}: names a command`);
      continue;
    }
    const r = await runHere(found.cmd, found.rest);
    t.equal(r.code, 2, `${what}: exit 2 (${r.stderr})`);
    t.match(r.stderr.split('\n')[0], message, `${what}: the first line names the problem`);
    t.notMatch(r.stderr, STACK, `${what}: no stack trace`);
  }
});

/** The words after `actionledger` that name a command. */
const words = (name: string): string[] => name.split(' ');

t.test('every command and subcommand: help with every option, an example and the exit codes', (t) => {
  const all = allCommands();
  t.ok(all.length >= COMMANDS.size + 10, 'subcommands included');
  for (const cmd of all) {
    const text = helpText(cmd);
    t.match(text, new RegExp(`^actionledger ${cmd.name}: `), `${cmd.name}: its own help, not its parent's`);
    for (const [name, o] of Object.entries(cmd.options)) {
      const line = text.split('\n').find((l) => l.startsWith(`  --${name} `) || l === `  --${name}`);
      t.ok(line, `${cmd.name}: --${name} has a line in the help`);
      t.ok((line ?? '').trim().length > `--${name}`.length + 10, `${cmd.name}: --${name} says what it means`);
      if (o.required === true) t.match(line, /\[required\]/, `${cmd.name}: --${name} is marked required`);
      else t.match(line, /\[default: [^\]]+\]/, `${cmd.name}: --${name} says its default`);
    }
    t.match(text, new RegExp(`\\nexamples:\\n  actionledger ${cmd.name}[ \\n]`), `${cmd.name}: at least one example`);
    for (const code of cmd.exits) t.match(text, new RegExp(`\\nexit codes:\\n(  \\d .*\\n)*  ${code} `));
  }
  t.end();
});

t.test('help through the real CLI: `help COMMAND` and `COMMAND --help` print the help of that command', async (t) => {
  const names = ['status', 'gate kill-switch', 'gate kill-switch engage', 'profile sign'];
  const all = new Map(allCommands().map((c) => [c.name, c]));
  const runs = await mapLimit(names, 4, async (name) => [
    await runCli(['help', ...words(name)], ENV),
    await runCli([...words(name), '--help'], ENV),
  ]);
  names.forEach((name, i) => {
    const expected = helpText(all.get(name) as Command);
    for (const r of runs[i] ?? []) {
      t.equal(r.code, 0, `${name}: help exits 0`);
      t.equal(r.stdout, expected, `${name}: its own help on stdout`);
      t.equal(r.stderr, '');
    }
  });
  const overview = await runCli(['help'], ENV);
  t.equal(overview.code, 0);
  for (const c of COMMANDS.values()) t.match(overview.stdout, new RegExp(`\\n  ${c.name} +${c.summary.slice(0, 20)}`));
});

t.test('required options are never shown as optional, and leaving one out is a usage error', async (t) => {
  const positionals: Record<string, string[]> = {
    show: ['id'],
    'review retry': ['id'],
    'review resolve-succeeded': ['id'],
    'review resolve-failed': ['id'],
    'review compensate': ['id'],
    'gate confirm': ['token'],
    'gate execute': ['id'],
    'gate show': ['id'],
    'gate approve': ['id'],
    'gate reject': ['id'],
    'principal add': ['id'],
    'principal grant': ['id'],
    'principal revoke': ['id'],
    'principal slack-link': ['id', 'U0SLACK'],
    'principal slack-unlink': ['U0SLACK'],
    'token create': ['id'],
  };
  for (const cmd of allCommands().filter((c) => c.subcommands === undefined)) {
    const [usage = ''] = usageLines(cmd);
    const required = Object.entries(cmd.options).filter(([, o]) => o.required === true);
    for (const [name] of required) {
      t.notMatch(usage, new RegExp(`\\[--${name}[ \\]]`), `${cmd.name}: --${name} is not bracketed in the usage`);
      t.match(usage, new RegExp(` --${name} `), `${cmd.name}: --${name} is in the usage`);
      // review records a missing reason as an audited refusal (docs/cli.md): not a usage error.
      if (cmd.name.startsWith('review ')) continue;
      const others = required.filter(([n]) => n !== name).flatMap(([n]) => [`--${n}`, 'x']);
      const r = await runHere(cmd, [...(positionals[cmd.name] ?? []), ...others]);
      t.equal(r.code, 2, `${cmd.name} without --${name}: usage error`);
      t.match(r.stderr, new RegExp(`missing --${name}\\b`), `${cmd.name}: the message names --${name}`);
    }
  }
});

t.test('no command parses argv on its own: every parser reads the options its help lists', (t) => {
  const dir = join(ROOT, 'bin', 'commands');
  for (const file of readdirSync(dir).filter((f) => f.endsWith('.ts'))) {
    t.notMatch(readFileSync(join(dir, file), 'utf8'), /parseArgs/, `${file} parses through parseCommand`);
  }
  t.end();
});
