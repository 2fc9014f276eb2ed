/** Shared plumbing of the `actionledger` subcommands: output, refusals, exit codes. */
import { pino } from 'pino';
import { asActionLedgerError } from '../core/errors.js';

export interface Command {
  summary: string;
  usage: string;
  run(argv: string[]): Promise<number>;
}

export function printJson(value: unknown): void {
  process.stdout.write(JSON.stringify(value) + '\n');
}

/** Prints a refusal as one JSON line on stdout (what scripts read) and returns the exit code 1. */
export function printRefusal(err: unknown): number {
  const coded = asActionLedgerError(err);
  printJson(coded.toRefusal());
  // A coded failure is explained by its code and message; only the unexpected ones need their stack.
  if (coded.code === 'internal') process.stderr.write(`${(err as Error)?.stack ?? String(err)}\n`);
  else if (coded !== err) {
    // Set here only by asActionLedgerError, from sqlState(): a string or absent.
    const sqlstate = coded.details?.sqlstate;
    process.stderr.write(
      `actionledger: ${coded.code}${typeof sqlstate === 'string' ? ` (SQLSTATE ${sqlstate})` : ''}: ${(err as Error)?.message ?? String(err)}\n`,
    );
  }
  return 1;
}

export function usageError(command: string, message: string, usage: string): number {
  process.stderr.write(`actionledger ${command}: ${message}\n\nusage: ${usage}\n`);
  return 2;
}

export function table(rows: (string | number)[][]): string {
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
export function stderrLog(): pino.DestinationStream {
  return pino.destination({ fd: 2, sync: true });
}
