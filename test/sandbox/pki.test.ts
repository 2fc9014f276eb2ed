import { X509Certificate, createPrivateKey } from 'node:crypto';
import { mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { checkServerIdentity } from 'node:tls';
import t from 'tap';
import {
  createCa,
  issueClientCert,
  issueServerCert,
  loadOrCreateDevPki,
  loadPki,
  writePki,
} from '../../sandbox/pki.js';

t.test('a CA, a server certificate with DNS and IP SANs, a client certificate', async (t) => {
  const ca = await createCa('unit-ca');
  const caCert = new X509Certificate(ca.cert);
  t.ok(caCert.ca, 'the CA is a CA');
  t.equal(caCert.subject, 'CN=unit-ca');
  t.ok(caCert.verify(caCert.publicKey), 'self-signed');
  t.equal(createPrivateKey(ca.key).asymmetricKeyDetails?.namedCurve, 'prime256v1', 'ECDSA P-256');
  t.match(ca.key, /^-----BEGIN PRIVATE KEY-----/, 'PKCS#8 PEM');

  const server = await issueServerCert(ca, { hosts: ['localhost', '127.0.0.1'] });
  const cert = new X509Certificate(server.cert);
  t.notOk(cert.ca);
  t.ok(cert.checkIssued(caCert) && cert.verify(caCert.publicKey), 'issued and signed by the CA');
  t.ok(cert.checkPrivateKey(createPrivateKey(server.key)), 'the key matches');
  t.equal(cert.subjectAltName, 'DNS:localhost, IP Address:127.0.0.1');
  t.equal(cert.keyUsage?.join(','), '1.3.6.1.5.5.7.3.1', 'serverAuth');
  t.equal(cert.checkHost('localhost'), 'localhost');
  t.equal(cert.checkIP('127.0.0.1'), '127.0.0.1');
  t.equal(cert.checkHost('otherhost'), undefined);
  const legacy = cert.toLegacyObject();
  t.equal(checkServerIdentity('localhost', legacy), undefined, "Node's TLS host check accepts localhost");
  t.type(checkServerIdentity('otherhost', legacy), Error);

  const client = await issueClientCert(ca, 'worker-1');
  const clientCert = new X509Certificate(client.cert);
  t.equal(clientCert.subject, 'CN=worker-1');
  t.equal(clientCert.keyUsage?.join(','), '1.3.6.1.5.5.7.3.2', 'clientAuth');
  t.ok(clientCert.verify(caCert.publicKey));
});

t.test('validity: default now-ish, explicit dates, expired; unrelated CAs do not cross-verify', async (t) => {
  const ca = await createCa('v-ca');
  const other = await createCa('v-ca');
  const fresh = new X509Certificate((await issueServerCert(ca)).cert);
  t.ok(Date.parse(fresh.validFrom) <= Date.now() && Date.parse(fresh.validTo) > Date.now() + 300 * 86_400_000);
  t.equal(fresh.subjectAltName, 'DNS:localhost, IP Address:127.0.0.1, IP Address:0:0:0:0:0:0:0:1');

  const expired = new X509Certificate((await issueClientCert(ca, 'old', { expired: true })).cert);
  t.ok(Date.parse(expired.validTo) < Date.now(), 'expired');
  const notBefore = new Date(Date.now() + 86_400_000);
  const future = new X509Certificate(
    (await issueServerCert(ca, { notBefore, notAfter: new Date(Date.now() + 2 * 86_400_000) })).cert,
  );
  t.equal(Date.parse(future.validFrom), Math.floor(notBefore.getTime() / 1000) * 1000, 'notBefore is honoured');

  const otherCert = new X509Certificate(other.cert);
  t.notOk(fresh.verify(otherCert.publicKey), 'same name, different CA: the signature does not verify');
  await t.rejects(issueServerCert(ca, { hosts: [] }));
});

t.test('writePki: files, modes; loadOrCreateDevPki reuses it and replaces a broken one', async (t) => {
  const base = mkdtempSync(join(tmpdir(), 'al-pki-'));
  t.teardown(() => rmSync(base, { recursive: true, force: true }));
  const dir = join(base, 'data', 'pki');
  t.equal(loadPki(dir), null, 'nothing there yet');

  const first = await loadOrCreateDevPki(dir);
  t.same(readdirSync(dir).sort(), ['ca.crt', 'ca.key', 'client.crt', 'client.key', 'server.crt', 'server.key']);
  t.equal(statSync(dir).mode & 0o777, 0o700, 'folder 0700');
  for (const f of ['ca.key', 'server.key', 'client.key'])
    t.equal(statSync(join(dir, f)).mode & 0o777, 0o600, `${f} is 0600`);
  t.equal(first.paths.serverKey, join(dir, 'server.key'));
  t.equal(new X509Certificate(first.client.cert).subject, 'CN=actionledger-dispatcher');

  const again = await loadOrCreateDevPki(dir);
  t.equal(again.ca.cert, first.ca.cert, 'reused, not regenerated');
  t.equal(again.server.key, first.server.key);

  const other = await createCa('intruder');
  writeFileSync(join(dir, 'server.crt'), (await issueServerCert(other)).cert);
  t.equal(loadPki(dir), null, 'a server certificate from another CA is not usable');
  const replaced = await loadOrCreateDevPki(dir);
  t.not(replaced.ca.cert, first.ca.cert, 'regenerated');
  t.same(loadPki(dir)?.ca.cert, replaced.ca.cert);

  const rewritten = await writePki(dir);
  t.not(rewritten.ca.cert, replaced.ca.cert, 'writePki always writes a new one');
  t.same(readdirSync(base + '/data'), ['pki'], 'no temporary folders left behind');
});
