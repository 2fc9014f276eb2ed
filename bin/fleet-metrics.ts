/**
 * The fleet workers' metrics, gathered with the parent's own for `/metrics` (served by every worker, which asks
 * the parent for it: bin/fleet-ipc.ts): every worker is asked, and a scrape
 * answers within a short wait with the workers that answered, never with an error.
 *
 * prom-client's `AggregatorRegistry#clusterMetrics()` waits for every connected worker and, after 5 s without
 * all of them, rejects the whole scrape. A worker answers only once its code has loaded and installed the
 * answering listener (bin/dispatcher-worker.ts, after its runtime and dispatcher opened), so a worker that is
 * still starting, or one that exits with a request pending, left the scrape waiting 5 s and then failing: a
 * `500 internal error` on the first scrape after every rollout, while `/readyz` already said 200. Missing one
 * worker's counters for one scrape is harmless (they are cumulative, the next scrape has them); a failed
 * scrape loses everything the parent knows and trips the target's `up` alert.
 *
 * This speaks prom-client's own messages (the workers' side is unchanged) with its own request ids, and
 * merges the answers with prom-client's aggregation. No `AggregatorRegistry` is constructed in the parent:
 * its constructor installs a listener that would take these answers for requests of its own.
 */
import cluster, { type Worker } from 'node:cluster';
import { openMetricsText } from '../core/metrics.js';
import { AggregatorRegistry, Gauge, type MetricObjectWithValues, type MetricValue, type Registry } from 'prom-client';

const GET_METRICS_REQ = 'prom-client:getMetricsReq';
const GET_METRICS_RES = 'prom-client:getMetricsRes';

/** How long a scrape waits for the workers: well within Prometheus's scrape timeout (10 s by default). */
export const WORKER_METRICS_WAIT_MS = 1500;

export type WorkerMetrics = MetricObjectWithValues<MetricValue<string>>[];

interface Pending {
  waiting: Set<number>;
  answers: WorkerMetrics[];
  finish(): void;
}

export class FleetMetrics {
  readonly #pending = new Map<string, Pending>();
  readonly #missing: Gauge;
  readonly #waitMs: number;
  #next = 0;
  readonly #onMessage = (worker: Worker, message: unknown): void => this.#answer(worker, message);

  constructor(options: { registry: Registry; waitMs?: number }) {
    this.#waitMs = options.waitMs ?? WORKER_METRICS_WAIT_MS;
    this.#missing = new Gauge({
      name: 'actionledger_scrape_workers_missing',
      help: 'Dispatcher workers whose metrics this scrape lacks: still starting, exiting, or too slow to answer.',
      registers: [options.registry],
    });
    cluster.on('message', this.#onMessage);
  }

  /** Stops listening; a scrape in flight answers with what it has. */
  close(): void {
    cluster.off('message', this.#onMessage);
    for (const p of this.#pending.values()) p.finish();
  }

  /**
   * The fleet's exposition: `own()` (the parent's metrics, read after this scrape's count of missing workers is
   * set) merged with the workers' that answered within the wait, by series: counters of one name and labels are
   * summed, and each worker's series carry its `worker` slot label, so a name the parent and the workers both
   * register (the API's counters, served by whichever process a connection reaches) appears once. Answers that
   * cannot be merged (a metric of one name with two types) are left out, all of them. Never rejects for the
   * workers; rejects only when `own()` does.
   */
  async exposition(own: () => Promise<WorkerMetrics>, openMetrics = false): Promise<string> {
    const workers = Object.values(cluster.workers ?? {}).filter((w): w is Worker => w !== undefined && w.isConnected());
    const answers = workers.length === 0 ? [] : await this.#ask(workers);
    this.#missing.set(workers.length - answers.length);
    const mine = await own();
    try {
      // OpenMetrics (asked for by the scraper): the same merge, with the histograms' exemplars put back.
      if (openMetrics) return await openMetricsText([mine, ...answers]);
      return await AggregatorRegistry.aggregate([mine, ...answers]).metrics();
    } catch {
      // Better the parent's alone than a failed scrape.
      this.#missing.set(workers.length);
      if (openMetrics) return await openMetricsText([await own()]);
      return await AggregatorRegistry.aggregate([await own()]).metrics();
    }
  }

  #ask(workers: Worker[]): Promise<WorkerMetrics[]> {
    const requestId = `fleet-${process.pid}-${this.#next++}`;
    return new Promise((resolve) => {
      const pending: Pending = {
        waiting: new Set(workers.map((w) => w.id)),
        answers: [],
        finish: () => {
          clearTimeout(timer);
          this.#pending.delete(requestId);
          resolve(pending.answers);
        },
      };
      const timer = setTimeout(() => pending.finish(), this.#waitMs);
      this.#pending.set(requestId, pending);
      for (const w of workers) {
        try {
          // A worker whose channel closed since the check above is simply not waited for.
          w.send({ type: GET_METRICS_REQ, requestId }, (err: Error | null) => {
            if (err !== null) this.#done(requestId, w.id, null);
          });
        } catch {
          this.#done(requestId, w.id, null);
        }
      }
    });
  }

  #answer(worker: Worker, message: unknown): void {
    const m = message as { type?: unknown; requestId?: unknown; metrics?: unknown; error?: unknown } | null;
    if (m?.type !== GET_METRICS_RES || typeof m.requestId !== 'string') return;
    // A worker that failed to read its registries answers an error: it is missing from this scrape.
    const metrics = m.error === undefined && Array.isArray(m.metrics) ? (m.metrics as WorkerMetrics[]) : null;
    this.#done(m.requestId, worker.id, metrics);
  }

  #done(requestId: string, workerId: number, metrics: WorkerMetrics[] | null): void {
    const pending = this.#pending.get(requestId);
    if (pending === undefined || !pending.waiting.delete(workerId)) return;
    if (metrics !== null) pending.answers.push(metrics.flat());
    if (pending.waiting.size === 0) pending.finish();
  }
}
