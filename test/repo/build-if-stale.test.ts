import t from 'tap';
import { spawnSync } from 'node:child_process';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  unlinkSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { nodeCommand } from '../helpers/node-child.js';

const SCRIPT = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'bin', 'build-if-stale.mjs');

function build(root: string): { code: number | null; stderr: string } {
  const r = spawnSync(...nodeCommand([SCRIPT, root]), { encoding: 'utf8' });
  return { code: r.status, stderr: r.stderr + r.stdout };
}

/** Makes `path` newer than the last build (without waiting: the build's mark is moved a minute back). */
function changed(root: string, path: string): void {
  const ago = (s: number) => new Date(Date.now() - s * 1000);
  for (const input of [
    'src',
    'tsconfig.json',
    'package.json',
    ...readdirSync(join(root, 'src')).map((f) => `src/${f}`),
  ])
    utimesSync(join(root, input), ago(90), ago(90));
  if (existsSync(join(root, 'dist', '.build-stamp'))) utimesSync(join(root, 'dist', '.build-stamp'), ago(60), ago(60));
  utimesSync(path, ago(30), ago(30));
}

t.test('npm start compiles only what changed since the last build', (t) => {
  const root = mkdtempSync(join(tmpdir(), 'al-build-'));
  mkdirSync(join(root, 'src'));
  writeFileSync(join(root, 'package.json'), '{"type":"module"}\n');
  writeFileSync(
    join(root, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: {
        module: 'NodeNext',
        strict: true,
        outDir: 'dist',
        incremental: true,
        tsBuildInfoFile: 'dist/.tsbuildinfo',
        types: [],
      },
      include: ['src'],
    }),
  );
  writeFileSync(join(root, 'src', 'a.ts'), 'export const a: number = 1;\n');

  const first = build(root);
  t.equal(first.code, 0, first.stderr);
  t.match(first.stderr, /building dist\/ \(no successful build yet\)/);
  t.ok(existsSync(join(root, 'dist', 'a.js')));

  const again = build(root);
  t.equal(again.code, 0);
  t.equal(again.stderr, '', 'nothing changed: no compiler run, nothing said');

  writeFileSync(join(root, 'src', 'a.ts'), 'export const a: number = 2;\n');
  changed(root, join(root, 'src', 'a.ts'));
  const edited = build(root);
  t.match(edited.stderr, /building dist\/ \(src changed\)/);
  t.match(readFileSync(join(root, 'dist', 'a.js'), 'utf8'), /= 2/);
  t.equal(build(root).stderr, '', 'built once per change');

  writeFileSync(join(root, 'src', 'b.ts'), 'export const b: string = 3;\n');
  changed(root, join(root, 'src'));
  const broken = build(root);
  t.not(broken.code, 0, 'a type error fails the build');
  t.match(broken.stderr, /TS2322/);
  t.match(build(root).stderr, /building dist\/ \(no successful build yet\)/, 'and is reported again on the next run');

  unlinkSync(join(root, 'src', 'b.ts'));
  changed(root, join(root, 'src'));
  t.equal(build(root).code, 0, 'a removed file changes its folder: rebuilt, and clean again');

  // A type check alone (tsc --noEmit rewrites the build info, emits nothing) does not make a stale build fresh.
  writeFileSync(join(root, 'src', 'a.ts'), 'export const a: number = 3;\n');
  changed(root, join(root, 'src', 'a.ts'));
  const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
  t.equal(spawnSync(...nodeCommand([tsc, '-p', root, '--noEmit'])).status, 0);
  t.match(build(root).stderr, /src changed/);
  t.match(readFileSync(join(root, 'dist', 'a.js'), 'utf8'), /= 3/, 'and the edit is in dist/');

  changed(root, join(root, 'tsconfig.json'));
  t.match(build(root).stderr, /tsconfig\.json changed/);
  t.end();
});
