/**
 * The service's workers (node:cluster children): each serves the HTTP API on the shared listener and runs a
 * dispatcher (bin/dispatcher-worker.ts). States of the set:
 *
 *   running: a worker that exits is replaced, after 1 s, doubling per worker that dies within 30 s of its
 *            start (up to 30 s), and not while `canFork()` says no (the embedded cluster is restarting)
 *   stopping: every worker gets SIGTERM (it stops claiming and finishes in-flight dispatches up to
 *            dispatcher.shutdown_deadline_ms, then exits 0); none is replaced; one still alive 10 s past the
 *            deadline, or when the stop is forced, gets SIGKILL
 * Its start/stop life is core/service.ts's: `start()` forks the workers once, `stop(deadlineMs, forced)` waits for
 * them all and leaves its tally in `result`.
 */
import cluster, { type Worker } from 'node:cluster';
import type { Logger } from '../core/log.js';
import { backoffMs } from '../core/retry.js';
import { Service } from '../core/service.js';

/** The IPC message a worker sends its parent with its dispatcher id, before it claims anything. */
export const WORKER_ID_MESSAGE = 'actionledger:worker-id';

const REPLACE_AFTER_MS = 1000;
const REPLACE_MAX_MS = 30_000;
const SHORT_LIFE_MS = 30_000;
const KILL_GRACE_MS = 10_000;

export interface StopResult {
  total: number;
  clean: number;
  killed: number;
}

export class WorkerSet extends Service<[deadlineMs?: number, forced?: Promise<void>]> {
  readonly #count: number;
  readonly #env: Record<string, string>;
  readonly #log: Logger;
  /** The last stop's tally; null before a stop. */
  result: StopResult | null = null;
  readonly #canFork: () => boolean;
  readonly #children = new Map<Worker, number>();
  /** Every worker pid this service ran: their claims are this fleet's. */
  readonly pids: number[] = [];
  #stopping = false;
  /** Workers that exited once stopping began, and how many of them with code 0. */
  #stopped = { total: 0, clean: 0 };
  #quickDeaths = 0;
  #timers = new Set<NodeJS.Timeout>();

  readonly #onExit: (workerId: string) => void;
  readonly #onMessage: (worker: Worker, slot: number, message: unknown) => void;
  readonly #onFork: (worker: Worker, slot: number) => void;
  /** The dispatcher id each worker process told this parent (WORKER_ID_MESSAGE). */
  readonly #ids = new Map<Worker, string>();

  /**
   * `onExit` hears every worker's exit, stopping or not, with the dispatcher id the worker told (a worker that
   * died before telling it had claimed nothing): the orphan watch reconciles what it left at once.
   */
  constructor(options: {
    /** How many workers to keep. */
    count: number;
    env: Record<string, string>;
    log: Logger;
    canFork: () => boolean;
    onExit?: (workerId: string) => void;
    /** Hears every message a worker sends (the dispatcher id's included). */
    onMessage?: (worker: Worker, slot: number, message: unknown) => void;
    /** Hears every fork, the replacements' included, before the worker can send anything. */
    onFork?: (worker: Worker, slot: number) => void;
  }) {
    super();
    this.#count = options.count;
    this.#env = options.env;
    this.#log = options.log;
    this.#canFork = options.canFork;
    this.#onExit = options.onExit ?? (() => undefined);
    this.#onMessage = options.onMessage ?? (() => undefined);
    this.#onFork = options.onFork ?? (() => undefined);
  }

  /** The worker processes alive now. */
  get processes(): Worker[] {
    return [...this.#children.keys()];
  }

  protected onStart(): Promise<void> {
    this.#stopping = false;
    for (let slot = 1; slot <= this.#count; slot++) this.#fork(slot);
    return Promise.resolve();
  }

  /**
   * Forks the worker of `slot` (1..n). The slot, not the pid, labels its metrics (`worker="2"`): a replacement
   * takes over its predecessor's series instead of adding new ones with every restart.
   */
  #fork(slot: number): void {
    if (this.#stopping) return;
    if (!this.#canFork()) return this.#later(REPLACE_AFTER_MS, slot);
    const w = cluster.fork({ ...this.#env, ACTIONLEDGER_WORKER_SLOT: String(slot) });
    const started = Date.now();
    this.#children.set(w, started);
    if (w.process.pid !== undefined) this.pids.push(w.process.pid);
    this.#onFork(w, slot);
    w.on('message', (m: unknown) => {
      const msg = m as { type?: unknown; workerId?: unknown } | null;
      if (msg?.type === WORKER_ID_MESSAGE && typeof msg.workerId === 'string') this.#ids.set(w, msg.workerId);
      this.#onMessage(w, slot, m);
    });
    w.on('exit', (code, signal) => {
      this.#children.delete(w);
      const id = this.#ids.get(w);
      this.#ids.delete(w);
      if (id !== undefined) this.#onExit(id);
      if (this.#stopping) {
        this.#stopped.total++;
        if (code === 0 && signal === null) this.#stopped.clean++;
        return;
      }
      this.#quickDeaths = Date.now() - started < SHORT_LIFE_MS ? this.#quickDeaths + 1 : 0;
      const delay = backoffMs(
        { baseDelayMs: REPLACE_AFTER_MS, maxDelayMs: REPLACE_MAX_MS },
        Math.min(this.#quickDeaths, 5) + 1,
      );
      this.#log.error(
        { worker_pid: w.process.pid, code, signal, restart_in_ms: delay },
        'dispatcher worker exited; starting another',
      );
      this.#later(delay, slot);
    });
  }

  #later(ms: number, slot: number): void {
    const timer = setTimeout(() => {
      this.#timers.delete(timer);
      this.#fork(slot);
    }, ms);
    this.#timers.add(timer);
  }

  /**
   * No worker is replaced from now on. Called the moment a stop is asked for: a terminal's Ctrl-C reaches
   * the workers too, and one with nothing in flight exits at once, before stop() runs.
   */
  halt(): void {
    this.#stopping = true;
    for (const t of this.#timers) clearTimeout(t);
  }

  /**
   * SIGTERM to every worker; resolves when all exited (the tally in `result`). Those still running
   * `deadlineMs` + 10 s later, or once `forced` resolves, get SIGKILL. Never rejects.
   */
  protected async onStop(deadlineMs = 15_000, forced: Promise<void> = new Promise(() => undefined)): Promise<void> {
    this.halt();
    const children = [...this.#children.keys()];
    let killed = 0;
    const exits = children.map(
      (w) =>
        new Promise<void>((resolve) => {
          w.once('exit', () => resolve());
          w.process.kill('SIGTERM');
        }),
    );
    const all = Promise.all(exits);
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, deadlineMs + KILL_GRACE_MS);
    });
    await Promise.race([all, late, forced]);
    clearTimeout(timer);
    for (const w of children) {
      if (w.process.exitCode === null && w.process.signalCode === null) {
        killed++;
        w.process.kill('SIGKILL');
      }
    }
    await all;
    this.result = { total: this.#stopped.total, clean: this.#stopped.clean, killed };
  }
}
