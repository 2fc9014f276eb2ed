/**
 * A development and test PKI: ECDSA P-256 certificate authorities, server and client certificates, made with
 * @peculiar/x509 over node:crypto's WebCrypto. Nothing here is for production: keys are generated in process
 * and, for the dev sandbox, written to a git-ignored data folder.
 *
 * Every certificate carries what Node's TLS stack (OpenSSL 3) checks: a CA has basicConstraints CA:true and
 * keyCertSign; a leaf has digitalSignature, the matching extended key usage (serverAuth or clientAuth), and a
 * server certificate lists each host as a DNS or IP subjectAltName (Node verifies host names against SANs
 * only, never the common name).
 */
import 'reflect-metadata'; // tsyringe, used inside @peculiar/x509, needs the Reflect metadata API first
import { X509Certificate as NodeX509, createPrivateKey, randomBytes, webcrypto } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { isIP } from 'node:net';
import { dirname, join } from 'node:path';
import * as x509 from '@peculiar/x509';

const crypto = webcrypto;
type CryptoKey = webcrypto.CryptoKey;
const EC_KEY: webcrypto.EcKeyGenParams = { name: 'ECDSA', namedCurve: 'P-256' };
const SIGNING: webcrypto.EcdsaParams = { name: 'ECDSA', hash: 'SHA-256' };
const DAY_MS = 24 * 60 * 60 * 1000;

/** A PEM certificate and its PKCS#8 PEM private key. */
export interface PemPair {
  cert: string;
  key: string;
}

/** A certificate authority that can issue certificates: plain data, so it can be written to and read from disk. */
export interface CertificateAuthority extends PemPair {
  name: string;
}

/** Validity of an issued certificate. `expired: true` makes one that ended a day ago (for tests). */
export interface ValidityOptions {
  notBefore?: Date;
  notAfter?: Date;
  expired?: boolean;
}

export interface ServerCertOptions extends ValidityOptions {
  /** Host names and IP addresses, each written as a DNS or IP subjectAltName. Default: localhost, 127.0.0.1, ::1. */
  hosts?: string[];
}

function serialNumber(): string {
  // 16 random bytes with the top bit clear: a positive DER integer, as RFC 5280 requires.
  const bytes = randomBytes(16);
  bytes[0] = ((bytes[0] ?? 0) & 0x7f) | 0x01;
  return bytes.toString('hex');
}

function validity(options: ValidityOptions, defaultDays: number): { notBefore: Date; notAfter: Date } {
  const now = Date.now();
  if (options.expired === true) {
    return { notBefore: new Date(now - 30 * DAY_MS), notAfter: new Date(now - DAY_MS) };
  }
  return {
    // A minute of back-dating absorbs clock differences between the issuing and the verifying process.
    notBefore: options.notBefore ?? new Date(now - 60_000),
    notAfter: options.notAfter ?? new Date(now + defaultDays * DAY_MS),
  };
}

async function keyToPem(key: CryptoKey): Promise<string> {
  const der = await crypto.subtle.exportKey('pkcs8', key);
  return x509.PemConverter.encode(der, 'PRIVATE KEY');
}

async function importCaKey(ca: CertificateAuthority): Promise<CryptoKey> {
  const der = x509.PemConverter.decodeFirst(ca.key);
  return crypto.subtle.importKey('pkcs8', der, EC_KEY, false, ['sign']);
}

function dn(commonName: string): string {
  if (!/^[A-Za-z0-9 ._:-]+$/.test(commonName)) throw new Error(`unsupported characters in name: ${commonName}`);
  return `CN=${commonName}`;
}

/**
 * Creates a self-signed ECDSA P-256 root CA named `CN=<name>`, valid for `days` (default 3650).
 * Each call makes an unrelated CA: certificates from one never verify against another.
 */
export async function createCa(
  name: string,
  options: ValidityOptions & { days?: number } = {},
): Promise<CertificateAuthority> {
  const keys = await crypto.subtle.generateKey(EC_KEY, true, ['sign', 'verify']);
  const cert = await x509.X509CertificateGenerator.createSelfSigned(
    {
      serialNumber: serialNumber(),
      name: dn(name),
      ...validity(options, options.days ?? 3650),
      signingAlgorithm: SIGNING,
      keys,
      extensions: [
        new x509.BasicConstraintsExtension(true, 0, true),
        new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
        await x509.SubjectKeyIdentifierExtension.create(keys.publicKey, false, crypto),
      ],
    },
    crypto,
  );
  return { name, cert: cert.toString('pem'), key: await keyToPem(keys.privateKey) };
}

async function issueLeaf(
  ca: CertificateAuthority,
  subject: string,
  usage: x509.ExtendedKeyUsage,
  names: x509.JsonGeneralName[],
  options: ValidityOptions,
): Promise<PemPair> {
  const caCert = new x509.X509Certificate(ca.cert);
  const keys = await crypto.subtle.generateKey(EC_KEY, true, ['sign', 'verify']);
  const extensions: x509.Extension[] = [
    new x509.BasicConstraintsExtension(false, undefined, true),
    new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
    new x509.ExtendedKeyUsageExtension([usage], false),
    await x509.SubjectKeyIdentifierExtension.create(keys.publicKey, false, crypto),
    await x509.AuthorityKeyIdentifierExtension.create(caCert.publicKey, false, crypto),
  ];
  if (names.length > 0) extensions.push(new x509.SubjectAlternativeNameExtension(names, false));
  const cert = await x509.X509CertificateGenerator.create(
    {
      serialNumber: serialNumber(),
      subject: dn(subject),
      issuer: caCert.subject,
      ...validity(options, 365),
      signingAlgorithm: SIGNING,
      publicKey: keys.publicKey,
      signingKey: await importCaKey(ca),
      extensions,
    },
    crypto,
  );
  return { cert: cert.toString('pem'), key: await keyToPem(keys.privateKey) };
}

/**
 * Issues a TLS server certificate signed by `ca`, valid for each of `hosts` (IP literals become IP SANs,
 * everything else DNS SANs), with extended key usage serverAuth. The common name is the first host.
 */
export async function issueServerCert(ca: CertificateAuthority, options: ServerCertOptions = {}): Promise<PemPair> {
  const hosts = options.hosts ?? ['localhost', '127.0.0.1', '::1'];
  if (hosts.length === 0) throw new Error('a server certificate needs at least one host');
  const names = hosts.map((h): x509.JsonGeneralName => ({ type: isIP(h) === 0 ? 'dns' : 'ip', value: h }));
  return issueLeaf(ca, hosts[0] ?? 'server', x509.ExtendedKeyUsage.serverAuth, names, options);
}

/** Issues a TLS client certificate `CN=<commonName>` signed by `ca`, with extended key usage clientAuth. */
export async function issueClientCert(
  ca: CertificateAuthority,
  commonName: string,
  options: ValidityOptions = {},
): Promise<PemPair> {
  return issueLeaf(ca, commonName, x509.ExtendedKeyUsage.clientAuth, [], options);
}

/** The dev sandbox PKI: one CA, a server certificate for localhost and a client certificate, with file paths. */
export interface DevPki {
  dir: string;
  ca: CertificateAuthority;
  server: PemPair;
  client: PemPair;
  paths: { caCert: string; serverCert: string; serverKey: string; clientCert: string; clientKey: string };
}

const FILES = {
  caCert: 'ca.crt',
  caKey: 'ca.key',
  serverCert: 'server.crt',
  serverKey: 'server.key',
  clientCert: 'client.crt',
  clientKey: 'client.key',
} as const;

function devPki(dir: string, ca: CertificateAuthority, server: PemPair, client: PemPair): DevPki {
  const p = (f: string): string => join(dir, f);
  return {
    dir,
    ca,
    server,
    client,
    paths: {
      caCert: p(FILES.caCert),
      serverCert: p(FILES.serverCert),
      serverKey: p(FILES.serverKey),
      clientCert: p(FILES.clientCert),
      clientKey: p(FILES.clientKey),
    },
  };
}

/**
 * Generates a fresh dev PKI (CA `actionledger-dev-ca`, server certificate for localhost / 127.0.0.1 / ::1,
 * client certificate `CN=actionledger-dispatcher`) and writes it to `dir`, replacing what was there.
 * The folder is mode 0700 and every key file 0600. The files are written into a sibling temporary folder and
 * renamed into place, so a reader never sees a CA from one generation beside a certificate from another.
 */
export async function writePki(dir: string): Promise<DevPki> {
  const ca = await createCa('actionledger-dev-ca');
  const server = await issueServerCert(ca, { hosts: ['localhost', '127.0.0.1', '::1'] });
  const client = await issueClientCert(ca, 'actionledger-dispatcher');
  mkdirSync(dirname(dir), { recursive: true, mode: 0o700 });
  const tmp = `${dir}.tmp-${randomBytes(6).toString('hex')}`;
  mkdirSync(tmp, { mode: 0o700 });
  const contents: Record<keyof typeof FILES, string> = {
    caCert: ca.cert,
    caKey: ca.key,
    serverCert: server.cert,
    serverKey: server.key,
    clientCert: client.cert,
    clientKey: client.key,
  };
  for (const [field, file] of Object.entries(FILES) as [keyof typeof FILES, string][]) {
    const mode = file.endsWith('.key') ? 0o600 : 0o644;
    writeFileSync(join(tmp, file), contents[field], { mode, flag: 'wx' });
    chmodSync(join(tmp, file), mode); // whatever the umask
  }
  chmodSync(tmp, 0o700);
  if (existsSync(dir)) {
    const old = `${dir}.old-${randomBytes(6).toString('hex')}`;
    renameSync(dir, old);
    rmSync(old, { recursive: true, force: true });
  }
  renameSync(tmp, dir);
  return devPki(dir, ca, server, client);
}

/**
 * Reads the dev PKI in `dir` and returns it if it is complete and usable: every file present, the server and
 * client certificates issued by the CA and matching their keys, and nothing expiring within `minValidDays`
 * (default 7). Returns null otherwise; never throws for a missing or broken folder.
 */
export function loadPki(dir: string, minValidDays = 7): DevPki | null {
  try {
    const read = (f: string): string => readFileSync(join(dir, f), 'utf8');
    const caCert = new NodeX509(read(FILES.caCert));
    const ca: CertificateAuthority = {
      name: caCert.subject.replace(/^CN=/, ''),
      cert: read(FILES.caCert),
      key: read(FILES.caKey),
    };
    const server = { cert: read(FILES.serverCert), key: read(FILES.serverKey) };
    const client = { cert: read(FILES.clientCert), key: read(FILES.clientKey) };
    const horizon = Date.now() + minValidDays * DAY_MS;
    for (const [pair, issued] of [
      [ca, false],
      [server, true],
      [client, true],
    ] as const) {
      const cert = new NodeX509(pair.cert);
      if (Date.parse(cert.validTo) < horizon) return null;
      if (!cert.checkPrivateKey(createPrivateKey(pair.key))) return null;
      if (issued && !(cert.checkIssued(caCert) && cert.verify(caCert.publicKey))) return null;
    }
    return devPki(dir, ca, server, client);
  } catch {
    return null;
  }
}

/**
 * Returns the dev PKI stored in `dir` when it is usable ({@link loadPki}), otherwise generates and stores a
 * new one ({@link writePki}). Generated once, then reused across `npm start` runs until it nears expiry.
 * Limit: two processes racing on an empty folder may each generate; the last rename wins and the loser's
 * in-memory copy is then stale, so start the sandbox from one process.
 */
export async function loadOrCreateDevPki(dir: string): Promise<DevPki> {
  return loadPki(dir) ?? (await writePki(dir));
}
