/**
 * The one builder of a local dispatch environment on loopback, used by the tests, the chaos run and the
 * benchmarks: a CA made for the run with server and client certificates
 * ({@link createDispatchPki}), the sandbox provider and authorizer over mTLS, a signed dispatch profile and the
 * client certificate files a configuration names ({@link DispatchFiles}), and the route of a tool to the
 * sandbox provider ({@link sandboxRoute}). {@link startDispatchKit} puts them together; callers that run the
 * servers elsewhere (a worker thread, a test's own servers) use the parts.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { RawTool } from '../config/index.js';
import { generateProfileKeyPair, signProfile, type ProfileKeyKind } from '../protocol/index.js';
import { SandboxAuthorizer } from './authorizer.js';
import type { ServerTls } from '../transport/index.js';
import { createCa, issueClientCert, issueServerCert, type CertificateAuthority, type PemPair } from './pki.js';
import { SandboxProvider } from './provider.js';

/** A CA made for the run, a server certificate for localhost and 127.0.0.1, and the dispatcher's client one. */
export interface DispatchPki {
  ca: CertificateAuthority;
  /** The sandbox servers' TLS: the server certificate, its key, and the CA they require clients to chain to. */
  server: ServerTls;
  client: PemPair;
}

export async function createDispatchPki(caName = 'dispatch-kit-ca'): Promise<DispatchPki> {
  const ca = await createCa(caName);
  const server = await issueServerCert(ca, { hosts: ['localhost', '127.0.0.1'] });
  const client = await issueClientCert(ca, 'dispatcher');
  return { ca, server: { cert: server.cert, key: server.key, ca: ca.cert }, client };
}

/** The dispatch profile's fields but `profile_id` and `authorization_url`, as the sandbox environments sign it. */
export const SANDBOX_PROFILE_LIMITS = {
  maximum_authorization_age_seconds: 30,
  maximum_authorization_ttl_seconds: 120,
  maximum_clock_skew_seconds: 2,
  authorization_http_timeout_seconds: 2,
  provider_http_timeout_seconds: 1,
  authorization_response_max_bytes: 4096,
  provider_response_max_bytes: 4096,
} as const;

/** `dispatcher.profile` of a configuration file. */
export interface ProfileFiles {
  path: string;
  signature_path: string;
  public_key_path: string;
}

/** `dispatcher.tls` of a configuration file. */
export interface ClientTlsFiles {
  ca_file: string;
  cert_file: string;
  key_file: string;
}

/**
 * Writes into `dir` (it must exist) the files a configuration's `dispatcher.profile` and `dispatcher.tls` name:
 * the CA (`ca.crt`) and the profile's public key (`profile.pub`) once, then each profile signed with that one
 * key and each client certificate (key mode 0600) under its own name (`profile.json`, `profile-2.json`, ...;
 * `client.crt`, `client-2.crt`, ...), so several dispatchers of one environment can each have their own.
 */
export class DispatchFiles {
  readonly #dir: string;
  readonly #privateKeyPem: string;
  #profiles = 0;
  #clients = 0;

  constructor(dir: string, caCert: string, profileKey: ProfileKeyKind = 'ecdsa-p256') {
    this.#dir = dir;
    const keys = generateProfileKeyPair(profileKey);
    this.#privateKeyPem = keys.privateKeyPem;
    writeFileSync(join(dir, 'ca.crt'), caCert);
    writeFileSync(join(dir, 'profile.pub'), keys.publicKeyPem);
  }

  /** A signed profile: {@link SANDBOX_PROFILE_LIMITS} with `fields` over them. */
  profile(fields: { profile_id: string; authorization_url: string } & Record<string, unknown>): ProfileFiles {
    const n = ++this.#profiles;
    const base = n === 1 ? 'profile' : `profile-${n}`;
    const { profile_id, authorization_url, ...rest } = fields;
    const bytes = Buffer.from(JSON.stringify({ profile_id, authorization_url, ...SANDBOX_PROFILE_LIMITS, ...rest }));
    const path = join(this.#dir, `${base}.json`);
    const signature = join(this.#dir, `${base}.sig`);
    writeFileSync(path, bytes);
    writeFileSync(signature, signProfile({ profileBytes: bytes, privateKeyPem: this.#privateKeyPem }));
    return { path, signature_path: signature, public_key_path: join(this.#dir, 'profile.pub') };
  }

  /** The dispatcher's client certificate and key, beside the CA. */
  client(pair: PemPair): ClientTlsFiles {
    const n = ++this.#clients;
    const base = n === 1 ? 'client' : `client-${n}`;
    writeFileSync(join(this.#dir, `${base}.crt`), pair.cert);
    writeFileSync(join(this.#dir, `${base}.key`), pair.key, { mode: 0o600 });
    return {
      ca_file: join(this.#dir, 'ca.crt'),
      cert_file: join(this.#dir, `${base}.crt`),
      key_file: join(this.#dir, `${base}.key`),
    };
  }
}

/** One tool's route as written in the configuration file, without readback or compensation. */
export type SandboxRoute = Omit<RawTool, 'readback' | 'effects_listing_url' | 'compensation'>;

/** A route to a sandbox provider for `tenant-a`, keyed by the `Idempotency-Key` header, 400 and 422 definitive. */
export function sandboxRoute(
  route: { provider_id: string; endpoint: string; credential_env?: string } & Partial<SandboxRoute>,
): SandboxRoute {
  return {
    allowed_tenants: ['tenant-a'],
    idempotency: { mechanism: 'header', name: 'Idempotency-Key' },
    definitive_failure_statuses: [400, 422],
    ...route,
  };
}

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
  dispatcherConfig: { profile: ProfileFiles; tls: ClientTlsFiles };
  stop(): Promise<void>;
}

/** A fresh PKI, the sandbox provider and authorizer started in this process, and the files naming them. */
export async function startDispatchKit(o: DispatchKitOptions): Promise<DispatchKit> {
  const pki = await createDispatchPki();
  const provider = new SandboxProvider({
    tls: pki.server,
    ...(o.token === undefined ? {} : { token: o.token }),
    ...(o.extraPaths === undefined ? {} : { extraPaths: o.extraPaths }),
    honorIdempotencyKey: o.honorIdempotencyKey ?? true,
  });
  const authorizer = new SandboxAuthorizer({ tls: pki.server });
  await provider.start();
  await authorizer.start();
  const files = new DispatchFiles(o.dir, pki.ca.cert, o.profileKey);
  return {
    provider,
    authorizer,
    dispatcherConfig: {
      profile: files.profile({ profile_id: 'dispatch-kit', authorization_url: authorizer.authorizeUrl, ...o.profile }),
      tls: files.client(pki.client),
    },
    stop: async () => {
      await provider.stop();
      await authorizer.stop();
    },
  };
}
