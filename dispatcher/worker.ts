/**
 * Builds a Dispatcher from a runtime: verifies the signed profile, loads the mTLS identity, resolves provider
 * credentials from the environment, and refuses to start when TLS verification is disabled.
 */
import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import type { Runtime } from '../runtime/index.js';
import { CrashPoints } from '../core/crash-points.js';
import { Dispatcher } from './dispatcher.js';
import { DispatchMetrics } from './metrics.js';
import { loadDispatchIdentity } from '../runtime/index.js';

export interface OpenDispatcherOptions {
  concurrency?: number;
  workerId?: string;
}

/**
 * Opens a dispatcher that `start()` runs. May be called again on the same runtime (after the previous one
 * stopped, or alongside it): they share the runtime's dispatch metrics. Throws `tls_verification_disabled`,
 * `profile_invalid`, `config_invalid`.
 */
export async function openDispatcher(
  rt: Runtime,
  env: NodeJS.ProcessEnv,
  options: OpenDispatcherOptions = {},
): Promise<Dispatcher> {
  const { profile, credentials, agent } = await loadDispatchIdentity(rt, env);
  const d = rt.config.dispatcher;
  return new Dispatcher({
    config: rt.config,
    pool: rt.pool,
    log: rt.log,
    // One set per registry: a dispatcher opened again on the same runtime counts on the same metrics.
    metrics: DispatchMetrics.on(rt.metrics.registry),
    profile,
    agent,
    credentials,
    crash: new CrashPoints(env),
    workerId: options.workerId ?? `${hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`,
    concurrency: options.concurrency ?? d.concurrency,
    batchSize: d.batchSize,
    pollIntervalMs: d.pollIntervalMs,
    heartbeatIntervalMs: d.heartbeatIntervalMs,
  });
}
