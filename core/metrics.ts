/**
 * Prometheus metrics, named by the conventions (`actionledger_` prefix, base units, `_total` counters).
 * One registry per process; the fleet's parent aggregates its workers' registries.
 */
import {
  AggregatorRegistry,
  Counter,
  Gauge,
  Histogram,
  Registry,
  collectDefaultMetrics,
  type MetricObjectWithValues,
  type MetricValue,
} from 'prom-client';

export type CollectFn = () => Promise<void>;

/** The OpenMetrics exposition's content type (what `/metrics` answers a scraper that asks for it). */
export const OPENMETRICS_CONTENT_TYPE: string = Registry.OPENMETRICS_CONTENT_TYPE;

/** What the ledger-wide gauges are set from at scrape time (the ledger's status). */
export interface LedgerReading {
  by_status: Readonly<Record<string, number>>;
  outbox_depth: number;
  oldest_pending_age_s: number | null;
  /** The gate's state (gate/status.ts), when this process reads it. */
  gate?: {
    approvals_pending: number;
    approvals_overdue: number;
    proposals_open: number;
    cap_holds_open: number;
    kill_switches_engaged: number;
    oldest_kill_switch_age_s: number | null;
  };
  /** The reconciliation passes and worker heartbeats (reconciler/health.ts), when this process reads them. */
  fleet?: FleetReading;
}

/** The fleet's health as recorded in the database: see reconciler/health.ts. */
export interface FleetReading {
  /**
   * Unix time the schedule's queue last completed a pass (before the first, when the schedule was created);
   * null when no fleet has started the schedule in this database.
   */
  schedule: { queue: string; last_completed_at_s: number } | null;
  /** Workers that have not said they stopped and heartbeated within the last hour. */
  workers: readonly { worker: string; heartbeat_age_s: number }[];
}

/**
 * The process registry: its JSON (what a fleet worker answers its parent, what {@link Metrics.asJson} reads) carries
 * the histograms' exemplars recorded beside it (recordExemplar); its text exposition is prom-client's own.
 */
class ExemplarRegistry extends Registry {
  override async getMetricsAsJSON(): Promise<MetricObjectWithValues<MetricValue<string>>[]> {
    return withExemplars(this, await super.getMetricsAsJSON());
  }
}

export class Metrics {
  readonly registry: Registry = new ExemplarRegistry();
  /**
   * The gauges read from the database at scrape time, exposed only while that read answers: during an outage
   * they are absent, never a stale or zero reading (an empty outbox would look healthy and resolve the alerts
   * on it), and `actionledger_database_up` says 0.
   */
  readonly ledgerGauges = new Registry();
  readonly databaseUp: Gauge;
  #ledgerRead = false;
  readonly reservations: Counter<'tool' | 'outcome'>;
  readonly operations: Gauge<'status'>;
  readonly outboxDepth: Gauge;
  readonly oldestPendingAge: Gauge;
  readonly auditLost: Counter<'action'>;
  readonly apiRequests: Counter<'route' | 'method' | 'status'>;
  readonly gateCalls: Counter<'tool' | 'outcome'>;
  readonly gateGauges: Readonly<Record<keyof NonNullable<LedgerReading['gate']>, Gauge>>;
  readonly apiSeconds: Histogram<'route' | 'method'>;
  readonly fleetGauges: { scheduleCompleted: Gauge<'queue'>; heartbeatAge: Gauge<'worker'> };

  /**
   * `ledger: false` (dispatcher workers) registers no ledger-wide metrics (`actionledger_database_up` and the
   * gauges read at scrape time): in the fleet only the parent exposes those. The per-process counters
   * (reservations, gate calls, API requests, lost audit rows) are registered in every process, since every fleet
   * worker serves the API; the parent merges them by series (bin/fleet-metrics.ts), never one name twice.
   */
  constructor(options: { defaultMetrics?: boolean; ledger?: boolean; cluster?: string | null } = {}) {
    // The deployment's cluster on every series (tenants partitioned across PostgreSQL clusters, one fleet each).
    if (options.cluster !== undefined && options.cluster !== null) {
      this.registry.setDefaultLabels({ cluster: options.cluster });
      this.ledgerGauges.setDefaultLabels({ cluster: options.cluster });
    }
    if (options.defaultMetrics !== false)
      // prom-client's names begin with process_ or nodejs_ already: actionledger_process_cpu_seconds_total.
      collectDefaultMetrics({ register: this.registry, prefix: 'actionledger_' });
    const registers = [this.registry];
    const ledgerWide = options.ledger === false ? [] : [this.registry];
    this.reservations = new Counter({
      name: 'actionledger_reservations_total',
      help: 'Reservations by tool and outcome (created, replayed, or the refusal code).',
      labelNames: ['tool', 'outcome'],
      registers,
    });
    const gauges = options.ledger === false ? [] : [this.ledgerGauges];
    this.databaseUp = new Gauge({
      name: 'actionledger_database_up',
      help: "1 when this scrape's ledger read answered, 0 when PostgreSQL could not be read (the ledger gauges are then absent).",
      registers: ledgerWide,
    });
    this.operations = new Gauge({
      name: 'actionledger_operations',
      help: 'Operations in the ledger by state, read at scrape time.',
      labelNames: ['status'],
      registers: gauges,
    });
    this.outboxDepth = new Gauge({
      name: 'actionledger_outbox_depth',
      help: 'Dispatch attempts waiting in the outbox, read at scrape time.',
      registers: gauges,
    });
    this.oldestPendingAge = new Gauge({
      name: 'actionledger_outbox_oldest_age_seconds',
      help: 'Age of the oldest waiting dispatch attempt, read at scrape time (0 when none waits).',
      registers: gauges,
    });
    this.auditLost = new Counter({
      name: 'actionledger_audit_lost_total',
      help: 'Gate decisions (all refusals: an allow is never answered unaudited) whose audit row could not be written, even as a fallback row; each is in the log instead.',
      labelNames: ['action'],
      registers,
    });
    this.gateCalls = new Counter({
      name: 'actionledger_gate_calls_total',
      help: "Tool calls through this process's gate (the HTTP API's), by tool and outcome: allowed, or the refusal code (rate_limited, approval_required, ...).",
      labelNames: ['tool', 'outcome'],
      registers,
    });
    this.gateGauges = gateGauges(gauges);
    this.fleetGauges = fleetGauges(gauges);
    this.apiRequests = new Counter({
      name: 'actionledger_api_requests_total',
      help: 'HTTP API requests answered, by route pattern (never the raw path), method and status.',
      labelNames: ['route', 'method', 'status'],
      registers,
    });
    this.apiSeconds = new Histogram({
      name: 'actionledger_api_request_seconds',
      help: 'HTTP API request time, from the request to the answer sent, by route pattern and method.',
      labelNames: ['route', 'method'],
      buckets: [0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
      registers,
    });
  }

  /**
   * Sets the ledger gauges from `read()`; when it throws, marks the database down (the gauges drop out of
   * {@link exposition}) and rethrows.
   */
  async readLedger(read: () => Promise<LedgerReading>): Promise<void> {
    let s: LedgerReading;
    try {
      s = await read();
    } catch (err) {
      this.#ledgerRead = false;
      this.databaseUp.set(0);
      throw err;
    }
    this.operations.reset();
    for (const [status, n] of Object.entries(s.by_status)) this.operations.set({ status }, n);
    this.outboxDepth.set(s.outbox_depth);
    this.oldestPendingAge.set(s.oldest_pending_age_s ?? 0);
    if (s.gate !== undefined)
      for (const [name, gauge] of Object.entries(this.gateGauges))
        gauge.set(s.gate[name as keyof typeof this.gateGauges] ?? 0);
    if (s.fleet !== undefined) {
      this.fleetGauges.scheduleCompleted.reset();
      if (s.fleet.schedule !== null)
        this.fleetGauges.scheduleCompleted.set({ queue: s.fleet.schedule.queue }, s.fleet.schedule.last_completed_at_s);
      this.fleetGauges.heartbeatAge.reset();
      for (const w of s.fleet.workers) this.fleetGauges.heartbeatAge.set({ worker: w.worker }, w.heartbeat_age_s);
    }
    this.databaseUp.set(1);
    this.#ledgerRead = true;
  }

  /** This process's metrics in the text format: the registry, and the ledger gauges when the last read answered. */
  async exposition(): Promise<string> {
    const own = await this.registry.metrics();
    return this.#ledgerRead ? `${own}\n${await this.ledgerGauges.metrics()}` : own;
  }

  /**
   * What {@link exposition} shows, as prom-client's JSON (for merging with other processes' metrics), with the
   * histograms' exemplars (recordExemplar) on their buckets.
   */
  async asJson(): Promise<MetricObjectWithValues<MetricValue<string>>[]> {
    const own = await this.registry.getMetricsAsJSON();
    return this.#ledgerRead ? [...own, ...(await this.ledgerGauges.getMetricsAsJSON())] : own;
  }

  /** The OpenMetrics exposition of {@link exposition}'s metrics, with exemplars. */
  async openMetrics(): Promise<string> {
    return openMetricsText([await this.asJson()], { oneProcess: true });
  }
}

/** The gate's gauges, read at scrape time beside the ledger's (and absent with them while the database is down). */
function gateGauges(registers: Registry[]): Metrics['gateGauges'] {
  const gauge = (name: string, help: string) => new Gauge({ name: `actionledger_gate_${name}`, help, registers });
  return {
    approvals_pending: gauge('approvals_pending', 'Approvals waiting for a person.'),
    approvals_overdue: gauge(
      'approvals_overdue',
      'Pending approvals past their TTL that housekeeping has not yet expired (the schedule is behind).',
    ),
    proposals_open: gauge('proposals_open', 'Proposals proposed or confirmed, not yet executed, cancelled or expired.'),
    cap_holds_open: gauge('cap_holds_open', 'Value and count cap holds not yet released.'),
    kill_switches_engaged: gauge('kill_switches_engaged', 'Kill switches engaged.'),
    oldest_kill_switch_age_s: gauge(
      'oldest_kill_switch_age_seconds',
      'Age of the oldest engaged kill switch (0 when none is engaged).',
    ),
  };
}

/** The reconciliation passes' and workers' gauges, read from the database at scrape time beside the ledger's. */
function fleetGauges(registers: Registry[]): Metrics['fleetGauges'] {
  return {
    scheduleCompleted: new Gauge({
      name: 'actionledger_reconcile_schedule_last_completed_timestamp_seconds',
      help: "Unix time the reconciliation schedule's queue last completed a pass, by any fleet (before the first: when the schedule was created); absent where no fleet runs the schedule.",
      labelNames: ['queue'],
      registers,
    }),
    heartbeatAge: new Gauge({
      name: 'actionledger_worker_heartbeat_age_seconds',
      help: 'Seconds since each dispatcher worker last heartbeated, for workers not stopped that heartbeated within the last hour.',
      labelNames: ['worker'],
      registers,
    }),
  };
}

/**
 * Histogram exemplars: the trace id of a sampled operation beside the bucket its observation fell in, shown only in
 * the OpenMetrics exposition (`Accept: application/openmetrics-text`); the default text format is unchanged.
 * prom-client's own exemplars need an OpenMetrics registry (which changes the text format), so this records them
 * beside the registry instead: one, the latest, per series and bucket, and only while tracing is on.
 */
interface StoredExemplar {
  metricName: string;
  labels: Record<string, string>;
  exemplar: { labelSet: Record<string, string>; value: number; timestamp: number };
}

const exemplarStores = new WeakMap<Registry, Map<string, StoredExemplar>>();

/** Records `traceId` as the exemplar of the bucket `value` falls in, for histogram `name` of `registry`. */
export function recordExemplar(
  registry: Registry,
  name: string,
  buckets: readonly number[],
  labels: Record<string, string>,
  value: number,
  traceId: string,
): void {
  let store = exemplarStores.get(registry);
  if (store === undefined) {
    store = new Map();
    exemplarStores.set(registry, store);
  }
  const bound = buckets.find((b) => value <= b);
  const le = bound === undefined ? '+Inf' : String(bound);
  const key = `${name}\u0000${JSON.stringify(labels)}\u0000${le}`;
  store.set(key, {
    metricName: `${name}_bucket`,
    labels: { ...labels, le },
    exemplar: { labelSet: { trace_id: traceId }, value, timestamp: Date.now() / 1000 },
  });
}

type JsonValue = MetricValue<string> & { metricName?: string; exemplar?: StoredExemplar['exemplar'] };

const sameLabels = (want: Record<string, string>, have: Record<string, unknown>): boolean =>
  Object.entries(want).every(([k, v]) => String(have[k]) === v);

/** Puts the registry's recorded exemplars on its JSON (what a fleet worker sends its parent). */
function withExemplars(
  registry: Registry,
  json: MetricObjectWithValues<MetricValue<string>>[],
): MetricObjectWithValues<MetricValue<string>>[] {
  const store = exemplarStores.get(registry);
  if (store === undefined || store.size === 0) return json;
  for (const ex of store.values())
    for (const metric of json)
      for (const v of metric.values as JsonValue[])
        if (v.metricName === ex.metricName && sameLabels(ex.labels, v.labels)) v.exemplar = ex.exemplar;
  return json;
}

/**
 * The OpenMetrics exposition of processes' metrics (`inputs`, each one process's JSON): merged as the text one is
 * (prom-client's aggregation), with each series' exemplar, which that aggregation drops, put back.
 */
export async function openMetricsText(
  inputs: MetricObjectWithValues<MetricValue<string>>[][],
  options: { oneProcess?: boolean } = {},
): Promise<string> {
  // prom-client takes the registry's content type as a second argument its types leave out.
  const aggregate = AggregatorRegistry as unknown as { aggregate(m: typeof inputs, type: string): Registry };
  // prom-client 15 renders an aggregated counter from its own name and appends `_total` in OpenMetrics, so a
  // counter named `…_total` would be exposed as `…_total_total` (and no counter alert would match): the merge is
  // given the counters' names without the suffix, which it then puts back once. A single process's metrics keep
  // the series its text exposition shows, those the fleet's merge omits included (the process start time).
  const renamed = inputs.map((metrics) =>
    metrics.map((metric) => ({
      ...metric,
      name: String(metric.type) === 'counter' ? metric.name.replace(/_total$/, '') : metric.name,
      aggregator: options.oneProcess === true && metric.aggregator === 'omit' ? 'first' : metric.aggregator,
    })),
  );
  const merged = aggregate.aggregate(renamed, Registry.OPENMETRICS_CONTENT_TYPE);
  const found = new Map<string, JsonValue['exemplar']>();
  const key = (v: JsonValue): string => `${v.metricName ?? ''}\u0000${JSON.stringify(v.labels)}`;
  for (const metrics of inputs)
    for (const metric of metrics)
      for (const v of metric.values as JsonValue[]) {
        if (v.exemplar === undefined || v.exemplar === null) continue;
        const had = found.get(key(v));
        if (had === undefined || had.timestamp < v.exemplar.timestamp) found.set(key(v), v.exemplar);
      }
  if (found.size > 0)
    for (const metric of merged.getMetricsAsArray()) {
      const got = (await (metric as unknown as { get(): unknown }).get()) as { values: JsonValue[] };
      for (const v of got.values) {
        const ex = found.get(key(v));
        if (ex !== undefined) v.exemplar = ex;
      }
    }
  return merged.metrics();
}
