#!/usr/bin/env node
/** The `actionledger` command. `actionledger help COMMAND` and `COMMAND --help` describe each command. */
import { COMMANDS } from './commands/index.js';
import { EXIT, EXIT_MEANINGS, exitAfterOutput, helpText, resolveCommand, setVerbose } from './cli-util.js';

function overview(): string {
  const lines = [...COMMANDS.values()].map((c) => `  ${c.name.padEnd(10)} ${c.summary}`);
  const exits = Object.entries(EXIT_MEANINGS).map(([code, meaning]) => `  ${code}  ${meaning}`);
  return [
    'actionledger: at-most-once, freshly authorized side effects on PostgreSQL',
    '',
    'usage: actionledger <command> [options]',
    '       actionledger help <command> [<subcommand>]',
    '',
    ...lines,
    '',
    'Every command takes --help, and --verbose: its logs on stderr at the configured level (by default only',
    'warnings and errors). Configuration: ACTIONLEDGER_CONFIG or ./actionledger.config.json.',
    '',
    'exit codes:',
    ...exits,
    '',
  ].join('\n');
}

function unknownCommand(name: string): number {
  process.stderr.write(`actionledger: unknown command ${JSON.stringify(name)} (actionledger help lists them)\n`);
  return EXIT.usage;
}

/** `--verbose` anywhere before a `--` is the global flag; the rest is the command line. */
function withoutVerbose(argv: string[]): string[] {
  const end = argv.includes('--') ? argv.indexOf('--') : argv.length;
  const kept = argv.filter((a, i) => i >= end || a !== '--verbose');
  setVerbose(kept.length !== argv.length);
  return kept;
}

async function main(all: string[]): Promise<number> {
  const argv = withoutVerbose(all);
  const [name, ...rest] = argv;
  if (name === undefined) {
    process.stderr.write(`actionledger: missing command\n\n${overview()}`);
    return EXIT.usage;
  }
  if (name === '--help' || name === '-h') {
    process.stdout.write(overview());
    return EXIT.ok;
  }
  if (name === 'help') {
    if (rest.length === 0) {
      process.stdout.write(overview());
      return EXIT.ok;
    }
    const found = resolveCommand(COMMANDS, rest);
    if (found === undefined) return unknownCommand(rest[0] ?? '');
    if (found.rest.length > 0) {
      process.stderr.write(`actionledger help: ${found.cmd.name} has no subcommand ${JSON.stringify(found.rest[0])}\n`);
      return EXIT.usage;
    }
    process.stdout.write(helpText(found.cmd));
    return EXIT.ok;
  }
  const found = resolveCommand(COMMANDS, argv);
  if (found === undefined) return unknownCommand(name);
  // `--` ends the options: a `--help` after it is an argument, not a request for help.
  const options = found.rest.includes('--') ? found.rest.slice(0, found.rest.indexOf('--')) : found.rest;
  if (options.includes('--help') || options.includes('-h')) {
    process.stdout.write(helpText(found.cmd));
    return EXIT.ok;
  }
  return found.cmd.run(found.rest);
}

main(process.argv.slice(2)).then(exitAfterOutput, (err: unknown) => {
  process.stderr.write(`${(err as Error)?.stack ?? String(err)}\n`);
  return exitAfterOutput(EXIT.refused);
});
