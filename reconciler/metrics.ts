/**
 * The reconciler's and compensator's Prometheus metrics. prom-client refuses a second metric of the same name
 * in one registry, so a reconciler reopened on the same runtime (stop, then open again) reuses the metrics it
 * registered the first time: counters keep counting across reopenings, as a scrape expects.
 */
import { Counter, Gauge, Histogram, type Registry } from 'prom-client';

const opened = new WeakMap<Registry, ReconcileMetrics>();

export class ReconcileMetrics {
  readonly checks!: Counter<'provider' | 'outcome'>;
  readonly transitions!: Counter<'from' | 'to'>;
  readonly passSeconds!: Histogram;
  readonly lastSuccess!: Gauge;
  readonly compensations!: Counter<'event'>;
  readonly policyRetries!: Counter<'policy' | 'reason'>;

  /** Registers the metrics in `registry`, or returns the ones this class already registered there. */
  constructor(registry: Registry) {
    const existing = opened.get(registry);
    if (existing !== undefined) return existing;
    const registers = [registry];
    this.checks = new Counter({
      name: 'actionledger_reconcile_checks_total',
      help: 'Provider readbacks by provider and outcome (applied, no_effect, mismatch, inconclusive, failing, unreachable, no_contract).',
      labelNames: ['provider', 'outcome'],
      registers,
    });
    this.transitions = new Counter({
      name: 'actionledger_reconcile_transitions_total',
      help: 'State changes made by the reconciler, by from and to state.',
      labelNames: ['from', 'to'],
      registers,
    });
    this.passSeconds = new Histogram({
      name: 'actionledger_reconcile_pass_duration_seconds',
      help: 'Duration of one reconciliation pass (reconcile and compensate).',
      buckets: [0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300],
      registers,
    });
    this.lastSuccess = new Gauge({
      name: 'actionledger_reconcile_last_success_timestamp_seconds',
      help: 'Unix time of the last reconciliation pass that reached the database and every provider.',
      registers,
    });
    this.compensations = new Counter({
      name: 'actionledger_compensations_total',
      help: 'Compensation events: minted, completed, escalated (to review).',
      labelNames: ['event'],
      registers,
    });
    this.policyRetries = new Counter({
      name: 'actionledger_review_policy_retries_total',
      help: 'Reviewed retries made by a review policy, by policy name and the policy reason that covered the operation.',
      labelNames: ['policy', 'reason'],
      registers,
    });
    opened.set(registry, this);
  }
}
