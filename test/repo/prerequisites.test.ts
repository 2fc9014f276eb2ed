/**
 * test/prerequisites.mjs, the first step of `npm run check`: with a program missing and no right to install it, it
 * fails up front with one line naming the program, its Debian package and the test files that need it; as root it
 * installs the package with apt-get; with everything present it does nothing. Run here against stand-in programs on
 * a PATH of their own (an apt-get among them that records its calls), acting as root or not by its
 * AL_PREREQUISITES_ROOT override.
 */
import t from 'tap';
import { spawnSync } from 'node:child_process';
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { nodeCommand } from '../helpers/node-child.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const SCRIPT = join(ROOT, 'test', 'prerequisites.mjs');

interface Machine {
  bin: string;
  chromium: string;
  record: string;
}

/** A folder of stand-ins for `programs` (and a chromium path, present when `chromium`), and an apt-get stand-in. */
function machine(programs: string[], chromium: boolean, apt: 'installs' | 'fails' = 'installs'): Machine {
  const dir = mkdtempSync(join(tmpdir(), 'al-prereq-'));
  const bin = join(dir, 'bin');
  const record = join(dir, 'apt-get.log');
  const stub = (path: string, body = 'exit 0'): void => {
    writeFileSync(path, `#!/bin/sh\n${body}\n`);
    chmodSync(path, 0o755);
  };
  writeFileSync(record, '');
  mkdirSync(bin);
  for (const p of programs) stub(join(bin, p));
  const browser = join(dir, 'chromium');
  if (chromium) stub(browser);
  // Records each call; `install` makes a stand-in for each package's program (prometheus brings promtool).
  stub(
    join(bin, 'apt-get'),
    [
      `echo "$DEBIAN_FRONTEND $*" >> '${record}'`,
      apt === 'fails' ? 'exit 100' : '',
      `if [ "$1" = install ]; then for p in "$@"; do case "$p" in`,
      `  prometheus) printf '#!/bin/sh\\n' > '${bin}/promtool'; /bin/chmod 755 '${bin}/promtool';;`,
      `  curl) printf '#!/bin/sh\\n' > '${bin}/curl'; /bin/chmod 755 '${bin}/curl';;`,
      `esac; done; fi`,
    ].join('\n'),
  );
  return { bin, chromium: browser, record };
}

function check(m: Machine, root: boolean): { code: number | null; stderr: string; apt: string } {
  const r = spawnSync(...nodeCommand([SCRIPT]), {
    encoding: 'utf8',
    env: { PATH: m.bin, AL_PREREQUISITES_ROOT: root ? '1' : '0', AL_PREREQUISITES_CHROMIUM: m.chromium },
  });
  return { code: r.status, stderr: r.stderr + r.stdout, apt: readFileSync(m.record, 'utf8') };
}

const ALL = ['promtool', 'kubectl', 'python3', 'curl', 'jq'];

t.test('everything present: exits 0, says nothing and installs nothing, as root too', (t) => {
  for (const root of [false, true]) {
    const r = check(machine(ALL, true), root);
    t.equal(r.code, 0, `exit 0 (root: ${root})`);
    t.equal(r.stderr, '', 'no output');
    t.equal(r.apt, '', 'apt-get was not called');
  }
  t.end();
});

t.test('not root and promtool missing: one line naming it, its package and its tests; exit 1', (t) => {
  const r = check(machine(['kubectl', 'python3', 'curl', 'jq'], true), false);
  t.equal(r.code, 1);
  t.equal(r.apt, '', 'nothing installed');
  const lines = r.stderr.trim().split('\n');
  t.same(
    lines.filter((l) => l.includes(' is missing ')),
    [
      "test prerequisites: promtool is missing (Debian's prometheus package: apt-get install prometheus), needed by " +
        'test/deploy/promtool.test.ts, test/deploy/grafana.test.ts',
    ],
    'exactly one line, for promtool',
  );
  t.end();
});

t.test('not root and the browser missing too: a line for each, chromium by its path', (t) => {
  const m = machine(['promtool', 'kubectl', 'python3', 'jq'], false);
  const r = check(m, false);
  t.equal(r.code, 1);
  const missing = r.stderr.split('\n').filter((l) => l.includes(' is missing '));
  t.equal(missing.length, 2);
  t.match(missing[0], `${m.chromium} is missing (Debian's chromium package: apt-get install chromium)`);
  t.match(missing[0], 'test/console/console-browser.test.ts');
  t.match(missing[1], "curl is missing (Debian's curl package: apt-get install curl), needed by test/bin/fleet-start");
  t.end();
});

t.test('root and promtool and curl missing: apt-get update, then one install of both packages; exit 0', (t) => {
  const m = machine(['kubectl', 'python3', 'jq'], true);
  const r = check(m, true);
  t.equal(r.code, 0, r.stderr);
  t.equal(
    r.apt,
    'noninteractive update -qq\nnoninteractive install -y -qq --no-install-recommends prometheus curl\n',
    'the calls .ci/run made',
  );
  t.ok(existsSync(join(m.bin, 'promtool')));
  t.end();
});

t.test('root, and the install fails: the same lines as without root; exit 1', (t) => {
  const r = check(machine(['kubectl', 'python3', 'curl', 'jq'], true, 'fails'), true);
  t.equal(r.code, 1);
  t.equal(r.apt, 'noninteractive update -qq\n', 'no install after a failed update');
  t.match(r.stderr, "promtool is missing (Debian's prometheus package: apt-get install prometheus)");
  t.end();
});

/** Every test file's source under test/, relative to the repository. */
function testSources(dir = join(ROOT, 'test')): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return testSources(path);
    return name.endsWith('.test.ts') ? [relative(ROOT, path)] : [];
  });
}

t.test('the list names every test file that runs one of the programs, and only existing files', (t) => {
  const r = check(machine([], false), false);
  const needs = new Map<string, string[]>();
  for (const line of r.stderr.split('\n')) {
    const m = /^test prerequisites: (\S+) is missing .*, needed by (.+)$/.exec(line);
    if (m !== null) needs.set(m[1]!.endsWith('/chromium') ? 'chromium' : m[1]!, m[2]!.split(', '));
  }
  t.same([...needs.keys()].sort(), ['chromium', 'curl', 'jq', 'kubectl', 'promtool', 'python3']);
  for (const files of needs.values()) for (const f of files) t.ok(existsSync(join(ROOT, f)), `${f} exists`);
  for (const file of testSources()) {
    if (file === 'test/repo/prerequisites.test.ts') continue;
    const text = readFileSync(join(ROOT, file), 'utf8');
    for (const program of ALL)
      if (text.includes(`'${program}'`)) t.ok(needs.get(program)?.includes(file), `${file} is listed for ${program}`);
    // The browser is launched by the console helper.
    if (text.includes('consoleEnv(')) t.ok(needs.get('chromium')?.includes(file), `${file} is listed for chromium`);
  }
  t.end();
});
