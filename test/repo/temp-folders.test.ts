/**
 * `npm test` (test/run.ts) hands every test file a temporary folder of its run as TMPDIR and removes it at the
 * end, so the folders the tests make (configurations, certificates, clusters) do not pile up in the machine's
 * temporary folder, those of a file killed at its timeout included.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join } from 'node:path';
import t from 'tap';

t.test("a test file's temporary folders are made inside its run's own folder", (t) => {
  const scratch = process.env.TMPDIR;
  t.ok(scratch !== undefined && basename(scratch).startsWith('actionledger-test-tmp-'), `TMPDIR is ${scratch}`);
  t.equal(tmpdir(), scratch);
  const made = mkdtempSync(join(tmpdir(), 'al-temp-folders-'));
  t.equal(dirname(made), scratch);
  // Other users (the cluster's postgres user, under root) may pass through it, not list it.
  t.equal(statSync(scratch!).mode & 0o777, 0o711);
  // A child process inherits it.
  const child = spawnSync(process.execPath, ['-e', 'process.stdout.write(require("node:os").tmpdir())'], {
    encoding: 'utf8',
  });
  t.equal(child.stdout, scratch);
  t.end();
});
