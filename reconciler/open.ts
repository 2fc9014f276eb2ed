/**
 * Builds the reconciler, compensator and review actions from a runtime. Review actions need only the
 * database and the effect-key secrets (a compensation is minted through the ledger); the reconciler also
 * loads the dispatch identity (verified profile, mTLS, provider credentials) for its readbacks.
 */
import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { ActionLedgerError } from '../core/errors.js';
import type { Runtime } from '../runtime/index.js';
import { Compensator, type CompensationSummary } from '../compensator/index.js';
import { CrashPoints } from '../core/crash-points.js';
import { loadDispatchIdentity } from '../runtime/index.js';
import { runGateHousekeeping } from '../gate/index.js';
import { PrincipalStore } from '../principals/index.js';
import { EffectKeyer, Ledger } from '../ledger/index.js';
import { ReconcileMetrics } from './metrics.js';
import { Reconciler, type ReconcileSummary } from './reconciler.js';
import { Review } from './review.js';
import { ReviewPolicyRunner } from './review-policy.js';

export interface PassSummary {
  reconcile: ReconcileSummary;
  compensate: CompensationSummary;
  /** The gate's housekeeping, when the configuration has gate tools. */
  gate?: Awaited<ReturnType<typeof runGateHousekeeping>>;
}

export interface ReviewKit {
  ledger: Ledger;
  compensator: Compensator;
  review: Review;
  close(): void;
}

export function openReview(
  rt: Runtime,
  actor = `compensator:${hostname()}:${process.pid}`,
  onEvent?: (e: 'minted' | 'completed' | 'escalated') => void,
): ReviewKit {
  const ledger = new Ledger(rt.config, rt.pool, new EffectKeyer(rt.effectKeys));
  const compensator = new Compensator({
    config: rt.config,
    pool: rt.pool,
    ledger,
    log: rt.log,
    actor,
    ...(onEvent === undefined ? {} : { onEvent }),
  });
  return { ledger, compensator, review: new Review(rt.config, rt.pool, compensator), close: () => ledger.stop() };
}

export interface ReconcileKit extends ReviewKit {
  reconciler: Reconciler;
  metrics: ReconcileMetrics;
  /**
   * One reconciliation pass then one compensation pass; records the pass metrics. Once `signal` is aborted the
   * pass takes no new work. Throws `internal` after close().
   */
  pass(signal?: AbortSignal): Promise<PassSummary>;
  /** Closes the readback agent and the ledger's timers; safe to repeat. openReconciler() may be called again. */
  close(): void;
}

/**
 * Opens a reconciler on `rt`; may be called again on the same runtime after close() (the metrics registered
 * the first time are reused). Throws `tls_verification_disabled`, `profile_invalid`, `config_invalid`.
 */
export async function openReconciler(rt: Runtime, env: NodeJS.ProcessEnv): Promise<ReconcileKit> {
  const identity = await loadDispatchIdentity(rt, env);
  const metrics = new ReconcileMetrics(rt.metrics.registry);
  let closed = false;
  const id = `${hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`;
  const kit = openReview(rt, `compensator:${id}`, (e) => metrics.compensations.inc({ event: e }));
  const agent = identity.agent();
  const reconciler = new Reconciler({
    config: rt.config,
    pool: rt.pool,
    log: rt.log,
    metrics,
    profile: identity.profile,
    agent,
    credentials: identity.credentials,
    actor: `reconciler:${id}`,
    crash: new CrashPoints(env),
    reviewPolicies: new ReviewPolicyRunner({
      config: rt.config,
      pool: rt.pool,
      review: kit.review,
      log: rt.log,
      metrics,
    }),
  });
  return {
    ...kit,
    reconciler,
    metrics,
    async pass(signal?: AbortSignal) {
      if (closed) throw new ActionLedgerError('internal', 'this reconciler was closed; open another');
      const end = metrics.passSeconds.startTimer();
      let compensate: CompensationSummary = { minted: 0, completed: 0, escalated: 0 };
      // The compensator runs under the same pass lock, after the reconciliation of this pass.
      let housekeeping: Awaited<ReturnType<typeof runGateHousekeeping>> | undefined;
      let apiWindowsPruned = 0;
      const reconcile = await reconciler.pass(async () => {
        compensate = await kit.compensator.pass();
        // The gate's expiries (approvals, abandoned proposals, with their cap holds) ride on the same schedule.
        if (rt.config.gate.tools.size > 0) housekeeping = await runGateHousekeeping(rt.config, rt.pool);
        // The HTTP API's request windows that ended: the table stays as small as the live windows.
        apiWindowsPruned = await new PrincipalStore(rt.config, rt.pool).pruneRateWindows();
      }, signal);
      end();
      if (reconcile.ran && reconcile.provider_errors === 0 && reconcile.errors === 0)
        metrics.lastSuccess.setToCurrentTime();
      rt.log.info(
        { ...reconcile, compensations: compensate, gate: housekeeping, api_windows_pruned: apiWindowsPruned },
        'reconciliation pass',
      );
      return { reconcile, compensate, ...(housekeeping === undefined ? {} : { gate: housekeeping }) };
    },
    close() {
      if (closed) return;
      closed = true;
      kit.close();
      // A readback still in flight fails with the agent closed; nothing waits on the close itself.
      agent.close().catch(() => undefined);
    },
  };
}
