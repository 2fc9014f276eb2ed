/**
 * `./actionledger`, the command in a checkout: it runs bin/build-if-stale.mjs (whose output goes to stderr, so a
 * `--json` reader sees only the command's), stops when that fails, and otherwise becomes
 * `node dist/bin/actionledger.js` with the same arguments and exit code. Run here as a copy beside stand-ins for
 * both, so the test neither builds nor depends on this checkout's dist/.
 */
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const WRAPPER = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'actionledger');

function checkout(build: string): string {
  const root = mkdtempSync(join(tmpdir(), 'al-wrapper-'));
  mkdirSync(join(root, 'bin'));
  mkdirSync(join(root, 'dist', 'bin'), { recursive: true });
  copyFileSync(WRAPPER, join(root, 'actionledger'));
  writeFileSync(join(root, 'bin', 'build-if-stale.mjs'), build);
  writeFileSync(
    join(root, 'dist', 'bin', 'actionledger.js'),
    'process.stdout.write(JSON.stringify(process.argv.slice(2)) + "\\n"); process.exit(Number(process.argv[2]) || 0);\n',
  );
  return root;
}

function run(root: string, ...args: string[]): { code: number | null; stdout: string; stderr: string } {
  const r = spawnSync('/bin/sh', [join(root, 'actionledger'), ...args], {
    encoding: 'utf8',
    env: { PATH: dirname(process.execPath) },
  });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

t.test('the arguments and the exit code are the command’s; the build’s output goes to stderr', (t) => {
  const root = checkout('console.log("actionledger: building dist/ (test)");\n');
  const r = run(root, '3', '--json', 'a b');
  t.equal(r.code, 3);
  t.equal(r.stdout, '["3","--json","a b"]\n', 'only the command’s output on stdout');
  t.equal(r.stderr, 'actionledger: building dist/ (test)\n');
  t.end();
});

t.test('a failed build stops it before the command runs', (t) => {
  const root = checkout('process.stderr.write("type errors\\n"); process.exit(2);\n');
  const r = run(root, 'status');
  t.equal(r.code, 1);
  t.equal(r.stdout, '', 'the command did not run');
  t.equal(r.stderr, 'type errors\n');
  t.end();
});
