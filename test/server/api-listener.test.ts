/**
 * The listener as the service runs it (HttpServer over an opened runtime): loopback by default; another
 * address is refused at configuration time unless it serves TLS or plain HTTP is explicitly allowed; with
 * `http.tls` the API answers over HTTPS with the configured certificate and refuses plain HTTP; stop is safe
 * to repeat; a taken port is `port_in_use`.
 */
import t from 'tap';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { request as httpsRequest } from 'node:https';
import { compileConfig } from '../../core/config.js';
import { openRuntime } from '../../core/runtime.js';
import { EffectKeyer, Ledger } from '../../ledger/index.js';
import { HttpServer } from '../../server/index.js';
import { baseToolConfig, createTestDatabase, TEST_SECRET } from '../helpers/db.js';
import { freePort } from '../helpers/net.js';
import { testPki } from '../helpers/sandbox.js';

const env = (url: string) => ({ DATABASE_URL: url, ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET });

t.test('a non-loopback bind needs TLS or an explicit allowance', (t) => {
  const compile = (http: Record<string, unknown>) =>
    compileConfig({ tools: baseToolConfig, http }, env('postgres://x@127.0.0.1/x'));
  t.throws(() => compile({ host: '0.0.0.0' }), { code: 'config_invalid' }, 'plain HTTP on every address: refused');
  t.equal(compile({ host: '0.0.0.0', allow_plaintext_bind: true }).http.host, '0.0.0.0', 'explicitly allowed');
  t.same(
    compile({ host: '0.0.0.0', tls: { cert_file: 'c.pem', key_file: 'k.pem' } }).http.tls?.certFile.endsWith('c.pem'),
    true,
    'with TLS',
  );
  for (const host of ['127.0.0.1', '127.8.9.10', '::1', 'localhost'])
    t.equal(compile({ host }).http.host, host, `${host} is loopback`);
  t.end();
});

t.test('with http.tls the API is HTTPS only; stop is safe to repeat; a taken port is port_in_use', async (t) => {
  const url = await createTestDatabase(t);
  const pki = await testPki();
  const dir = mkdtempSync(join(tmpdir(), 'al-tls-'));
  writeFileSync(join(dir, 'cert.pem'), pki.server.cert);
  writeFileSync(join(dir, 'key.pem'), pki.server.key);
  const port = await freePort();
  const config = compileConfig(
    { tools: baseToolConfig, http: { host: '127.0.0.1', port, tls: { cert_file: 'cert.pem', key_file: 'key.pem' } } },
    env(url),
    { cwd: dir },
  );
  const rt = await openRuntime({ name: 'test-listener', config, env: env(url), migrate: true, defaultMetrics: false });
  const ledger = new Ledger(rt.config, rt.pool, new EffectKeyer(rt.effectKeys));
  const server = new HttpServer({ runtime: rt, ledger });
  t.teardown(async () => {
    await server.stop();
    ledger.stop();
    await rt.close();
  });
  const address = await server.start();
  t.equal(address.port, port);

  const answer = await new Promise<{ status: number; body: string }>((resolve, reject) => {
    const req = httpsRequest(
      { host: '127.0.0.1', port, path: '/readyz', ca: pki.ca.cert, servername: 'localhost' },
      (res) => {
        let body = '';
        res.on('data', (c: Buffer) => (body += c.toString()));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      },
    );
    req.on('error', reject);
    req.end();
  });
  t.same(answer, { status: 200, body: '{"ok":true}' }, 'HTTPS with the configured certificate');
  const plain = await fetch(`http://127.0.0.1:${port}/readyz`).then(
    (r) => r.status,
    () => 'refused',
  );
  t.not(plain, 200, 'plain HTTP gets no answer from the TLS listener');

  const second = new HttpServer({ runtime: rt, ledger });
  await t.rejects(second.start(), { code: 'port_in_use', details: { port } });
  await second.stop();
  await server.stop();
  await server.stop();
  t.pass('stop twice');
});
