/** The dispatcher's Prometheus metrics, registered on the process registry. */
import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import { recordExemplar } from '../core/metrics.js';

const PROVIDER_BUCKETS = [0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];
const ENQUEUE_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900];

const byRegistry = new WeakMap<Registry, DispatchMetrics>();

export class DispatchMetrics {
  /**
   * The registry's dispatch metrics, registered on first use: every dispatcher of a process (opened again
   * after a stop, or several at once) counts on the same ones, where a second registration would throw.
   */
  static on(registry: Registry): DispatchMetrics {
    let m = byRegistry.get(registry);
    if (m === undefined) {
      m = new DispatchMetrics(registry);
      byRegistry.set(registry, m);
    }
    return m;
  }

  readonly claims: Counter;
  readonly claimBatches: Counter;
  readonly outcomes: Counter<'tool' | 'provider' | 'outcome'>;
  readonly refusals: Counter<'stage' | 'code'>;
  readonly authorizations: Counter<'result'>;
  readonly authorizationSeconds: Histogram;
  readonly providerSeconds: Histogram<'provider'>;
  readonly inFlight: Gauge;
  readonly ungated: Counter;
  readonly batchOperations: Histogram<'stage'>;
  readonly enqueueToOutcome: Histogram<'provider' | 'outcome'>;

  /** Registers the metrics on `registry`; throws if they are registered there already (see {@link DispatchMetrics.on}). */
  constructor(registry: Registry) {
    const registers = [registry];
    this.claims = new Counter({
      name: 'actionledger_claims_total',
      help: 'Operations claimed by this worker.',
      registers,
    });
    this.claimBatches = new Counter({
      name: 'actionledger_claim_batches_total',
      help: 'Claim statements that returned at least one operation.',
      registers,
    });
    this.outcomes = new Counter({
      name: 'actionledger_dispatch_outcomes_total',
      help: "Dispatch outcomes by tool, provider and outcome (succeeded, unknown, needs_review, failed; released: a claim given back to pending after a database failure, never sent; lost: no longer this worker's claim).",
      labelNames: ['tool', 'provider', 'outcome'],
      registers,
    });
    this.refusals = new Counter({
      name: 'actionledger_predispatch_refusals_total',
      help: 'Operations sent to review before the provider was called, by stage and error code.',
      labelNames: ['stage', 'code'],
      registers,
    });
    this.authorizations = new Counter({
      name: 'actionledger_authorization_decisions_total',
      help: 'Fresh authorization decisions by result (allow, or the refusal code).',
      labelNames: ['result'],
      registers,
    });
    this.authorizationSeconds = new Histogram({
      name: 'actionledger_authorization_duration_seconds',
      help: 'Time to obtain and check a fresh authorization decision.',
      buckets: [0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
      registers,
    });
    this.providerSeconds = new Histogram({
      name: 'actionledger_provider_request_duration_seconds',
      help: 'Provider request time, from send to classified outcome.',
      labelNames: ['provider'],
      buckets: PROVIDER_BUCKETS,
      registers,
    });
    this.inFlight = new Gauge({
      name: 'actionledger_dispatch_in_flight',
      help: 'Operations this worker is dispatching now.',
      registers,
    });
    this.ungated = new Counter({
      name: 'actionledger_ungated_external_write_total',
      help: 'Provider calls refused because they came from outside the dispatcher gated scope.',
      registers,
    });
    this.batchOperations = new Histogram({
      name: 'actionledger_dispatch_batch_operations',
      help: 'Operations per dispatch batch (stage dispatch): one round trip records their authorization evidence and opens the transaction that holds their row locks across the provider calls.',
      labelNames: ['stage'],
      buckets: [1, 2, 4, 8, 16, 32, 64, 128],
      registers,
    });
    this.enqueueToOutcome = new Histogram({
      name: 'actionledger_dispatch_enqueue_to_outcome_seconds',
      help: "From an attempt's entry into the outbox to the outcome this worker wrote (the queue wait by the database's clock, then the dispatch by the worker's), by provider and outcome.",
      labelNames: ['provider', 'outcome'],
      buckets: ENQUEUE_BUCKETS,
      registers,
    });
    this.#registry = registry;
  }

  readonly #registry: Registry;

  /** Observes a dispatch's enqueue-to-outcome time; with a sampled trace id, that trace is its bucket's exemplar. */
  observeEnqueueToOutcome(labels: { provider: string; outcome: string }, seconds: number, traceId?: string): void {
    this.enqueueToOutcome.observe(labels, seconds);
    if (traceId !== undefined)
      recordExemplar(
        this.#registry,
        'actionledger_dispatch_enqueue_to_outcome_seconds',
        ENQUEUE_BUCKETS,
        labels,
        seconds,
        traceId,
      );
  }

  /** Records a provider request's time (observed by its timer) as its trace's exemplar. */
  providerExemplar(labels: { provider: string }, seconds: number, traceId: string | undefined): void {
    if (traceId !== undefined)
      recordExemplar(
        this.#registry,
        'actionledger_provider_request_duration_seconds',
        PROVIDER_BUCKETS,
        labels,
        seconds,
        traceId,
      );
  }
}
