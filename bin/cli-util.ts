/**
 * Shared plumbing of the `actionledger` subcommands: the command shape (options, help, examples, exit
 * codes), argument parsing that turns every bad invocation into a one-line usage error, output, refusals.
 */
import { parseArgs } from 'node:util';
import { pino } from 'pino';
import { asActionLedgerError } from '../core/errors.js';
import { configProblemsText } from '../core/config-problems.js';
import { revealInLine, visibleJson } from '../core/visible-text.js';

/** Every exit code the command line uses; docs/cli.md holds the same table (a test compares them). */
export const EXIT = { ok: 0, refused: 1, usage: 2, providerUnreadable: 3 } as const;

export const EXIT_MEANINGS: Readonly<Record<number, string>> = {
  [EXIT.ok]: 'done',
  [EXIT.refused]:
    'refused (one JSON refusal on stdout), or a discrepancy found (verify), or an operation failed (reconcile); an unexpected failure also exits 1, with its stack on stderr',
  [EXIT.usage]:
    'usage error: unknown command or subcommand, unknown option, missing or bad value (one line on stderr, nothing on stdout)',
  [EXIT.providerUnreadable]:
    'a provider could not be read (reconcile --once: a readback failed; verify: a listing could not be read), and nothing else was wrong',
};

export interface OptionSpec {
  type: 'string' | 'boolean';
  /** The value's placeholder in usage lines (string options). */
  value?: string;
  description: string;
  /** What applies when the option is absent, as shown in help. */
  default?: string;
  /** Shown without brackets in usage; checked before anything runs unless the command says otherwise. */
  required?: boolean;
}

export type OptionSpecs = Readonly<Record<string, OptionSpec>>;

export interface Command {
  /** The words after `actionledger`, e.g. `status` or `gate kill-switch engage`. */
  name: string;
  summary: string;
  /** Positional arguments in usage lines, e.g. `OPERATION_ID`. */
  args?: string;
  /** Every option the command's parser accepts: parsing and help both come from here. */
  options: OptionSpecs;
  examples: readonly string[];
  exits: readonly number[];
  /** More lines of help after the summary. */
  notes?: string;
  subcommands?: ReadonlyMap<string, Command>;
  run(argv: string[]): Promise<number>;
}

export const JSON_OPTION: OptionSpec = {
  type: 'boolean',
  description: 'print one JSON document on stdout and nothing else',
  default: 'off',
};

/** `--json` on a command whose result is always JSON: accepted so scripts can pass it everywhere. */
export const JSON_ALWAYS: OptionSpec = {
  type: 'boolean',
  description: 'accepted for uniformity: the result is always one JSON document on stdout',
  default: 'on',
};

function optionUsage(name: string, o: OptionSpec): string {
  const flag = o.type === 'string' ? `--${name} ${o.value ?? 'VALUE'}` : `--${name}`;
  return o.required === true ? flag : `[${flag}]`;
}

export function usageLines(cmd: Command): string[] {
  if (cmd.subcommands !== undefined) return [...cmd.subcommands.values()].flatMap((s) => usageLines(s));
  const opts = Object.entries(cmd.options).sort(
    ([, a], [, b]) => Number(b.required === true) - Number(a.required === true),
  );
  const words = ['actionledger', cmd.name, ...(cmd.args === undefined ? [] : [cmd.args])];
  return [[...words, ...opts.map(([n, o]) => optionUsage(n, o))].join(' ')];
}

/** `usage: ` and the usage lines under each other. */
function usageBlock(cmd: Command): string {
  return usageLines(cmd)
    .map((l, i) => `${i === 0 ? 'usage: ' : '       '}${l}`)
    .join('\n');
}

export function helpText(cmd: Command): string {
  const out = [`actionledger ${cmd.name}: ${cmd.summary}`, ''];
  if (cmd.notes !== undefined) out.push(cmd.notes, '');
  out.push(usageBlock(cmd), '');
  if (cmd.subcommands !== undefined) {
    out.push('subcommands (each takes --help):');
    for (const [n, s] of cmd.subcommands) out.push(`  ${n.padEnd(14)} ${s.summary}`);
    out.push('');
  }
  const opts = Object.entries(cmd.options);
  if (opts.length > 0) {
    out.push('options:');
    for (const [n, o] of opts) {
      const flag = o.type === 'string' ? `--${n} ${o.value ?? 'VALUE'}` : `--${n}`;
      const tail = o.required === true ? ' [required]' : o.default === undefined ? '' : ` [default: ${o.default}]`;
      out.push(`  ${flag.padEnd(26)} ${o.description}${tail}`);
    }
    out.push('');
  }
  if (cmd.examples.length > 0) out.push('examples:', ...cmd.examples.map((e) => `  ${e}`), '');
  out.push('exit codes:', ...cmd.exits.map((c) => `  ${c}  ${EXIT_MEANINGS[c] ?? ''}`));
  return `${out.join('\n')}\n`;
}

/** One line on stderr naming the problem, then the usage lines; returns the exit code 2. */
export function usageError(cmd: Command, message: string): number {
  process.stderr.write(
    `actionledger ${cmd.name}: ${message}\n\n${usageBlock(cmd)}\n(actionledger help ${cmd.name} says more)\n`,
  );
  return EXIT.usage;
}

export interface Parsed {
  values: Record<string, string | boolean | undefined>;
  positionals: string[];
}

/** parseArgs's message, on one line, without its advice about positionals. */
function parseProblem(err: unknown): string {
  const message = ((err as Error)?.message ?? String(err)).split('\n')[0] ?? '';
  const ambiguous = /^Option '(--[a-z-]+)[^']*' argument is ambiguous/.exec(message);
  if (ambiguous !== null) {
    const flag = ambiguous[1] ?? '';
    return `${flag} takes a value; one starting with '-' is written ${flag}=VALUE`;
  }
  return message.replace(/\. To specify a positional.*$/, '');
}

/**
 * Parses argv against the command's declared options (strict: an unknown option, a missing value or a
 * value on a boolean is a usage error) and checks the required ones unless `checkRequired` is false.
 * Returns the exit code 2 (after printing the usage error) when argv is not a valid invocation.
 */
export function parseCommand(
  cmd: Command,
  argv: string[],
  opts: { positionals?: boolean; checkRequired?: boolean } = {},
): Parsed | number {
  let parsed: Parsed;
  try {
    parsed = parseArgs({
      args: argv,
      strict: true,
      allowPositionals: opts.positionals === true,
      options: Object.fromEntries(Object.entries(cmd.options).map(([n, o]) => [n, { type: o.type }])),
    });
  } catch (err) {
    return usageError(cmd, parseProblem(err));
  }
  if (opts.checkRequired !== false) {
    const missing = Object.entries(cmd.options)
      .filter(([n, o]) => o.required === true && (parsed.values[n] === undefined || parsed.values[n] === ''))
      .map(([n]) => `--${n}`);
    if (missing.length > 0) return usageError(cmd, `missing ${missing.join(', ')}`);
  }
  return parsed;
}

/** The string-valued options (booleans left out). */
export function stringValues(values: Parsed['values']): Record<string, string | undefined> {
  const out: Record<string, string | undefined> = {};
  for (const [k, v] of Object.entries(values)) if (typeof v === 'string') out[k] = v;
  return out;
}

/** An integer option within [min, max]: the number, undefined when absent, or a usage message. */
export function intOption(
  values: Parsed['values'],
  name: string,
  min: number,
  max: number,
): { value: number | undefined } | { problem: string } {
  const raw = values[name];
  if (raw === undefined) return { value: undefined };
  const n = typeof raw === 'string' && /^[0-9]+$/.test(raw) ? Number(raw) : NaN;
  if (!Number.isSafeInteger(n) || n < min || n > max)
    return { problem: `--${name} must be an integer from ${min} to ${max}, not ${JSON.stringify(raw)}` };
  return { value: n };
}

const DURATION_UNITS: Readonly<Record<string, number>> = { s: 1, m: 60, h: 3600, d: 86_400 };

/**
 * A duration option such as `30s`, `15m`, `2h` or `7d` (a positive integer and one unit, at most 3650 days), in
 * seconds: the number, undefined when absent, or a usage message.
 */
export function durationOption(
  values: Parsed['values'],
  name: string,
): { value: number | undefined } | { problem: string } {
  const raw = values[name];
  if (raw === undefined) return { value: undefined };
  const m = typeof raw === 'string' ? /^([1-9][0-9]{0,7})([smhd])$/.exec(raw) : null;
  const seconds = m === null ? NaN : Number(m[1]) * (DURATION_UNITS[m[2] ?? ''] ?? NaN);
  if (!Number.isSafeInteger(seconds) || seconds > 3650 * 86_400)
    return {
      problem: `--${name} must be a duration like 30s, 15m, 2h or 7d (at most 3650d), not ${JSON.stringify(raw)}`,
    };
  return { value: seconds };
}

/** Runs the subcommand named by argv[0], or answers with a usage error naming the choices. */
export function runSubcommand(parent: Command, argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
  const sub = lookup(parent.subcommands ?? new Map<string, Command>(), name);
  if (sub === undefined) {
    const choices = [...(parent.subcommands?.keys() ?? [])].join(', ');
    const what = name === undefined ? 'missing subcommand' : `unknown subcommand ${JSON.stringify(name)}`;
    return Promise.resolve(usageError(parent, `${what} (expected ${choices})`));
  }
  return sub.run(rest);
}

/** A command table lookup that only sees the table's own names (never `constructor`, `__proto__`, ...). */
export function lookup(table: ReadonlyMap<string, Command>, name: string | undefined): Command | undefined {
  return name === undefined ? undefined : table.get(name);
}

/**
 * The command the words of argv name, descending into subcommands as far as the words go, and the
 * arguments left for it.
 */
export function resolveCommand(
  table: ReadonlyMap<string, Command>,
  argv: string[],
): { cmd: Command; rest: string[] } | undefined {
  let cmd = lookup(table, argv[0]);
  if (cmd === undefined) return undefined;
  let i = 1;
  for (let next = cmd.subcommands && lookup(cmd.subcommands, argv[i]); next !== undefined;) {
    cmd = next;
    i++;
    next = cmd.subcommands && lookup(cmd.subcommands, argv[i]);
  }
  return { cmd, rest: argv.slice(i) };
}

/**
 * One JSON line on stdout. A character a terminal would draw as nothing, draw blank or reorder the text around
 * (core/visible-text.ts) is written as its JSON escape: the same value to a script, its code to a person.
 */
export function printJson(value: unknown): void {
  process.stdout.write(visibleJson(value) + '\n');
}

/**
 * Prints a refusal as one JSON line on stdout (what scripts read) and returns the exit code 1. A configuration
 * error is also written to stderr for people, one line per problem, unless the command runs with `--json`
 * (`options.json`; when a caller does not say, a `--json` among the process's options).
 */
export function printRefusal(err: unknown, options: { json?: boolean } = {}): number {
  const coded = asActionLedgerError(err);
  printJson(coded.toRefusal());
  const argv = process.argv.slice(2);
  const json = options.json ?? argv.slice(0, argv.includes('--') ? argv.indexOf('--') : undefined).includes('--json');
  const text = json ? null : configProblemsText(coded);
  if (text !== null) process.stderr.write(`actionledger: ${text}`);
  // A coded failure is explained by its code and message; only the unexpected ones need their stack.
  if (coded.code === 'internal') process.stderr.write(`${(err as Error)?.stack ?? String(err)}\n`);
  else if (coded !== err) {
    // Set here only by asActionLedgerError, from sqlState(): a string or absent.
    const sqlstate = coded.details?.sqlstate;
    process.stderr.write(
      `actionledger: ${coded.code}${typeof sqlstate === 'string' ? ` (SQLSTATE ${sqlstate})` : ''}: ${(err as Error)?.message ?? String(err)}\n`,
    );
  }
  return EXIT.refused;
}

/**
 * Rows as aligned columns, one line each: a hidden character in a cell is shown as its code, and so is a
 * newline (core/visible-text.ts), so a value (a reason) cannot forge a row.
 */
export function table(rawRows: (string | number)[][]): string {
  const rows = rawRows.map((r) => r.map((c) => (typeof c === 'number' ? c : revealInLine(c))));
  const widths = rows[0]?.map((_, i) => Math.max(...rows.map((r) => String(r[i] ?? '').length))) ?? [];
  return rows
    .map((r) =>
      r
        .map((c, i) => (typeof c === 'number' ? String(c).padStart(widths[i] ?? 0) : String(c).padEnd(widths[i] ?? 0)))
        .join('  ')
        .trimEnd(),
    )
    .join('\n');
}

/** CLI commands log to stderr, so stdout carries only their result. */
export function stderrLog(options: { daemon?: boolean } = {}): pino.DestinationStream {
  // Warnings and errors only: a command's output is its result, not the progress of opening a database. With
  // --verbose, or for a command that runs until stopped (`reconcile` on its schedule: its log is its output),
  // everything the configured log level lets through.
  const all = verbose || options.daemon === true;
  return pino.multistream([{ level: all ? 'trace' : 'warn', stream: pino.destination({ fd: 2, sync: true }) }]);
}

let verbose = false;

/** `--verbose` (any command): logs at the configured level on stderr instead of warnings and errors alone. */
export function setVerbose(on: boolean): void {
  verbose = on;
}

/**
 * The runtime options of a read-only command: no migrations (a schema behind `sql/` is refused with
 * `schema_not_migrated`), no effect-key secrets, no process metrics, logs as {@link stderrLog}.
 */
export function readOnlyRuntime(): {
  migrate: 'check';
  effectKeys: false;
  defaultMetrics: false;
  logDestination: pino.DestinationStream;
} {
  return { migrate: 'check', effectKeys: false, defaultMetrics: false, logDestination: stderrLog() };
}

/** Resolves once everything written to the stream so far has been handed to the OS (or the stream failed). */
function flushed(stream: NodeJS.WriteStream): Promise<void> {
  return new Promise((resolve) => {
    if (stream.destroyed || !stream.writable) return resolve();
    stream.once('error', () => resolve());
    stream.write('', () => resolve());
  });
}

/**
 * Exits with `code` once stdout and stderr hold nothing unwritten: `process.exit` alone drops what a pipe
 * has not yet taken (a reader slower than the writer sees the first 64 KiB and nothing more).
 */
export async function exitAfterOutput(code: number): Promise<never> {
  process.exitCode = code;
  await Promise.all([flushed(process.stdout), flushed(process.stderr)]);
  process.exit(code);
}
