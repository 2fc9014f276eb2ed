#!/usr/bin/env node
/**
 * Compiles the TypeScript sources into dist/ when they changed since the last build, and does nothing
 * otherwise: `npm start` and `npm install` (the `prepare` script) run it, so `npx actionledger` works right after
 * install and a start without changes does not wait for the compiler.
 *
 * Stale means: no dist/.build-stamp (written when a build succeeds, dated when it started), or a file or folder under a tsconfig.json `include` entry (a folder's own
 * time changes when a file is added, removed or renamed in it), tsconfig.json or package.json is newer than it.
 * Plain JavaScript on purpose: it runs before anything is compiled.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync, readdirSync, rmSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The project to build: this repository, or the folder given as the first argument. */
const root = process.argv[2] ?? join(dirname(fileURLToPath(import.meta.url)), '..');
// Its own stamp, not tsc's build info: `tsc --noEmit` (npm run typecheck) rewrites that without emitting.
const marker = join(root, 'dist', '.build-stamp');

/** The newest modification time (ms) of `path` and, for a folder, of everything under it that tsc reads. */
function newest(path) {
  const s = statSync(path, { throwIfNoEntry: false });
  if (s === undefined) return 0;
  if (!s.isDirectory()) return /\.(ts|json)$/.test(path) ? s.mtimeMs : 0;
  let latest = s.mtimeMs;
  for (const entry of readdirSync(path)) latest = Math.max(latest, newest(join(path, entry)));
  return latest;
}

function stale() {
  const built = statSync(marker, { throwIfNoEntry: false })?.mtimeMs;
  if (built === undefined) return 'no successful build yet';
  const tsconfig = JSON.parse(readFileSync(join(root, 'tsconfig.json'), 'utf8'));
  const inputs = [...tsconfig.include, 'tsconfig.json', 'package.json'];
  const changed = inputs.find((p) => newest(join(root, p)) > built);
  return changed === undefined ? null : `${changed} changed`;
}

/** Whether any TypeScript source (not a declaration) is under `path`. */
function hasSources(path) {
  const s = statSync(path, { throwIfNoEntry: false });
  if (s === undefined) return false;
  if (!s.isDirectory()) return path.endsWith('.ts') && !path.endsWith('.d.ts');
  return readdirSync(path).some((entry) => hasSources(join(path, entry)));
}

// An install of the published package carries dist/ and no TypeScript sources: there is nothing to build (and no
// compiler: `npm ci --omit=dev` installs none).
const includes = JSON.parse(readFileSync(join(root, 'tsconfig.json'), 'utf8')).include;
const packaged =
  statSync(marker, { throwIfNoEntry: false }) !== undefined && !includes.some((p) => hasSources(join(root, p)));
const why = packaged ? null : stale();
if (why !== null) {
  let tsc;
  try {
    tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
  } catch {
    process.stderr.write(
      'actionledger: cannot build dist/: typescript is not installed (run `npm install` with dev dependencies)\n',
    );
    process.exit(1);
  }
  process.stderr.write(`actionledger: building dist/ (${why})\n`);
  // Stamped with the time the build started: a file saved while tsc runs is newer, so the next run builds again.
  const started = new Date();
  const r = spawnSync(process.execPath, [tsc, '-p', root], { stdio: 'inherit' });
  // A failed build (type errors still emit) leaves no stamp: the next run compiles and reports them again.
  if (r.status === 0) {
    writeFileSync(marker, `${started.toISOString()}\n`);
    utimesSync(marker, started, started);
  } else rmSync(marker, { force: true });
  process.exit(r.status ?? 1);
}
