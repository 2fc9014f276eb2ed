/**
 * The signed dispatch profile: the handful of numbers and the one URL that decide how a dispatcher talks to
 * the authorizer and to providers (authorization URL, how old and how long-lived a decision may be, clock
 * skew, HTTP timeouts, response byte caps). A worker that could be started with a looser profile than the one
 * security reviewed would make every freshness check negotiable, so the profile is a signed file, verified at
 * start-up before a single byte of it is parsed.
 *
 * Signature formats (both with node:crypto only, no cosign binary needed at run time):
 * - ECDSA P-256, exactly what `cosign sign-blob --key` writes with `--output-signature`: base64 of an ASN.1
 *   DER ECDSA signature over the SHA-256 of the file. `openssl dgst -sha256 -sign key.pem file | base64`
 *   produces the same format. The public key is an SPKI `PUBLIC KEY` PEM (`cosign.pub`).
 * - Ed25519: base64 of the raw 64-byte signature over the file.
 * The algorithm comes from the public key, never from the signature file, so a signature cannot choose a
 * weaker check. Any other key type (RSA, P-384, secp256k1, ...) is refused.
 *
 * What verification proves: the bytes were signed by the holder of the private key that matches the public
 * key given, and they form a profile within the bounds below. What it does not prove: that the key is still
 * trusted (there is no revocation, expiry or transparency-log check, unlike `cosign verify-blob` with a
 * bundle), that the profile is the newest one signed (an old, validly signed profile replays), or that the
 * public key file itself was not swapped on the machine. Those belong to how the key and files are deployed.
 */
import {
  createHash,
  createPrivateKey,
  createPublicKey,
  generateKeyPairSync,
  sign as cryptoSign,
  verify as cryptoVerify,
  type KeyObject,
} from 'node:crypto';
import { open, readFile } from 'node:fs/promises';
import { ActionLedgerError } from '../core/errors.js';
import { parseStrictJson, type JsonObject, type JsonValue } from '../core/json.js';
import { canonicalHttpsProblem } from '../core/url.js';

export type ProfileKeyKind = 'ecdsa-p256' | 'ed25519';
export type ProfileSignatureAlgorithm = 'ecdsa-p256-sha256' | 'ed25519';

/** The compiled, verified profile: camelCase, durations in milliseconds, deeply frozen. */
export interface DispatchProfile {
  readonly profileId: string;
  readonly authorizationUrl: string;
  readonly maximumAuthorizationAgeMs: number;
  readonly maximumAuthorizationTtlMs: number;
  /** May be 0: clocks are trusted to agree exactly. */
  readonly maximumClockSkewMs: number;
  readonly authorizationHttpTimeoutMs: number;
  readonly providerHttpTimeoutMs: number;
  readonly authorizationResponseMaxBytes: number;
  readonly providerResponseMaxBytes: number;
  /** Lower-case hex SHA-256 of the exact profile bytes that were verified (for evidence and logs). */
  readonly sha256: string;
  readonly signatureAlgorithm: ProfileSignatureAlgorithm;
  /** Lower-case hex SHA-256 of the verifying public key's SPKI DER: which key vouched for this profile. */
  readonly publicKeySha256: string;
}

/** Largest profile file accepted; the real one is a few hundred bytes. */
export const PROFILE_MAX_BYTES = 64 * 1024;
const MAX_WINDOW_SECONDS = 86_400;
const MAX_SKEW_SECONDS = 3_600;
const MAX_TIMEOUT_SECONDS = 300;
const MAX_RESPONSE_BYTES = 64 * 1024 * 1024;

type FieldRule =
  | { kind: 'string' }
  | { kind: 'url' }
  | { kind: 'seconds'; max: number; allowZero: boolean }
  | { kind: 'bytes'; max: number };

/** Exactly the documented profile fields: a missing or an extra field refuses the profile. */
const FIELDS: Readonly<Record<string, FieldRule>> = Object.freeze({
  profile_id: { kind: 'string' },
  authorization_url: { kind: 'url' },
  maximum_authorization_age_seconds: { kind: 'seconds', max: MAX_WINDOW_SECONDS, allowZero: false },
  maximum_authorization_ttl_seconds: { kind: 'seconds', max: MAX_WINDOW_SECONDS, allowZero: false },
  maximum_clock_skew_seconds: { kind: 'seconds', max: MAX_SKEW_SECONDS, allowZero: true },
  authorization_http_timeout_seconds: { kind: 'seconds', max: MAX_TIMEOUT_SECONDS, allowZero: false },
  provider_http_timeout_seconds: { kind: 'seconds', max: MAX_TIMEOUT_SECONDS, allowZero: false },
  authorization_response_max_bytes: { kind: 'bytes', max: MAX_RESPONSE_BYTES },
  provider_response_max_bytes: { kind: 'bytes', max: MAX_RESPONSE_BYTES },
});

/** Every profile that {@link verifyProfile} returned; a structurally identical object made elsewhere is not in it. */
const verified = new WeakSet<DispatchProfile>();

function invalid(message: string, cause?: unknown): ActionLedgerError {
  return new ActionLedgerError('profile_invalid', `dispatch profile: ${message}`, cause === undefined ? {} : { cause });
}

interface VerifyKey {
  key: KeyObject;
  algorithm: ProfileSignatureAlgorithm;
  spkiSha256: string;
}

/** Reads a public key, which must be one SPKI `PUBLIC KEY` PEM of a supported type. */
function publicKeyFromPem(publicKeyPem: string): VerifyKey {
  const pem = publicKeyPem.trim();
  // createPublicKey also derives a key from a private key or a certificate; a private key in the public-key
  // slot is a deployment mistake worth refusing, not quietly accepting.
  if (!/^-----BEGIN PUBLIC KEY-----\r?\n[A-Za-z0-9+/=\r\n]+-----END PUBLIC KEY-----$/.test(pem)) {
    throw invalid('the public key must be exactly one PEM "PUBLIC KEY" (SPKI) block');
  }
  let key: KeyObject;
  try {
    key = createPublicKey({ key: pem, format: 'pem' });
  } catch (cause) {
    throw invalid('the public key could not be read', cause);
  }
  const algorithm = algorithmOf(key);
  const spkiSha256 = createHash('sha256')
    .update(key.export({ type: 'spki', format: 'der' }))
    .digest('hex');
  return { key, algorithm, spkiSha256 };
}

function algorithmOf(key: KeyObject): ProfileSignatureAlgorithm {
  const type = key.asymmetricKeyType;
  if (type === 'ed25519') return 'ed25519';
  if (type === 'ec') {
    const curve = key.asymmetricKeyDetails?.namedCurve;
    if (curve === 'prime256v1') return 'ecdsa-p256-sha256';
    throw invalid(`unsupported EC curve ${String(curve)} (only P-256 / prime256v1)`);
  }
  throw invalid(`unsupported key type ${String(type)} (only ECDSA P-256 and Ed25519)`);
}

/** Strict standard base64 (as cosign and openssl write it); Buffer.from(.., 'base64') alone skips junk. */
function decodeSignature(signature: string): Buffer {
  const text = signature.trim();
  if (text === '') throw invalid('the signature is empty');
  if (text.startsWith('{')) {
    throw invalid('the signature looks like a JSON bundle; give the base64 signature (cosign --output-signature)');
  }
  if (text.length % 4 !== 0 || !/^[A-Za-z0-9+/]+={0,2}$/.test(text)) throw invalid('the signature is not base64');
  const bytes = Buffer.from(text, 'base64');
  if (bytes.toString('base64') !== text) throw invalid('the signature is not canonical base64');
  return bytes;
}

function signatureMatches(bytes: Buffer, signature: Buffer, key: VerifyKey): boolean {
  try {
    if (key.algorithm === 'ed25519') {
      if (signature.length !== 64) return false;
      return cryptoVerify(null, bytes, key.key, signature);
    }
    // DER of a P-256 signature is at most 72 bytes; the raw r||s (IEEE P1363) form is refused by the DER parse.
    if (signature.length > 72) return false;
    return cryptoVerify('sha256', bytes, { key: key.key, dsaEncoding: 'der' }, signature);
  } catch {
    // OpenSSL throws on some malformed DER instead of returning false; either way it does not verify.
    return false;
  }
}

/**
 * Verifies the signature over the exact profile bytes, then (and only then) parses and checks them.
 *
 * Guarantees: the returned profile came from these bytes, which were signed by the holder of the private key
 * matching `publicKeyPem`; it has exactly the nine fields, each within bounds (profile_id a non-blank string
 * of at most 200 characters, age and TTL up to 24 h, skew 0..1 h, timeouts up to 300 s, byte caps positive
 * integers up to 64 MiB) and a canonical https authorization URL; it is deeply frozen. Does not prove the key is still trusted or that this is the latest profile (see
 * the module comment). Throws `profile_invalid` naming the problem for every failure.
 */
export function verifyProfile(input: {
  profileBytes: Buffer;
  signature: string;
  publicKeyPem: string;
}): DispatchProfile {
  const { profileBytes } = input;
  if (!Buffer.isBuffer(profileBytes)) throw invalid('the profile must be given as bytes');
  if (profileBytes.length > PROFILE_MAX_BYTES) throw invalid(`the profile exceeds ${PROFILE_MAX_BYTES} bytes`);
  const key = publicKeyFromPem(input.publicKeyPem);
  const signature = decodeSignature(input.signature);
  if (!signatureMatches(profileBytes, signature, key)) {
    throw invalid(`the ${key.algorithm} signature does not verify with the given public key`);
  }
  const profile = compileProfile(profileBytes, key);
  verified.add(profile);
  return profile;
}

/** True only for an object that {@link verifyProfile} returned in this process. */
export function isVerifiedProfile(value: unknown): value is DispatchProfile {
  return typeof value === 'object' && value !== null && verified.has(value as DispatchProfile);
}

function compileProfile(bytes: Buffer, key: VerifyKey): DispatchProfile {
  let doc: JsonValue;
  try {
    doc = parseStrictJson(bytes, { requireObject: true, bounds: { maxDepth: 2, maxBytes: PROFILE_MAX_BYTES } });
  } catch (cause) {
    throw invalid(`not strict JSON: ${(cause as Error).message}`, cause);
  }
  const raw = doc as JsonObject;
  const present = Object.keys(raw);
  const missing = Object.keys(FIELDS).filter((f) => !Object.prototype.hasOwnProperty.call(raw, f));
  const extra = present.filter((f) => !Object.prototype.hasOwnProperty.call(FIELDS, f));
  if (missing.length > 0 || extra.length > 0) {
    const parts = [];
    if (missing.length > 0) parts.push(`missing ${missing.join(', ')}`);
    if (extra.length > 0) parts.push(`unexpected ${extra.join(', ')}`);
    throw invalid(`field set mismatch: ${parts.join('; ')}`);
  }
  const v: Record<string, string | number> = {};
  for (const [name, rule] of Object.entries(FIELDS)) v[name] = checkField(name, rule, raw[name] ?? null);
  const ms = (name: string): number => v[name] as number;
  return Object.freeze({
    profileId: v.profile_id as string,
    authorizationUrl: v.authorization_url as string,
    maximumAuthorizationAgeMs: ms('maximum_authorization_age_seconds'),
    maximumAuthorizationTtlMs: ms('maximum_authorization_ttl_seconds'),
    maximumClockSkewMs: ms('maximum_clock_skew_seconds'),
    authorizationHttpTimeoutMs: ms('authorization_http_timeout_seconds'),
    providerHttpTimeoutMs: ms('provider_http_timeout_seconds'),
    authorizationResponseMaxBytes: v.authorization_response_max_bytes as number,
    providerResponseMaxBytes: v.provider_response_max_bytes as number,
    sha256: createHash('sha256').update(bytes).digest('hex'),
    signatureAlgorithm: key.algorithm,
    publicKeySha256: key.spkiSha256,
  });
}

/** Checks one field; seconds come back as whole milliseconds. */
function checkField(name: string, rule: FieldRule, value: JsonValue): string | number {
  switch (rule.kind) {
    case 'string':
      if (typeof value !== 'string' || value.trim() === '' || value.length > 200) {
        throw invalid(`${name} must be a non-empty string of at most 200 characters`);
      }
      return value;
    case 'url': {
      if (typeof value !== 'string') throw invalid(`${name} must be a string`);
      const problem = canonicalHttpsProblem(value);
      if (problem !== null) throw invalid(`${name} ${problem}`);
      return value;
    }
    case 'seconds': {
      if (typeof value !== 'number' || !Number.isFinite(value)) throw invalid(`${name} must be a finite number`);
      const low = rule.allowZero ? value < 0 : value <= 0;
      if (low || value > rule.max) {
        throw invalid(`${name} must be ${rule.allowZero ? 'at least 0' : 'positive'} and at most ${rule.max} seconds`);
      }
      const milliseconds = Math.round(value * 1000);
      if (!rule.allowZero && milliseconds < 1) throw invalid(`${name} is below one millisecond`);
      return milliseconds;
    }
    case 'bytes':
      if (typeof value !== 'number' || !Number.isSafeInteger(value) || value <= 0 || value > rule.max) {
        throw invalid(`${name} must be a positive integer of at most ${rule.max} bytes`);
      }
      return value;
  }
}

/**
 * Signs profile bytes in the format {@link verifyProfile} accepts: for a P-256 key, base64 DER ECDSA over
 * SHA-256 (cosign's format); for Ed25519, base64 of the raw signature. The key is an unencrypted PKCS8 (or
 * SEC1) PEM; cosign's encrypted key files are not read here (use cosign itself for those). Signs bytes as
 * they are and does not check them as a profile. Throws `profile_invalid` for an unreadable or unsupported key.
 */
export function signProfile(input: { profileBytes: Buffer; privateKeyPem: string }): string {
  let key: KeyObject;
  try {
    key = createPrivateKey({ key: input.privateKeyPem, format: 'pem' });
  } catch (cause) {
    throw invalid('the private key could not be read (an unencrypted PEM is required)', cause);
  }
  const algorithm = algorithmOf(key);
  const signature =
    algorithm === 'ed25519'
      ? cryptoSign(null, input.profileBytes, key)
      : cryptoSign('sha256', input.profileBytes, { key, dsaEncoding: 'der' });
  return signature.toString('base64');
}

/** The SPKI PEM of the public half of a private key PEM (what `profile sign` checks its result against). */
export function publicKeyPemOf(privateKeyPem: string): string {
  try {
    return createPublicKey({ key: privateKeyPem, format: 'pem' }).export({ type: 'spki', format: 'pem' }).toString();
  } catch (cause) {
    throw invalid('the private key could not be read (an unencrypted PEM is required)', cause);
  }
}

/** A fresh signing key pair: PKCS8 private key PEM and SPKI public key PEM. */
export function generateProfileKeyPair(kind: ProfileKeyKind): { publicKeyPem: string; privateKeyPem: string } {
  let pair: { publicKey: string; privateKey: string };
  if (kind === 'ed25519') {
    pair = generateKeyPairSync('ed25519', {
      publicKeyEncoding: { type: 'spki', format: 'pem' },
      privateKeyEncoding: { type: 'pkcs8', format: 'pem' },
    });
  } else if (kind === 'ecdsa-p256') {
    pair = generateKeyPairSync('ec', {
      namedCurve: 'prime256v1',
      publicKeyEncoding: { type: 'spki', format: 'pem' },
      privateKeyEncoding: { type: 'pkcs8', format: 'pem' },
    });
  } else {
    throw invalid(`unsupported key kind ${String(kind)} (ecdsa-p256 or ed25519)`);
  }
  return { publicKeyPem: pair.publicKey, privateKeyPem: pair.privateKey };
}

async function readProfileBytes(profilePath: string): Promise<Buffer> {
  let handle;
  try {
    handle = await open(profilePath, 'r');
  } catch (cause) {
    throw invalid(
      `cannot open the profile file ${profilePath}: ${(cause as NodeJS.ErrnoException).code ?? 'error'}`,
      cause,
    );
  }
  try {
    const { size } = await handle.stat();
    if (size > PROFILE_MAX_BYTES) throw invalid(`the profile file exceeds ${PROFILE_MAX_BYTES} bytes`);
    return await handle.readFile();
  } catch (cause) {
    if (cause instanceof ActionLedgerError) throw cause;
    throw invalid(`cannot read the profile file ${profilePath}`, cause);
  } finally {
    await handle.close();
  }
}

async function readText(path: string, what: string): Promise<string> {
  try {
    const bytes = await readFile(path);
    if (bytes.length > PROFILE_MAX_BYTES) throw invalid(`the ${what} file exceeds ${PROFILE_MAX_BYTES} bytes`);
    return new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch (cause) {
    if (cause instanceof ActionLedgerError) throw cause;
    const code = (cause as NodeJS.ErrnoException).code ?? 'not UTF-8';
    throw invalid(`cannot read the ${what} file ${path}: ${code}`, cause);
  }
}

/**
 * Reads the profile, its signature and the public key, and verifies. The profile file is read once and the
 * same buffer is verified and parsed, so a file swapped between the two steps cannot slip in unverified bytes.
 * Throws `profile_invalid` (including for unreadable files).
 */
export async function loadVerifiedProfile(paths: {
  profilePath: string;
  signaturePath: string;
  publicKeyPath: string;
}): Promise<DispatchProfile> {
  const profileBytes = await readProfileBytes(paths.profilePath);
  const signature = await readText(paths.signaturePath, 'signature');
  const publicKeyPem = await readText(paths.publicKeyPath, 'public key');
  return verifyProfile({ profileBytes, signature, publicKeyPem });
}
