/**
 * Test-only entry: runs `actionledger profile ...` as its own process (argv after the script name), so the
 * CLI tests exercise real files, exit codes and stdout without depending on bin/actionledger.ts registering it.
 */
import { profileCommand } from '../../bin/commands/profile.js';

profileCommand.run(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`${(err as Error)?.stack ?? String(err)}\n`);
    process.exit(1);
  },
);
