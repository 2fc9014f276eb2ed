import t, { type Test } from 'tap';
import { execFileSync, spawnSync } from 'node:child_process';
import { generateKeyPairSync, sign as cryptoSign, type KeyObject } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isActionLedgerError } from '../../core/errors.js';
import { BIN } from '../helpers/cli.js';
import {
  generateProfileKeyPair,
  isVerifiedProfile,
  loadVerifiedProfile,
  signProfile,
  verifyProfile,
  type DispatchProfile,
} from '../../protocol/profile.js';
import { nodeCommand } from '../helpers/node-child.js';

const PROFILE = {
  profile_id: 'prod-dispatch-2025-01',
  authorization_url: 'https://authz.internal.example/v1/decide',
  maximum_authorization_age_seconds: 30,
  maximum_authorization_ttl_seconds: 120,
  maximum_clock_skew_seconds: 5,
  authorization_http_timeout_seconds: 2.5,
  provider_http_timeout_seconds: 10,
  authorization_response_max_bytes: 16384,
  provider_response_max_bytes: 1048576,
};

const ec = generateProfileKeyPair('ecdsa-p256');
const ed = generateProfileKeyPair('ed25519');

function bytesOf(value: unknown): Buffer {
  if (Buffer.isBuffer(value)) return value;
  return Buffer.from(typeof value === 'string' ? value : JSON.stringify(value, null, 2));
}

/** Signs with the EC key and verifies: a refusal here is about the content, never the signature. */
function signedVerify(value: unknown): DispatchProfile {
  const profileBytes = bytesOf(value);
  return verifyProfile({
    profileBytes,
    signature: signProfile({ profileBytes, privateKeyPem: ec.privateKeyPem }),
    publicKeyPem: ec.publicKeyPem,
  });
}

function refuses(t: Test, fn: () => unknown, pattern: RegExp, what: string): void {
  try {
    fn();
    t.fail(`${what}: accepted`);
  } catch (err) {
    t.ok(isActionLedgerError(err, 'profile_invalid'), `${what}: profile_invalid`);
    t.match((err as Error).message, pattern, `${what}: names the problem`);
  }
}

t.test('ECDSA P-256 and Ed25519 round trips give a frozen profile in milliseconds', (t) => {
  for (const [kind, pair, algorithm] of [
    ['ecdsa-p256', ec, 'ecdsa-p256-sha256'],
    ['ed25519', ed, 'ed25519'],
  ] as const) {
    const profileBytes = bytesOf(PROFILE);
    const signature = signProfile({ profileBytes, privateKeyPem: pair.privateKeyPem });
    const p = verifyProfile({ profileBytes, signature: `\n ${signature}\n`, publicKeyPem: pair.publicKeyPem });
    t.equal(p.signatureAlgorithm, algorithm, kind);
    t.equal(p.profileId, PROFILE.profile_id);
    t.equal(p.authorizationUrl, PROFILE.authorization_url);
    t.equal(p.maximumAuthorizationAgeMs, 30_000);
    t.equal(p.maximumAuthorizationTtlMs, 120_000);
    t.equal(p.maximumClockSkewMs, 5_000);
    t.equal(p.authorizationHttpTimeoutMs, 2_500);
    t.equal(p.providerHttpTimeoutMs, 10_000);
    t.equal(p.authorizationResponseMaxBytes, 16384);
    t.equal(p.providerResponseMaxBytes, 1048576);
    t.match(p.sha256, /^[0-9a-f]{64}$/);
    t.match(p.publicKeySha256, /^[0-9a-f]{64}$/);
    t.ok(Object.isFrozen(p), 'frozen');
    t.ok(isVerifiedProfile(p), 'registered as verified');
    t.notOk(isVerifiedProfile({ ...p }), 'a copy is not a verified profile');
    t.throws(() => {
      (p as { profileId: string }).profileId = 'x';
    });
  }
  if (ec.privateKeyPem.includes('BEGIN PRIVATE KEY') && ec.publicKeyPem.includes('BEGIN PUBLIC KEY'))
    t.pass('PKCS8 / SPKI PEM');
  t.equal(
    Buffer.from(signProfile({ profileBytes: bytesOf(PROFILE), privateKeyPem: ed.privateKeyPem }), 'base64').length,
    64,
    'raw Ed25519',
  );
  t.end();
});

t.test('a DER ECDSA signature as cosign sign-blob writes it verifies', (t) => {
  const profileBytes = bytesOf(PROFILE);
  const der = cryptoSign('sha256', profileBytes, { key: ec.privateKeyPem, dsaEncoding: 'der' }).toString('base64');
  t.equal(verifyProfile({ profileBytes, signature: der, publicKeyPem: ec.publicKeyPem }).profileId, PROFILE.profile_id);
  const p1363 = cryptoSign('sha256', profileBytes, { key: ec.privateKeyPem, dsaEncoding: 'ieee-p1363' }).toString(
    'base64',
  );
  refuses(
    t,
    () => verifyProfile({ profileBytes, signature: p1363, publicKeyPem: ec.publicKeyPem }),
    /does not verify/,
    'raw r||s',
  );

  const dir = mkdtempSync(join(tmpdir(), 'al-profile-openssl-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  writeFileSync(join(dir, 'key.pem'), ec.privateKeyPem);
  writeFileSync(join(dir, 'profile.json'), profileBytes);
  let sig: Buffer;
  try {
    sig = execFileSync('openssl', ['dgst', '-sha256', '-sign', join(dir, 'key.pem'), join(dir, 'profile.json')]);
  } catch {
    t.comment('openssl not available; the openssl check is skipped');
    return;
  }
  const p = verifyProfile({ profileBytes, signature: sig.toString('base64'), publicKeyPem: ec.publicKeyPem });
  t.equal(p.profileId, PROFILE.profile_id, 'openssl dgst -sha256 -sign (the cosign format) verifies');
  t.end();
});

t.test('signatures that do not match refuse', (t) => {
  const profileBytes = bytesOf(PROFILE);
  for (const pair of [ec, ed]) {
    const signature = signProfile({ profileBytes, privateKeyPem: pair.privateKeyPem });
    const altered = Buffer.from(profileBytes);
    altered[altered.indexOf('30')] = '3'.charCodeAt(0) + 1; // age 30 -> 40
    refuses(
      t,
      () => verifyProfile({ profileBytes: altered, signature, publicKeyPem: pair.publicKeyPem }),
      /does not verify/,
      'altered byte',
    );
    const trailing = Buffer.concat([profileBytes, Buffer.from('\n')]);
    refuses(
      t,
      () => verifyProfile({ profileBytes: trailing, signature, publicKeyPem: pair.publicKeyPem }),
      /does not verify/,
      'appended newline',
    );
  }
  const other = generateProfileKeyPair('ecdsa-p256');
  const byOther = signProfile({ profileBytes, privateKeyPem: other.privateKeyPem });
  refuses(
    t,
    () => verifyProfile({ profileBytes, signature: byOther, publicKeyPem: ec.publicKeyPem }),
    /does not verify/,
    'another EC key',
  );
  const otherEd = generateProfileKeyPair('ed25519');
  const byOtherEd = signProfile({ profileBytes, privateKeyPem: otherEd.privateKeyPem });
  refuses(
    t,
    () => verifyProfile({ profileBytes, signature: byOtherEd, publicKeyPem: ed.publicKeyPem }),
    /does not verify/,
    'another Ed25519 key',
  );
  refuses(
    t,
    () => verifyProfile({ profileBytes, signature: byOtherEd, publicKeyPem: ec.publicKeyPem }),
    /does not verify/,
    'Ed25519 signature, EC key',
  );
  refuses(
    t,
    () => verifyProfile({ profileBytes, signature: '', publicKeyPem: ec.publicKeyPem }),
    /empty/,
    'empty signature',
  );
  refuses(
    t,
    () => verifyProfile({ profileBytes, signature: 'not base64!!', publicKeyPem: ec.publicKeyPem }),
    /base64/,
    'junk signature',
  );
  refuses(
    t,
    () => verifyProfile({ profileBytes, signature: '{"base64Signature":"x"}', publicKeyPem: ec.publicKeyPem }),
    /bundle/,
    'cosign bundle',
  );
  const good = signProfile({ profileBytes, privateKeyPem: ec.privateKeyPem });
  refuses(
    t,
    () => verifyProfile({ profileBytes, signature: good, publicKeyPem: ec.privateKeyPem }),
    /PUBLIC KEY/,
    'private key as public key',
  );
  refuses(
    t,
    () => verifyProfile({ profileBytes, signature: good, publicKeyPem: 'nonsense' }),
    /PUBLIC KEY/,
    'not a PEM',
  );
  t.end();
});

t.test('RSA and P-384 keys refuse, for verifying and for signing', (t) => {
  const profileBytes = bytesOf(PROFILE);
  const pem = (pair: { publicKey: KeyObject; privateKey: KeyObject }): { publicKey: string; privateKey: string } => ({
    publicKey: pair.publicKey.export({ type: 'spki', format: 'pem' }).toString(),
    privateKey: pair.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(),
  });
  const rsa = pem(generateKeyPairSync('rsa', { modulusLength: 2048 }));
  const p384 = pem(generateKeyPairSync('ec', { namedCurve: 'secp384r1' }));
  const rsaSig = cryptoSign('sha256', profileBytes, rsa.privateKey).toString('base64');
  const p384Sig = cryptoSign('sha256', profileBytes, { key: p384.privateKey, dsaEncoding: 'der' }).toString('base64');
  refuses(
    t,
    () => verifyProfile({ profileBytes, signature: rsaSig, publicKeyPem: rsa.publicKey }),
    /unsupported key type rsa/,
    'RSA',
  );
  refuses(
    t,
    () => verifyProfile({ profileBytes, signature: p384Sig, publicKeyPem: p384.publicKey }),
    /unsupported EC curve secp384r1/,
    'P-384',
  );
  refuses(
    t,
    () => signProfile({ profileBytes, privateKeyPem: rsa.privateKey }),
    /unsupported key type rsa/,
    'signing with RSA',
  );
  refuses(
    t,
    () => signProfile({ profileBytes, privateKeyPem: p384.privateKey }),
    /unsupported EC curve/,
    'signing with P-384',
  );
  t.end();
});

t.test('content problems refuse after a valid signature', (t) => {
  const without = (k: string): Record<string, unknown> =>
    Object.fromEntries(Object.entries(PROFILE).filter(([f]) => f !== k));
  refuses(
    t,
    () => signedVerify(without('maximum_clock_skew_seconds')),
    /missing maximum_clock_skew_seconds/,
    'missing field',
  );
  refuses(t, () => signedVerify({ ...PROFILE, verify_tls: false }), /unexpected verify_tls/, 'extra field');
  const text = JSON.stringify(PROFILE).replace('{', '{"maximum_authorization_age_seconds":86400,');
  refuses(t, () => signedVerify(text), /duplicate key/, 'duplicate key');
  refuses(t, () => signedVerify(JSON.stringify(PROFILE).replace('{', '{"__proto__":{},')), /__proto__/, '__proto__');
  refuses(
    t,
    () =>
      signedVerify(
        JSON.stringify(PROFILE).replace('"maximum_clock_skew_seconds":5', '"maximum_clock_skew_seconds":1e400'),
      ),
    /out of range/,
    'non-finite bound',
  );
  refuses(
    t,
    () =>
      signedVerify(
        JSON.stringify(PROFILE).replace('"provider_http_timeout_seconds":10', '"provider_http_timeout_seconds":NaN'),
      ),
    /not strict JSON/,
    'NaN literal',
  );
  refuses(t, () => signedVerify([PROFILE]), /root must be an object/, 'array root');
  refuses(
    t,
    () => signedVerify({ ...PROFILE, maximum_authorization_age_seconds: -1 }),
    /must be positive/,
    'negative age',
  );
  refuses(t, () => signedVerify({ ...PROFILE, maximum_authorization_ttl_seconds: 0 }), /must be positive/, 'zero TTL');
  refuses(t, () => signedVerify({ ...PROFILE, maximum_clock_skew_seconds: -0.5 }), /at least 0/, 'negative skew');
  refuses(
    t,
    () => signedVerify({ ...PROFILE, maximum_authorization_age_seconds: 86401 }),
    /at most 86400/,
    'age above a day',
  );
  refuses(
    t,
    () => signedVerify({ ...PROFILE, provider_http_timeout_seconds: 301 }),
    /at most 300/,
    'timeout above 300 s',
  );
  refuses(t, () => signedVerify({ ...PROFILE, provider_http_timeout_seconds: '10' }), /finite number/, 'string bound');
  refuses(
    t,
    () => signedVerify({ ...PROFILE, authorization_http_timeout_seconds: true }),
    /finite number/,
    'boolean bound',
  );
  refuses(
    t,
    () => signedVerify({ ...PROFILE, provider_response_max_bytes: 1.5 }),
    /positive integer/,
    'fractional cap',
  );
  refuses(t, () => signedVerify({ ...PROFILE, provider_response_max_bytes: 0 }), /positive integer/, 'zero cap');
  refuses(
    t,
    () => signedVerify({ ...PROFILE, authorization_response_max_bytes: 64 * 1024 * 1024 + 1 }),
    /at most 67108864/,
    'cap above 64 MiB',
  );
  refuses(t, () => signedVerify({ ...PROFILE, profile_id: '' }), /profile_id/, 'empty profile id');
  refuses(t, () => signedVerify({ ...PROFILE, profile_id: 7 }), /profile_id/, 'numeric profile id');
  for (const [url, why] of [
    ['http://authz.internal.example/v1/decide', /not https/],
    ['https://user:pw@authz.internal.example/v1/decide', /userinfo/],
    ['https://authz.internal.example/v1/decide?x=1', /query/],
    ['https://AUTHZ.internal.example/v1/decide', /canonical/],
    ['https://authz.internal.example:443/v1/decide', /canonical/],
    ['https://authz.internal.example/v1/decide#f', /fragment/],
  ] as const) {
    refuses(t, () => signedVerify({ ...PROFILE, authorization_url: url }), why, url);
  }
  t.equal(
    signedVerify({ ...PROFILE, authorization_url: 'https://authz.internal.example:8443/v1/decide' }).authorizationUrl,
    'https://authz.internal.example:8443/v1/decide',
    'a non-default port is canonical',
  );
  t.equal(signedVerify({ ...PROFILE, maximum_clock_skew_seconds: 0 }).maximumClockSkewMs, 0, 'zero skew is accepted');
  refuses(
    t,
    () => signedVerify(Buffer.concat([Buffer.from('{"profile_id":"'), Buffer.from([0xff]), Buffer.from('"}')])),
    /UTF-8/,
    'not UTF-8',
  );
  t.end();
});

t.test('loadVerifiedProfile reads the three files and refuses a missing one', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'al-profile-load-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const profileBytes = bytesOf(PROFILE);
  writeFileSync(join(dir, 'profile.json'), profileBytes);
  writeFileSync(join(dir, 'profile.sig'), signProfile({ profileBytes, privateKeyPem: ed.privateKeyPem }) + '\n');
  writeFileSync(join(dir, 'key.pub'), ed.publicKeyPem);
  const paths = {
    profilePath: join(dir, 'profile.json'),
    signaturePath: join(dir, 'profile.sig'),
    publicKeyPath: join(dir, 'key.pub'),
  };
  const p = await loadVerifiedProfile(paths);
  t.equal(p.profileId, PROFILE.profile_id);
  const err = await loadVerifiedProfile({ ...paths, signaturePath: join(dir, 'nope.sig') }).catch((e: unknown) => e);
  t.ok(isActionLedgerError(err, 'profile_invalid'), 'missing signature file refuses');
  t.match((err as Error).message, /ENOENT/);
  writeFileSync(join(dir, 'big.json'), Buffer.alloc(70 * 1024, 0x20));
  const big = await loadVerifiedProfile({ ...paths, profilePath: join(dir, 'big.json') }).catch((e: unknown) => e);
  t.ok(isActionLedgerError(big, 'profile_invalid'), 'oversized profile refuses');
});

t.test('the profile CLI round trips as a child process', (t) => {
  const run = (...args: string[]): { code: number | null; out: string; err: string } => {
    const r = spawnSync(...nodeCommand([BIN, 'profile', ...args]), { encoding: 'utf8' });
    return { code: r.status, out: r.stdout, err: r.stderr };
  };
  const dir = mkdtempSync(join(tmpdir(), 'al-profile-cli-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const profilePath = join(dir, 'profile.json');
  writeFileSync(profilePath, bytesOf(PROFILE));

  for (const kind of ['ecdsa-p256', 'ed25519']) {
    const keys = join(dir, kind);
    const g = run('keygen', '--kind', kind, '--out-dir', keys);
    t.equal(g.code, 0, `keygen ${kind}: ${g.err}`);
    t.match(JSON.parse(g.out), { ok: true, kind });
    t.equal(statSync(join(keys, 'profile-signing.key')).mode & 0o777, 0o600, 'private key is 0600');
    t.equal(run('keygen', '--kind', kind, '--out-dir', keys).code, 2, 'refuses to overwrite a key');

    const sigPath = join(dir, `${kind}.sig`);
    const s = run('sign', '--profile', profilePath, '--key', join(keys, 'profile-signing.key'), '--out', sigPath);
    t.equal(s.code, 0, `sign: ${s.err}`);
    t.match(JSON.parse(s.out), { ok: true, profile_id: PROFILE.profile_id });
    const toStdout = run('sign', '--profile', profilePath, '--key', join(keys, 'profile-signing.key'));
    t.equal(toStdout.code, 0);
    t.match(toStdout.out, /^[A-Za-z0-9+/]+=*\n$/, 'without --out the signature goes to stdout');

    const v = run(
      'verify',
      '--profile',
      profilePath,
      '--signature',
      sigPath,
      '--key',
      join(keys, 'profile-signing.pub'),
    );
    t.equal(v.code, 0, `verify: ${v.err}`);
    const ok = JSON.parse(v.out) as Record<string, unknown>;
    t.same(Object.keys(ok).sort(), ['ok', 'profile_id', 'sha256']);
    t.match(ok, { ok: true, profile_id: PROFILE.profile_id, sha256: /^[0-9a-f]{64}$/ });

    const altered = join(dir, `${kind}-altered.json`);
    writeFileSync(
      altered,
      readFileSync(profilePath, 'utf8').replace('"maximum_clock_skew_seconds": 5', '"maximum_clock_skew_seconds": 50'),
    );
    const bad = run('verify', '--profile', altered, '--signature', sigPath, '--key', join(keys, 'profile-signing.pub'));
    t.equal(bad.code, 1, 'altered profile exits 1');
    t.match(JSON.parse(bad.out), { ok: false, error: 'profile_invalid', message: /does not verify/ });
  }

  const invalidProfile = join(dir, 'invalid.json');
  writeFileSync(invalidProfile, bytesOf({ ...PROFILE, extra: 1 }));
  const refused = run(
    'sign',
    '--profile',
    invalidProfile,
    '--key',
    join(dir, 'ed25519', 'profile-signing.key'),
    '--out',
    join(dir, 'x.sig'),
  );
  t.equal(refused.code, 1, 'sign refuses a profile the dispatcher would refuse');
  t.match(JSON.parse(refused.out), { ok: false, error: 'profile_invalid', message: /unexpected extra/ });

  t.equal(run().code, 2, 'no subcommand');
  t.equal(run('frobnicate').code, 2, 'unknown subcommand');
  t.equal(run('verify', '--profile', profilePath).code, 2, 'missing options');
  t.equal(run('keygen', '--kind', 'rsa', '--out-dir', dir).code, 2, 'bad kind');
  t.equal(run('sign', '--profile', profilePath, '--key', 'k', '--bogus', 'x').code, 2, 'unknown option');
  t.end();
});
