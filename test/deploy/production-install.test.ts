/**
 * The production install, as an image builds it: `npm pack`, then `npm ci --omit=dev` from the packed files
 * and the lock, then `actionledger start` from that install against PostgreSQL (this run's server) with the
 * development sandbox. It proves the package holds everything the service needs and that nothing it needs at
 * run time is a dev dependency: the install has no TypeScript, no test runner and no linter, and still starts,
 * migrates, answers `/readyz` and the API, and stops cleanly on SIGTERM.
 */
import t from 'tap';
import { execFile, spawn } from 'node:child_process';
import { copyFileSync, existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createTestDatabase, TEST_SECRET } from '../helpers/db.js';
import { freePort } from '../helpers/net.js';
import { nodeCommand } from '../helpers/node-child.js';

const root = join(import.meta.dirname, '..', '..', '..');

function run(file: string, args: string[], cwd: string): Promise<string> {
  return new Promise((resolve, reject) =>
    execFile(file, args, { cwd, timeout: 240_000, maxBuffer: 16 * 1024 * 1024 }, (err, stdout, stderr) =>
      err === null ? resolve(stdout) : reject(new Error(`${file} ${args.join(' ')}: ${err.message}\n${stderr}`)),
    ),
  );
}

t.test('npm ci --omit=dev of the packed package starts the service against PostgreSQL', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'al-install-'));
  const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';
  await run(npm, ['pack', '--pack-destination', dir, '--silent'], root);
  const tarball = readdirSync(dir).find((f) => f.endsWith('.tgz'));
  if (tarball === undefined) throw new Error('npm pack wrote no tarball');
  await run('tar', ['-xzf', tarball], dir);
  const app = join(dir, 'package');
  copyFileSync(join(root, 'package-lock.json'), join(app, 'package-lock.json'));
  await run(npm, ['ci', '--omit=dev', '--no-audit', '--no-fund'], app);
  for (const dev of ['typescript', 'tap', 'eslint', 'prettier'])
    t.notOk(existsSync(join(app, 'node_modules', dev)), `${dev} is not installed`);
  t.notOk(existsSync(join(app, 'dist', 'test')), 'the tests are not in the package');

  const url = await createTestDatabase(t, { empty: true });
  const [http, provider, authorizer] = [await freePort(), await freePort(), await freePort()];
  // Its tools are written as paths of the sandbox provider: they follow sandbox.provider_port.
  const example = JSON.parse(
    (await import('node:fs')).readFileSync(join(app, 'actionledger.config.json'), 'utf8'),
  ) as Record<string, unknown>;
  example.http = { host: '127.0.0.1', port: http };
  example.sandbox = { enabled: true, provider_port: provider, authorizer_port: authorizer };
  writeFileSync(join(dir, 'config.json'), JSON.stringify(example));
  const service = spawn(...nodeCommand([join(app, 'dist', 'bin', 'actionledger.js'), 'start', '--workers', '1']), {
    cwd: dir,
    env: {
      PATH: process.env.PATH,
      DATABASE_URL: url,
      ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET,
      ACTIONLEDGER_CONFIG: join(dir, 'config.json'),
      ACTIONLEDGER_DATA_DIR: join(dir, 'data'),
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let log = '';
  service.stdout.on('data', (c: Buffer) => (log += c.toString()));
  service.stderr.on('data', (c: Buffer) => (log += c.toString()));
  const exited = new Promise<number | null>((resolve) => service.once('exit', (code) => resolve(code)));
  t.teardown(() => void service.kill('SIGKILL'));

  let ready = 0;
  for (const until = Date.now() + 90_000; ready !== 200 && Date.now() < until;) {
    ready = await fetch(`http://127.0.0.1:${http}/readyz`).then(
      (r) => r.status,
      () => 0,
    );
    if (ready !== 200) await new Promise((r) => setTimeout(r, 300));
  }
  t.equal(ready, 200, `/readyz from the production install\n${log.slice(-3000)}`);
  const doc = await fetch(`http://127.0.0.1:${http}/v1/openapi.json`).then(
    (r) => r.json() as Promise<{ openapi?: string }>,
  );
  t.equal(doc.openapi, '3.1.0', 'the API answers');
  t.equal((await fetch(`http://127.0.0.1:${http}/v1/status`)).status, 401, 'and asks for a credential');
  service.kill('SIGTERM');
  t.equal(await exited, 0, `SIGTERM: exit 0\n${log.slice(-2000)}`);
});

t.test('the Dockerfile installs the same way, runs as a non-root user under tini, with a health check', (t) => {
  const docker = readFileSync(join(root, 'Dockerfile'), 'utf8');
  t.match(docker, /npm pack/, 'packs in the build stage');
  t.match(docker, /npm ci --omit=dev/, 'a production install in the final stage');
  t.match(docker, /^USER node$/m, 'not root');
  t.match(docker, /^HEALTHCHECK .*\n.*\/healthz/m, 'a health check on /healthz');
  t.match(docker, /^ENTRYPOINT \["\/usr\/bin\/tini", "--"/m, 'tini forwards SIGTERM and reaps');
  const ignored = readFileSync(join(root, '.dockerignore'), 'utf8');
  for (const p of ['node_modules/', 'dist/', '.actionledger/']) t.match(ignored, p, `${p} stays out of the context`);
  t.end();
});
