/**
 * The parent's side of the API served by every worker (bin/worker-http.ts). The parent listens on no HTTP port
 * itself (node:cluster's primary holds the shared listening socket and deals its connections out to the
 * workers); it keeps what is the fleet's:
 *
 *   - `/metrics`: a worker asks (bin/fleet-ipc.ts); the parent reads the ledger gauges, asks every worker for its
 *     registry (bin/fleet-metrics.ts) and answers with its own metrics and theirs merged;
 *   - the probes' view: the embedded database's state and whether the service is stopping, sent to each worker
 *     when it starts and to all whenever it changes (checked every {@link HEALTH_CHECK_MS});
 *   - when the fleet serves: {@link FleetHttp.serving} resolves once every slot's worker has said it listens
 *     (with the address), and rejects with the first refusal a worker reports while it waits (`port_in_use`:
 *     every worker would meet it);
 *   - the folder of the workers' peer sockets (server/mcp/peers.ts), made private to this user and removed when
 *     the service stops.
 */
import type { Worker } from 'node:cluster';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ActionLedgerError } from '../core/errors.js';
import type { Logger } from '../core/log.js';
import { OPENMETRICS_CONTENT_TYPE } from '../core/metrics.js';
import type { Runtime } from '../runtime/index.js';
import { FleetMetrics } from './fleet-metrics.js';
import {
  HEALTH,
  HEALTH_ASK,
  METRICS_ANSWER,
  METRICS_ASK,
  REFUSED,
  SERVING,
  toParent,
  type HealthView,
  type MetricsAnswer,
} from './fleet-ipc.js';

/** A Unix socket's path holds at most 107 bytes: a long TMPDIR gives way to /tmp. */
function peerParent(): string {
  const longest = join(tmpdir(), 'actionledger-peers-XXXXXX', 'w9999.sock');
  return Buffer.byteLength(longest) <= 100 ? tmpdir() : '/tmp';
}

/** How often the parent looks whether the probes' view changed (the embedded database's state, stopping). */
export const HEALTH_CHECK_MS = 100;

export interface FleetHttpOptions {
  runtime: Runtime;
  /** How many worker slots serve: {@link FleetHttp.serving} waits for each. */
  slots: number;
  health: () => HealthView;
  /** Refreshes the gauges read at scrape time (the ledger's, the gate's, the fleet's). */
  beforeScrape: () => Promise<void>;
  log: Logger;
}

export class FleetHttp {
  readonly #options: FleetHttpOptions;
  readonly #metrics: FleetMetrics;
  readonly #timer: NodeJS.Timeout;
  readonly #workers = new Set<Worker>();
  readonly #served = new Set<number>();
  #last: string;
  #address: { address: string; port: number } | null = null;
  #refusal: Error | null = null;
  #settle: { resolve(a: { address: string; port: number }): void; reject(e: Error): void } | null = null;
  /** The folder of the workers' peer sockets (mode 0700). */
  readonly peerDir: string;

  constructor(options: FleetHttpOptions) {
    this.#options = options;
    this.#metrics = new FleetMetrics({ registry: options.runtime.metrics.registry });
    this.peerDir = mkdtempSync(join(peerParent(), 'actionledger-peers-'));
    this.#last = JSON.stringify(options.health());
    this.#timer = setInterval(() => this.checkHealth(), HEALTH_CHECK_MS);
    this.#timer.unref();
  }

  /** A worker was forked: it is told of each change of the probes' view (and asks for the first). */
  forked(worker: Worker): void {
    this.#workers.add(worker);
    worker.once('exit', () => this.#workers.delete(worker));
  }

  /** A message from the worker of `slot`. */
  message(worker: Worker, slot: number, raw: unknown): void {
    const m = toParent(raw);
    if (m === null) return;
    if (m.type === HEALTH_ASK) this.#tell(worker, this.#options.health());
    else if (m.type === METRICS_ASK) void this.#answerMetrics(worker, m.id, m.openMetrics === true);
    else if (m.type === SERVING) {
      this.#served.add(slot);
      this.#address ??= { address: m.address, port: m.port };
      if (this.#served.size >= this.#options.slots) this.#settle?.resolve(this.#address);
    } else if (m.type === REFUSED) {
      this.#options.log.error({ code: m.code, worker_slot: slot, details: m.details }, `worker refused: ${m.message}`);
      this.#refusal ??= new ActionLedgerError(m.code, m.message, m.details === undefined ? {} : { details: m.details });
      this.#settle?.reject(this.#refusal);
    }
  }

  /** Resolves with the address once every slot served; rejects with the first refusal reported meanwhile. */
  serving(): Promise<{ address: string; port: number }> {
    return new Promise((resolve, reject) => {
      if (this.#address !== null && this.#served.size >= this.#options.slots) return resolve(this.#address);
      if (this.#refusal !== null) return reject(this.#refusal);
      this.#settle = {
        resolve: (a) => {
          this.#settle = null;
          resolve(a);
        },
        reject: (e) => {
          this.#settle = null;
          reject(e);
        },
      };
    });
  }

  /** Stops the checks and removes the peer folder (the workers have stopped). */
  close(): void {
    clearInterval(this.#timer);
    this.#metrics.close();
    this.#settle?.reject(new ActionLedgerError('internal', 'the service stopped before its workers served'));
    rmSync(this.peerDir, { recursive: true, force: true });
  }

  /**
   * Tells every worker the service's view for the probes if it changed since they were last told. Runs every
   * HEALTH_CHECK_MS, and at once when the service knows the view changed (the embedded cluster died or is back).
   */
  checkHealth(): void {
    const now = this.#options.health();
    const text = JSON.stringify(now);
    if (text === this.#last) return;
    this.#last = text;
    for (const w of this.#workers) this.#tell(w, now);
  }

  #tell(worker: Worker, view: HealthView): void {
    if (!worker.isConnected()) return;
    try {
      worker.send({ type: HEALTH, ...view });
    } catch {
      // Its channel just closed: it is exiting.
    }
  }

  async #answerMetrics(worker: Worker, id: number, openMetrics: boolean): Promise<void> {
    const rt = this.#options.runtime;
    let answer: MetricsAnswer;
    try {
      await this.#options
        .beforeScrape()
        .catch((err: unknown) => this.#options.log.warn({ err }, 'scrape-time gauges failed'));
      const body = await this.#metrics.exposition(() => rt.metrics.asJson(), openMetrics);
      const contentType = openMetrics ? OPENMETRICS_CONTENT_TYPE : rt.metrics.registry.contentType;
      answer = { type: METRICS_ANSWER, id, contentType, body };
    } catch (err) {
      this.#options.log.error({ err }, 'the fleet exposition failed');
      answer = { type: METRICS_ANSWER, id, contentType: '', body: '', error: (err as Error).message };
    }
    if (!worker.isConnected()) return;
    try {
      worker.send(answer);
    } catch {
      // The asking worker is gone; its scrape went with it.
    }
  }
}
