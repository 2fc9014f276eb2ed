/**
 * What every process that talks to providers or the authorizer loads at start, the same way: the verified
 * dispatch profile, the mTLS identity (CA, client certificate and key) and the provider credentials from the
 * environment. Refuses to start when TLS verification is disabled or the profile does not verify.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Agent } from 'undici';
import { ActionLedgerError } from '../core/errors.js';
import type { Runtime } from './runtime.js';
import { Secret } from '../core/secret.js';
import { assertTlsVerificationEnabled, createMtlsAgent } from '../transport/index.js';
import { loadVerifiedProfile, type DispatchProfile } from '../protocol/index.js';

export interface DispatchIdentity {
  profile: DispatchProfile;
  /** Provider credentials by tool name; a tool whose variable is unset is absent. */
  credentials: ReadonlyMap<string, Secret>;
  /** A new dedicated mTLS agent (one per purpose: authorizer, provider, readback). */
  agent: () => Agent;
}

/** Throws `tls_verification_disabled`, `profile_invalid`, `config_invalid`. */
export async function loadDispatchIdentity(rt: Runtime, env: NodeJS.ProcessEnv): Promise<DispatchIdentity> {
  assertTlsVerificationEnabled(env);
  const d = rt.config.dispatcher;
  if (d.profile === null || d.tls === null) {
    throw new ActionLedgerError(
      'config_invalid',
      'dispatcher.profile and dispatcher.tls are required unless the sandbox is enabled',
    );
  }
  const profile = await loadVerifiedProfile({
    profilePath: d.profile.path,
    signaturePath: d.profile.signaturePath,
    publicKeyPath: d.profile.publicKeyPath,
  });
  let ca: string, cert: string, key: Secret;
  try {
    ca = readFileSync(d.tls.caFile, 'utf8');
    cert = readFileSync(d.tls.certFile, 'utf8');
    key = new Secret(readFileSync(d.tls.keyFile));
  } catch (cause) {
    throw new ActionLedgerError('config_invalid', `cannot read the dispatcher TLS files: ${(cause as Error).message}`, {
      cause,
    });
  }
  const connectTimeoutMs = Math.min(profile.authorizationHttpTimeoutMs, profile.providerHttpTimeoutMs);
  const credentials = new Map<string, Secret>();
  // The development sandbox generates its provider token once into the data folder (sandbox/dev.ts); CLI
  // processes (reconcile, verify) read it there, as the fleet's workers get it from their parent.
  const sandboxToken = rt.config.sandbox.enabled
    ? readOptional(join(rt.config.dataDir, 'sandbox', 'provider-token'))
    : undefined;
  for (const route of rt.config.tools.values()) {
    const value = route.credentialEnv === null ? undefined : env[route.credentialEnv] || sandboxToken;
    if (value !== undefined && value !== '') credentials.set(route.tool, new Secret(Buffer.from(value, 'utf8')));
    else if (route.credentialEnv !== null)
      rt.log.warn(
        { tool: route.tool, env: route.credentialEnv },
        'provider credential not set; its operations will go to review',
      );
  }
  rt.log.info(
    { profile_id: profile.profileId, profile_sha256: profile.sha256, algorithm: profile.signatureAlgorithm },
    'dispatch profile verified',
  );
  return { profile, credentials, agent: () => createMtlsAgent({ ca, cert, key, connectTimeoutMs }) };
}

function readOptional(path: string): string | undefined {
  try {
    return readFileSync(path, 'utf8').trim() || undefined;
  } catch {
    return undefined;
  }
}
