/**
 * Builds a Dispatcher from a runtime: verifies the signed profile, loads the mTLS identity, resolves provider
 * credentials from the environment, and refuses to start when TLS verification is disabled.
 */
import { readFileSync } from 'node:fs';
import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { ActionLedgerError } from '../core/errors.js';
import type { Runtime } from '../core/runtime.js';
import { Secret } from '../core/secret.js';
import { CrashPoints } from './crash-points.js';
import { Dispatcher } from './dispatcher.js';
import { assertTlsVerificationEnabled, createMtlsAgent } from './http-client.js';
import { DispatchMetrics } from './metrics.js';
import { loadVerifiedProfile } from './profile.js';

export interface OpenDispatcherOptions {
  concurrency?: number;
  workerId?: string;
}

/** Throws `tls_verification_disabled`, `profile_invalid`, `config_invalid`. */
export async function openDispatcher(rt: Runtime, env: NodeJS.ProcessEnv, options: OpenDispatcherOptions = {}): Promise<Dispatcher> {
  assertTlsVerificationEnabled(env);
  const d = rt.config.dispatcher;
  if (d.profile === null || d.tls === null) {
    throw new ActionLedgerError('config_invalid', 'dispatcher.profile and dispatcher.tls are required unless the sandbox is enabled');
  }
  const profile = await loadVerifiedProfile({ profilePath: d.profile.path, signaturePath: d.profile.signaturePath, publicKeyPath: d.profile.publicKeyPath });
  let ca: string, cert: string, key: Secret;
  try {
    ca = readFileSync(d.tls.caFile, 'utf8');
    cert = readFileSync(d.tls.certFile, 'utf8');
    key = new Secret(readFileSync(d.tls.keyFile));
  } catch (cause) {
    throw new ActionLedgerError('config_invalid', `cannot read the dispatcher TLS files: ${(cause as Error).message}`, { cause });
  }
  const connectTimeoutMs = Math.min(profile.authorizationHttpTimeoutMs, profile.providerHttpTimeoutMs);
  const credentials = new Map<string, Secret>();
  for (const route of rt.config.tools.values()) {
    const value = route.credentialEnv === null ? undefined : env[route.credentialEnv];
    if (value !== undefined && value !== '') credentials.set(route.tool, new Secret(Buffer.from(value, 'utf8')));
    else if (route.credentialEnv !== null) rt.log.warn({ tool: route.tool, env: route.credentialEnv }, 'provider credential not set; its operations will go to review');
  }
  rt.log.info({ profile_id: profile.profileId, profile_sha256: profile.sha256, algorithm: profile.signatureAlgorithm }, 'dispatch profile verified');
  return new Dispatcher({
    config: rt.config,
    pool: rt.pool,
    log: rt.log,
    metrics: new DispatchMetrics(rt.metrics.registry),
    profile,
    authorizerAgent: createMtlsAgent({ ca, cert, key, connectTimeoutMs }),
    providerAgent: createMtlsAgent({ ca, cert, key, connectTimeoutMs }),
    credentials,
    crash: new CrashPoints(env),
    workerId: options.workerId ?? `${hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`,
    concurrency: options.concurrency ?? d.concurrency,
    batchSize: d.batchSize,
    pollIntervalMs: d.pollIntervalMs,
    heartbeatIntervalMs: d.heartbeatIntervalMs,
  });
}
