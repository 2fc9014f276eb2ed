/**
 * Real mTLS fixtures for tests: one PKI per test run (testPki), sandbox provider and
 * authorizer servers on loopback, and dispatcher agents, each stopped or closed at the test's teardown.
 */
import { readFileSync } from 'node:fs';
import type { Test } from 'tap';
import type { Agent } from 'undici';
import { createMtlsAgent, type MtlsAgentOptions } from '../../transport/http-client.js';
import { SandboxAuthorizer, type SandboxAuthorizerOptions } from '../../sandbox/authorizer.js';
import {
  createCa,
  issueClientCert,
  issueServerCert,
  type CertificateAuthority,
  type PemPair,
} from '../../sandbox/pki.js';
import { SandboxProvider, type SandboxProviderOptions } from '../../sandbox/provider.js';

export interface TestPki {
  ca: CertificateAuthority;
  /** localhost, 127.0.0.1 and ::1. */
  server: PemPair;
  client: PemPair;
  /** An unrelated CA, with a server and a client certificate of its own. */
  otherCa: CertificateAuthority;
  otherServer: PemPair;
  otherClient: PemPair;
  /** Issued by `ca`, ended a day ago. */
  expiredServer: PemPair;
  expiredClient: PemPair;
  /** Issued by `ca` for 'otherhost' only. */
  wrongHostServer: PemPair;
}

let pki: Promise<TestPki> | undefined;

/** A fresh test PKI: two CAs, and server and client certificates of each kind the tests need. */
export async function generateTestPki(): Promise<TestPki> {
  const ca = await createCa('test-ca');
  const otherCa = await createCa('other-ca');
  return {
    ca,
    server: await issueServerCert(ca, { hosts: ['localhost', '127.0.0.1', '::1'] }),
    client: await issueClientCert(ca, 'test-dispatcher'),
    otherCa,
    otherServer: await issueServerCert(otherCa, { hosts: ['localhost', '127.0.0.1'] }),
    otherClient: await issueClientCert(otherCa, 'intruder'),
    expiredServer: await issueServerCert(ca, { hosts: ['localhost', '127.0.0.1'], expired: true }),
    expiredClient: await issueClientCert(ca, 'expired-dispatcher', { expired: true }),
    wrongHostServer: await issueServerCert(ca, { hosts: ['otherhost'] }),
  };
}

/**
 * The test PKI: under `npm test` the run's own, generated once by test/run.ts and read from the file named by
 * AL_TEST_PKI (generating it was about 0.2 s of CPU in each file); a file run otherwise generates its own.
 */
export function testPki(): Promise<TestPki> {
  const file = process.env.AL_TEST_PKI;
  pki ??=
    file === undefined || file === ''
      ? generateTestPki()
      : Promise.resolve(JSON.parse(readFileSync(file, 'utf8')) as TestPki);
  return pki;
}

/** A started provider (server certificate `server` unless given), stopped at teardown. */
export async function startProvider(
  t: Test,
  options: Partial<SandboxProviderOptions> & { serverCert?: PemPair } = {},
): Promise<SandboxProvider> {
  const p = await testPki();
  const cert = options.serverCert ?? p.server;
  const provider = new SandboxProvider({ tls: { ...cert, ca: p.ca.cert }, ...options });
  t.teardown(() => provider.stop());
  await provider.start();
  return provider;
}

/** A started authorizer, stopped at teardown. */
export async function startAuthorizer(
  t: Test,
  options: Partial<SandboxAuthorizerOptions> = {},
): Promise<SandboxAuthorizer> {
  const p = await testPki();
  const authorizer = new SandboxAuthorizer({ tls: { ...p.server, ca: p.ca.cert }, ...options });
  t.teardown(() => authorizer.stop());
  await authorizer.start();
  return authorizer;
}

/** A dispatcher agent trusting `ca` and presenting `client` (override any of it), closed at teardown. */
export async function testAgent(t: Test, overrides: Partial<MtlsAgentOptions> = {}): Promise<Agent> {
  const p = await testPki();
  const agent = createMtlsAgent({ ca: p.ca.cert, ...p.client, connectTimeoutMs: 2_000, ...overrides });
  t.teardown(() => agent.destroy());
  return agent;
}
