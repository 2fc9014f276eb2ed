/**
 * A complete local dispatch environment on loopback, for tests, the chaos run and the benchmarks: a CA made
 * for the run with server and client certificates, the sandbox provider and authorizer over mTLS, and a signed
 * dispatch profile, with every file a configuration names written into `dir`.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { generateProfileKeyPair, signProfile, type ProfileKeyKind } from '../core/profile.js';
import { SandboxAuthorizer } from './authorizer.js';
import { createCa, issueClientCert, issueServerCert } from './pki.js';
import { SandboxProvider } from './provider.js';

export interface DispatchKitOptions {
  /** Folder for the PEM files and the profile (it must exist). */
  dir: string;
  /** Bearer token the provider requires. */
  token?: string;
  honorIdempotencyKey?: boolean;
  extraPaths?: string[];
  /** Fields of the dispatch profile to replace (timeouts, windows, caps). */
  profile?: Record<string, unknown>;
  profileKey?: ProfileKeyKind;
}

export interface DispatchKit {
  provider: SandboxProvider;
  authorizer: SandboxAuthorizer;
  /** `dispatcher.profile` and `dispatcher.tls` for the configuration file. */
  dispatcherConfig: {
    profile: { path: string; signature_path: string; public_key_path: string };
    tls: { ca_file: string; cert_file: string; key_file: string };
  };
  stop(): Promise<void>;
}

export async function startDispatchKit(o: DispatchKitOptions): Promise<DispatchKit> {
  const ca = await createCa('dispatch-kit-ca');
  const server = await issueServerCert(ca, { hosts: ['localhost', '127.0.0.1'] });
  const client = await issueClientCert(ca, 'dispatcher');
  const tls = { cert: server.cert, key: server.key, ca: ca.cert };
  const provider = new SandboxProvider({
    tls,
    ...(o.token === undefined ? {} : { token: o.token }),
    ...(o.extraPaths === undefined ? {} : { extraPaths: o.extraPaths }),
    honorIdempotencyKey: o.honorIdempotencyKey ?? true,
  });
  const authorizer = new SandboxAuthorizer({ tls });
  await provider.start();
  await authorizer.start();
  const file = (name: string): string => join(o.dir, name);
  writeFileSync(file('ca.crt'), ca.cert);
  writeFileSync(file('client.crt'), client.cert);
  writeFileSync(file('client.key'), client.key, { mode: 0o600 });
  const keys = generateProfileKeyPair(o.profileKey ?? 'ecdsa-p256');
  const profile = Buffer.from(
    JSON.stringify({
      profile_id: 'dispatch-kit',
      authorization_url: authorizer.authorizeUrl,
      maximum_authorization_age_seconds: 30,
      maximum_authorization_ttl_seconds: 120,
      maximum_clock_skew_seconds: 2,
      authorization_http_timeout_seconds: 2,
      provider_http_timeout_seconds: 1,
      authorization_response_max_bytes: 4096,
      provider_response_max_bytes: 4096,
      ...o.profile,
    }),
  );
  writeFileSync(file('profile.json'), profile);
  writeFileSync(file('profile.sig'), signProfile({ profileBytes: profile, privateKeyPem: keys.privateKeyPem }));
  writeFileSync(file('profile.pub'), keys.publicKeyPem);
  return {
    provider,
    authorizer,
    dispatcherConfig: {
      profile: {
        path: file('profile.json'),
        signature_path: file('profile.sig'),
        public_key_path: file('profile.pub'),
      },
      tls: { ca_file: file('ca.crt'), cert_file: file('client.crt'), key_file: file('client.key') },
    },
    stop: async () => {
      await provider.stop();
      await authorizer.stop();
    },
  };
}
