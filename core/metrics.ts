/**
 * Prometheus metrics, named by the conventions (`actionledger_` prefix, base units, `_total` counters).
 * One registry per process; the fleet's parent aggregates its workers' registries.
 */
import { Counter, Gauge, Registry, collectDefaultMetrics } from 'prom-client';

export type CollectFn = () => Promise<void>;

export class Metrics {
  readonly registry = new Registry();
  readonly reservations: Counter<'tool' | 'outcome'>;
  readonly operations: Gauge<'status'>;
  readonly outboxDepth: Gauge;
  readonly oldestPendingAge: Gauge;
  readonly auditLost: Counter<'action'>;

  /**
   * `ledger: false` (dispatcher workers) registers no ledger-wide metrics: in the fleet only the parent
   * exposes those, so the aggregated exposition never holds one name twice.
   */
  constructor(options: { defaultMetrics?: boolean; ledger?: boolean } = {}) {
    if (options.defaultMetrics !== false)
      // prom-client's names begin with process_ or nodejs_ already: actionledger_process_cpu_seconds_total.
      collectDefaultMetrics({ register: this.registry, prefix: 'actionledger_' });
    const registers = options.ledger === false ? [] : [this.registry];
    this.reservations = new Counter({
      name: 'actionledger_reservations_total',
      help: 'Reservations by tool and outcome (created, replayed, or the refusal code).',
      labelNames: ['tool', 'outcome'],
      registers,
    });
    this.operations = new Gauge({
      name: 'actionledger_operations',
      help: 'Operations in the ledger by state, read at scrape time.',
      labelNames: ['status'],
      registers,
    });
    this.outboxDepth = new Gauge({
      name: 'actionledger_outbox_depth',
      help: 'Dispatch attempts waiting in the outbox, read at scrape time.',
      registers,
    });
    this.oldestPendingAge = new Gauge({
      name: 'actionledger_outbox_oldest_age_seconds',
      help: 'Age of the oldest waiting dispatch attempt, read at scrape time (0 when none waits).',
      registers,
    });
    this.auditLost = new Counter({
      name: 'actionledger_audit_lost_total',
      help: 'Gate decisions (all refusals: an allow is never answered unaudited) whose audit row could not be written, even as a fallback row; each is in the log instead.',
      labelNames: ['action'],
      registers,
    });
  }
}
