/**
 * What the fleet's parent and its workers tell each other over node:cluster's IPC channel, besides prom-client's
 * own metrics messages (bin/fleet-metrics.ts) and the dispatcher id (bin/workers.ts).
 *
 * Every worker serves the HTTP API on the shared listener, but two answers are the fleet's, not one process's:
 *
 *   - the probes' view of the service (`/healthz`, `/readyz`): whether the embedded database is restarting and
 *     whether the service is stopping. The parent sends it to each worker when the worker starts and whenever
 *     it changes ({@link HEALTH}), and again when the worker asks ({@link HEALTH_ASK}: a message sent before
 *     the worker listens for it would be lost); a worker answers the probes from the last one it got.
 *   - `/metrics`: the parent's own metrics (the ledger gauges read at scrape time, the reconciler's) merged with
 *     every worker's. A worker asks the parent for the whole exposition ({@link METRICS_ASK}) and serves the
 *     answer ({@link METRICS_ANSWER}); one not answered within {@link METRICS_ASK_WAIT_MS} fails that scrape.
 *
 * A worker tells the parent when it serves ({@link SERVING}, with the address) or why it cannot
 * ({@link REFUSED}, with the error code: `port_in_use` fails the service's start).
 */
import type { ErrorCode } from '../core/errors.js';

export const HEALTH = 'actionledger:health';
export const HEALTH_ASK = 'actionledger:health-ask';
export const METRICS_ASK = 'actionledger:metrics-ask';
export const METRICS_ANSWER = 'actionledger:metrics-answer';
export const SERVING = 'actionledger:serving';
export const REFUSED = 'actionledger:refused';

/** How long a worker's `/metrics` waits for the parent: its own wait for the workers (1.5 s) plus the ledger read. */
export const METRICS_ASK_WAIT_MS = 8_000;

/** The service's own view, as the probes read it (server/api/types.ts `health`). */
export interface HealthView {
  error: string | null;
  stopping: boolean;
}

export interface HealthMessage extends HealthView {
  type: typeof HEALTH;
}

export interface HealthAsk {
  type: typeof HEALTH_ASK;
}

export interface MetricsAsk {
  type: typeof METRICS_ASK;
  id: number;
  /** The OpenMetrics exposition (with exemplars) instead of the text format. */
  openMetrics?: boolean;
}

export interface MetricsAnswer {
  type: typeof METRICS_ANSWER;
  id: number;
  contentType: string;
  body: string;
  /** Set when the parent could not produce the exposition. */
  error?: string;
}

export interface ServingMessage {
  type: typeof SERVING;
  address: string;
  port: number;
}

export interface RefusedMessage {
  type: typeof REFUSED;
  code: ErrorCode;
  message: string;
  details?: Record<string, unknown>;
}

export type ToParent = HealthAsk | MetricsAsk | ServingMessage | RefusedMessage;
export type ToWorker = HealthMessage | MetricsAnswer;

const record = (m: unknown): Record<string, unknown> | null =>
  typeof m === 'object' && m !== null ? (m as Record<string, unknown>) : null;

/** The message as one a worker sends its parent, or null. */
export function toParent(m: unknown): ToParent | null {
  const r = record(m);
  if (r === null) return null;
  if (r.type === HEALTH_ASK) return { type: HEALTH_ASK };
  if (r.type === METRICS_ASK && typeof r.id === 'number') return r as unknown as MetricsAsk;
  if (r.type === SERVING && typeof r.address === 'string' && typeof r.port === 'number')
    return r as unknown as ServingMessage;
  if (r.type === REFUSED && typeof r.code === 'string' && typeof r.message === 'string')
    return r as unknown as RefusedMessage;
  return null;
}

/** The message as one the parent sends a worker, or null. */
export function toWorker(m: unknown): ToWorker | null {
  const r = record(m);
  if (r === null) return null;
  if (r.type === HEALTH && (r.error === null || typeof r.error === 'string') && typeof r.stopping === 'boolean')
    return r as unknown as HealthMessage;
  if (r.type === METRICS_ANSWER && typeof r.id === 'number' && typeof r.body === 'string')
    return r as unknown as MetricsAnswer;
  return null;
}

/**
 * A worker's side of the channel: the last health view the parent sent, and `/metrics` asked of the parent.
 * Listens on `process` from construction; `close()` stops listening and fails the asks still waiting.
 */
export class ParentChannel {
  #health: HealthView = { error: null, stopping: false };
  #next = 0;
  readonly #waiting = new Map<number, (answer: MetricsAnswer | null) => void>();
  readonly #onMessage = (m: unknown): void => {
    const msg = toWorker(m);
    if (msg === null) return;
    if (msg.type === HEALTH) this.#health = { error: msg.error, stopping: msg.stopping };
    else this.#waiting.get(msg.id)?.(msg);
  };

  /** Listens, and asks the parent for the probes' view. */
  constructor() {
    process.on('message', this.#onMessage);
    this.send({ type: HEALTH_ASK });
  }

  /** The parent's last word on the service's health (healthy and running until it has spoken). */
  get health(): HealthView {
    return this.#health;
  }

  /** Tells the parent something; false when the channel is gone (the parent died). */
  send(message: ToParent): boolean {
    if (process.send === undefined || !process.connected) return false;
    try {
      return process.send(message);
    } catch {
      return false;
    }
  }

  /** The fleet's exposition, from the parent. Rejects when the parent does not answer in time or failed. */
  metrics(o: { openMetrics: boolean } = { openMetrics: false }): Promise<{ contentType: string; body: string }> {
    const id = this.#next++;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => finish(null), METRICS_ASK_WAIT_MS);
      const finish = (answer: MetricsAnswer | null): void => {
        clearTimeout(timer);
        this.#waiting.delete(id);
        if (answer === null || answer.error !== undefined)
          reject(new Error(`the fleet's parent did not give its metrics: ${answer?.error ?? 'no answer in time'}`));
        else resolve({ contentType: answer.contentType, body: answer.body });
      };
      this.#waiting.set(id, finish);
      if (!this.send({ type: METRICS_ASK, id, openMetrics: o.openMetrics })) finish(null);
    });
  }

  close(): void {
    process.off('message', this.#onMessage);
    for (const finish of [...this.#waiting.values()]) finish(null);
  }
}
