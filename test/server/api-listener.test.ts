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
import { PrincipalStore } from '../../principals/index.js';
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

t.test(
  'with a client CA, a mapped client certificate authenticates its principal; bearer tokens still work',
  async (t) => {
    const url = await createTestDatabase(t);
    const pki = await testPki();
    const dir = mkdtempSync(join(tmpdir(), 'al-mtls-'));
    writeFileSync(join(dir, 'cert.pem'), pki.server.cert);
    writeFileSync(join(dir, 'key.pem'), pki.server.key);
    writeFileSync(join(dir, 'ca.pem'), pki.ca.cert);
    const port = await freePort();
    const config = compileConfig(
      {
        tools: baseToolConfig,
        http: {
          host: '127.0.0.1',
          port,
          tls: { cert_file: 'cert.pem', key_file: 'key.pem', client_ca_file: 'ca.pem' },
        },
        api: { permissions: { kill_switch: ['operator'] } },
      },
      env(url),
      { cwd: dir },
    );
    const rt = await openRuntime({ name: 'test-mtls', config, env: env(url), migrate: true, defaultMetrics: false });
    const ledger = new Ledger(rt.config, rt.pool, new EffectKeyer(rt.effectKeys));
    const server = new HttpServer({ runtime: rt, ledger });
    t.teardown(async () => {
      await server.stop();
      ledger.stop();
      await rt.close();
    });
    await server.start();
    const store = new PrincipalStore(rt.config, rt.pool);
    await store.add('svc-cert', 'service', 'Certificate service', 'test');
    await store.grant('svc-cert', 'tenant-a', 'operator', 'test');
    const fingerprint = await store.certificates.add('svc-cert', 'tenant-a', pki.client.cert, 'test');
    await t.rejects(store.certificates.add('svc-cert', 'tenant-a', pki.client.cert, 'test'), {
      code: 'operation_conflict',
    });
    await t.rejects(store.certificates.add('svc-cert', 'tenant-a', 'not a cert', 'test'), { code: 'invalid_request' });

    const get = (path: string, client?: { cert: string; key: string }, token?: string) =>
      new Promise<{ status: number; body: Record<string, unknown> }>((resolve, reject) => {
        const req = httpsRequest(
          {
            host: '127.0.0.1',
            port,
            path,
            ca: pki.ca.cert,
            servername: 'localhost',
            ...(client ?? {}),
            ...(token === undefined ? {} : { headers: { authorization: `Bearer ${token}` } }),
          },
          (res) => {
            let body = '';
            res.on('data', (c: Buffer) => (body += c.toString()));
            res.on('end', () =>
              resolve({ status: res.statusCode ?? 0, body: JSON.parse(body) as Record<string, unknown> }),
            );
          },
        );
        req.on('error', reject);
        req.end();
      });

    const mapped = await get('/v1/status', pki.client);
    t.equal(mapped.status, 200);
    t.match(mapped.body, {
      principal_id: 'svc-cert',
      tenant_id: 'tenant-a',
      roles: ['operator'],
      token_id: `certificate:${fingerprint}`,
    });
    t.equal((await get('/v1/kill-switches', pki.client)).status, 200, 'its roles apply');
    t.match(
      await get('/v1/status', pki.otherClient),
      { status: 401, body: { error: 'unauthenticated' } },
      'another CA: nobody',
    );
    t.match(await get('/v1/status'), { status: 401 }, 'no certificate, no token: nobody');

    const { token } = await store.createToken('svc-cert', 'tenant-a', 'x', 1, 'test');
    t.match(
      await get('/v1/status', undefined, token),
      { status: 200, body: { token_id: String } },
      'a bearer token still works',
    );

    t.equal(await store.certificates.revoke(fingerprint, 'security-team'), true);
    t.match(
      await get('/v1/status', pki.client),
      { status: 401, body: { details: { reason: 'revoked', credential: 'certificate' } } },
      'a revoked mapping is refused on the next request',
    );
    t.match(await store.certificates.list({ principal_id: 'svc-cert' }), [
      { fingerprint_sha256: fingerprint, active: false },
    ]);
  },
);
