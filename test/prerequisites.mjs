#!/usr/bin/env node
/**
 * The programs some test files run, checked before `npm run check` starts (its first step; `.ci/run` relies on it
 * too). Everything present: exits 0 and installs nothing. Something missing, as root with apt-get: installs the
 * Debian packages that bring it (`apt-get update`, then `apt-get install --no-install-recommends`), then checks
 * again. Something missing otherwise: prints one line per missing program, naming the package to install and the
 * test files that need it, and exits 1, so a machine without them fails up front instead of skipping those tests.
 *
 * AL_PREREQUISITES_ROOT=0 (or 1) overrides whether it acts as root, and AL_PREREQUISITES_CHROMIUM the path the
 * browser is looked for at; test/repo/prerequisites.test.ts uses both. Plain JavaScript on purpose: it runs before
 * anything is compiled.
 */
import { spawnSync } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { delimiter, isAbsolute, join } from 'node:path';

const chromium = process.env.AL_PREREQUISITES_CHROMIUM || '/usr/bin/chromium';

/** Each program: how it is found (a name on PATH, or an absolute path), its Debian package, the tests that run it. */
const PREREQUISITES = [
  // Debian's chromium: the console's browser tests drive it through playwright-core (test/helpers/console.ts).
  {
    command: chromium,
    package: 'chromium',
    tests: ['test/console/console-browser.test.ts', 'test/console/console-overview-browser.test.ts'],
  },
  // Prometheus's rule checker.
  {
    command: 'promtool',
    package: 'prometheus',
    tests: ['test/deploy/promtool.test.ts', 'test/deploy/grafana.test.ts'],
  },
  // Its built-in kustomize renders deploy/kubernetes.
  { command: 'kubectl', package: 'kubernetes-client', tests: ['test/deploy/kubernetes.test.ts'] },
  // The example API client in examples/python/, and Unicode's data to compare with (unicodedata).
  { command: 'python3', package: 'python3', tests: ['test/bin/fleet-start.test.ts', 'test/core/visible-text.test.ts'] },
  // The README's tour (its HTTP calls, and jq to pick fields out of their answers).
  { command: 'curl', package: 'curl', tests: ['test/bin/fleet-start.test.ts', 'test/bin/readme-tour.test.ts'] },
  { command: 'jq', package: 'jq', tests: ['test/bin/readme-tour.test.ts'] },
];

/** Whether `command` (a name looked up on PATH, or an absolute path) is an executable file. */
function found(command) {
  const candidates = isAbsolute(command)
    ? [command]
    : (process.env.PATH ?? '')
        .split(delimiter)
        .filter((dir) => dir !== '')
        .map((dir) => join(dir, command));
  return candidates.some((path) => {
    try {
      accessSync(path, constants.X_OK);
      return true;
    } catch {
      return false;
    }
  });
}

const missing = () => PREREQUISITES.filter((p) => !found(p.command));

function asRoot() {
  const forced = process.env.AL_PREREQUISITES_ROOT;
  if (forced === '0' || forced === '1') return forced === '1';
  return process.getuid?.() === 0;
}

/** `apt-get` with the arguments; false when it could not run or failed (its errors are on stderr). */
function aptGet(...args) {
  const r = spawnSync('apt-get', args, {
    stdio: ['ignore', 'ignore', 'inherit'],
    env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' },
  });
  if (r.error !== undefined) process.stderr.write(`test prerequisites: apt-get: ${r.error.message}\n`);
  return r.status === 0;
}

let lacking = missing();
if (lacking.length > 0 && asRoot() && found('apt-get')) {
  const packages = [...new Set(lacking.map((p) => p.package))];
  process.stderr.write(`test prerequisites: installing ${packages.join(' ')} (apt-get)\n`);
  if (aptGet('update', '-qq')) aptGet('install', '-y', '-qq', '--no-install-recommends', ...packages);
  lacking = missing();
}
for (const p of lacking) {
  process.stderr.write(
    `test prerequisites: ${p.command} is missing (Debian's ${p.package} package: apt-get install ${p.package}), ` +
      `needed by ${p.tests.join(', ')}\n`,
  );
}
if (lacking.length > 0) {
  process.stderr.write('test prerequisites: install them (or run this as root to have them installed), then again\n');
  process.exit(1);
}
