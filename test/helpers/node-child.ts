/**
 * How a test starts a Node child (the CLI, the fleet, a dispatcher): through `/usr/bin/env -u NODE_OPTIONS`, so the
 * child is the command a user runs. Under `npm test`, node-tap puts its process-info loader in NODE_OPTIONS of
 * every child a test spawns; the loader records each module the child imports, which made each CLI call about
 * three times slower, and a test spawns hundreds of them. `env` replaces itself with node (the same pid), so
 * signals, exit codes and stdio are the child's own.
 */
export function nodeCommand(args: readonly string[]): [string, string[]] {
  return ['/usr/bin/env', ['-u', 'NODE_OPTIONS', process.execPath, ...args]];
}
