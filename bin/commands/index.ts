/** The table of `actionledger` commands, in the order `actionledger help` lists them. */
import type { Command } from '../cli-util.js';
import { migrateCommand, reserveCommand, showCommand, statusCommand } from './ledger.js';
import { dispatcherCommand, startCommand } from './start.js';
import { profileCommand } from './profile.js';
import { reconcileCommand, verifyCommand } from './reconcile.js';
import { reviewCommand } from './review.js';
import { gateCommand } from './gate.js';
import { principalCommand } from './principal.js';
import { tokenCommand } from './token.js';
import { mcpCommand } from './mcp.js';

export const COMMANDS: ReadonlyMap<string, Command> = new Map(
  [
    startCommand,
    migrateCommand,
    statusCommand,
    reserveCommand,
    showCommand,
    dispatcherCommand,
    profileCommand,
    reconcileCommand,
    reviewCommand,
    verifyCommand,
    gateCommand,
    principalCommand,
    tokenCommand,
    mcpCommand,
  ].map((c) => [c.name, c]),
);

/** Every command and subcommand, depth first. */
export function allCommands(table: ReadonlyMap<string, Command> = COMMANDS): Command[] {
  return [...table.values()].flatMap((c) => [c, ...(c.subcommands === undefined ? [] : allCommands(c.subcommands))]);
}
