/**
 * What the parts of one dispatcher worker (producer, pipeline, batch, completer) share: its options, its bound
 * statements, the halt signal of the current run and the mTLS agents of the current run.
 */
import type { Agent } from 'undici';
import type { Config } from '../config/index.js';
import type { Pool } from '../db/index.js';
import type { Logger, RepeatedFailureLog } from '../core/log.js';
import type { Secret } from '../core/secret.js';
import type { CrashPoints } from '../core/crash-points.js';
import type { DispatchMetrics } from './metrics.js';
import type { DispatchProfile } from '../protocol/index.js';
import type { dispatcherQueries } from './queries.js';

export interface DispatcherOptions {
  config: Config;
  pool: Pool;
  log: Logger;
  metrics: DispatchMetrics;
  profile: DispatchProfile;
  /** Makes a new mTLS agent; each start takes one for the authorizer and one for providers, and stop closes them. */
  agent: () => Agent;
  /** Provider credentials by tool name, resolved from the environment at start. */
  credentials: ReadonlyMap<string, Secret>;
  crash: CrashPoints;
  workerId: string;
  concurrency: number;
  batchSize: number;
  pollIntervalMs: number;
  heartbeatIntervalMs: number;
}

/** The per-batch statements, prepared once per connection. */
export type PreparedStatements = Record<
  'evidenceRecordBatch' | 'operationLockForDispatchBatch' | 'operationFinalCheckBatch' | 'operationCompleteBatch',
  { name: string; text: string }
>;

export interface DispatchContext {
  readonly o: DispatcherOptions;
  readonly q: Readonly<typeof dispatcherQueries>;
  readonly prepared: PreparedStatements;
  /** Aborted (with a `WorkerHalted` reason) when a stop's deadline has passed: owed writes give up. */
  halt(): AbortSignal;
  /** Batch openings each batcher may use now (`batchOpenings` of the slots taken; dispatcher/batcher.ts). */
  readonly openings: () => number;
  /** Asks the producer to claim (as a NOTIFY would): for work this worker made claimable later, as a release. */
  wake(): void;
  /** The agents of the current run; throws `WorkerHalted` when the worker has none (stopped). */
  agent(kind: 'authorizer' | 'provider'): Agent;
  readonly writeFailures: RepeatedFailureLog;
}
