/**
 * The listener as the service runs it (HttpServer over an opened runtime): loopback by default; another
 * address is refused at configuration time unless it serves TLS or plain HTTP is explicitly allowed; with
 * `http.tls` the API answers over HTTPS with the configured certificate and refuses plain HTTP; stop is safe
 * to repeat; a taken port is `port_in_use`.
 */
import t, { type Test } from 'tap';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { request as httpsRequest } from 'node:https';
import { compileConfig } from '../../config/index.js';
import { openRuntime } from '../../runtime/runtime.js';
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

/** The service's listener with `http.tls` (and a client CA when asked), over a fresh database. */
async function tlsService(t: Test, clientCa: boolean, api: Record<string, unknown> = {}) {
  const url = await createTestDatabase(t);
  const pki = await testPki();
  const dir = mkdtempSync(join(tmpdir(), 'al-tls-'));
  writeFileSync(join(dir, 'cert.pem'), pki.server.cert);
  writeFileSync(join(dir, 'key.pem'), pki.server.key);
  writeFileSync(join(dir, 'ca.pem'), pki.ca.cert);
  const port = await freePort();
  const tls = { cert_file: 'cert.pem', key_file: 'key.pem', ...(clientCa ? { client_ca_file: 'ca.pem' } : {}) };
  const config = compileConfig({ tools: baseToolConfig, http: { host: '127.0.0.1', port, tls }, api }, env(url), {
    cwd: dir,
  });
  const rt = await openRuntime({ name: 'test-listener', config, env: env(url), migrate: true, defaultMetrics: false });
  const ledger = new Ledger(rt.config, rt.pool, new EffectKeyer(rt.effectKeys));
  const server = new HttpServer({ runtime: rt, ledger });
  t.teardown(async () => {
    await server.stop();
    ledger.stop();
    await rt.close();
  });
  return { rt, ledger, server, pki, port };
}

/** A GET over HTTPS trusting the test CA, with a client certificate and/or a bearer token. */
function httpsGet(
  port: number,
  path: string,
  ca: string,
  o: { client?: { cert: string; key: string }; token?: string } = {},
): Promise<{ status: number; text: string; body: Record<string, unknown> }> {
  return new Promise((resolve, reject) => {
    const headers = o.token === undefined ? {} : { authorization: `Bearer ${o.token}` };
    const req = httpsRequest(
      { host: '127.0.0.1', port, path, ca, servername: 'localhost', headers, ...(o.client ?? {}) },
      (res) => {
        let text = '';
        res.on('data', (c: Buffer) => (text += c.toString()));
        res.on('end', () =>
          resolve({ status: res.statusCode ?? 0, text, body: JSON.parse(text) as Record<string, unknown> }),
        );
      },
    );
    req.on('error', reject);
    req.end();
  });
}

t.test('with http.tls the API is HTTPS only; stop is safe to repeat; a taken port is port_in_use', async (t) => {
  const { rt, ledger, server, pki, port } = await tlsService(t, false);
  await server.start();
  const address = server.address;
  t.equal(address.port, port);
  const answer = await httpsGet(port, '/readyz', pki.ca.cert);
  t.same([answer.status, answer.text], [200, '{"ok":true}'], 'HTTPS with the configured certificate');
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
    const { rt, server, pki, port } = await tlsService(t, true, { permissions: { kill_switch: ['operator'] } });
    await server.start();
    const store = new PrincipalStore(rt.config, rt.pool);
    await store.add('svc-cert', 'service', 'Certificate service', 'test');
    await store.grant('svc-cert', 'tenant-a', 'operator', 'test');
    const fingerprint = await store.certificates.add('svc-cert', 'tenant-a', pki.client.cert, 'test');
    await t.rejects(store.certificates.add('svc-cert', 'tenant-a', pki.client.cert, 'test'), {
      code: 'operation_conflict',
    });
    await t.rejects(store.certificates.add('svc-cert', 'tenant-a', 'not a cert', 'test'), { code: 'invalid_request' });
    const get = (path: string, o: Parameters<typeof httpsGet>[3] = {}) => httpsGet(port, path, pki.ca.cert, o);

    const mapped = await get('/v1/status', { client: pki.client });
    t.equal(mapped.status, 200);
    t.match(mapped.body, {
      principal_id: 'svc-cert',
      tenant_id: 'tenant-a',
      roles: ['operator'],
      token_id: `certificate:${fingerprint}`,
    });
    t.equal((await get('/v1/kill-switches', { client: pki.client })).status, 200, 'its roles apply');
    t.match(
      await get('/v1/status', { client: pki.otherClient }),
      { status: 401, body: { error: 'unauthenticated' } },
      'another CA: nobody',
    );
    t.match(await get('/v1/status'), { status: 401 }, 'no certificate, no token: nobody');

    const { token } = await store.createToken('svc-cert', 'tenant-a', 'x', 1, 'test');
    t.match(
      await get('/v1/status', { token }),
      { status: 200, body: { token_id: String } },
      'a bearer token still works',
    );

    t.equal(await store.certificates.revoke(fingerprint, 'security-team'), true);
    t.match(
      await get('/v1/status', { client: pki.client }),
      { status: 401, body: { details: { reason: 'revoked', credential: 'certificate' } } },
      'a revoked mapping is refused on the next request',
    );
    t.match(await store.certificates.list({ principal_id: 'svc-cert' }), [
      { fingerprint_sha256: fingerprint, active: false },
    ]);
  },
);
