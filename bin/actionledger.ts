#!/usr/bin/env node
/** The `actionledger` command. Each subcommand has `--help`. */
import { migrateCommand, reserveCommand, showCommand, statusCommand } from './commands/ledger.js';
import { dispatcherCommand, startCommand } from './commands/start.js';
import { profileCommand } from './commands/profile.js';
import { reconcileCommand, reviewCommand, verifyCommand } from './commands/reconcile.js';
import { gateCommand } from './commands/gate.js';
import type { Command } from './cli-util.js';

const commands: Record<string, Command> = {
  start: startCommand,
  migrate: migrateCommand,
  status: statusCommand,
  reserve: reserveCommand,
  show: showCommand,
  dispatcher: dispatcherCommand,
  profile: profileCommand,
  reconcile: reconcileCommand,
  review: reviewCommand,
  verify: verifyCommand,
  gate: gateCommand,
};

function help(): string {
  const lines = Object.entries(commands).map(([name, c]) => `  ${name.padEnd(10)} ${c.summary}`);
  return `actionledger: at-most-once, freshly authorized side effects on PostgreSQL\n\nusage: actionledger <command> [options]\n\n${lines.join('\n')}\n\nEvery command takes --help. Configuration: ACTIONLEDGER_CONFIG or ./actionledger.config.json.\n`;
}

async function main(argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
  if (name === undefined || name === '--help' || name === '-h' || name === 'help') {
    process.stdout.write(help());
    return name === undefined ? 2 : 0;
  }
  const command = commands[name];
  if (command === undefined) {
    process.stderr.write(`actionledger: unknown command ${JSON.stringify(name)}\n\n${help()}`);
    return 2;
  }
  if (rest.includes('--help') || rest.includes('-h')) {
    process.stdout.write(`${command.summary}\n\nusage: ${command.usage}\n`);
    return 0;
  }
  return command.run(rest);
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`${(err as Error)?.stack ?? String(err)}\n`);
    process.exit(1);
  },
);
