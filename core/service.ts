/**
 * The one start/stop life of the long-running parts of the system (servers, pollers, the dispatcher, its
 * worker processes, the embedded cluster's supervisor), so each of them only says what starting and stopping it
 * does:
 *
 * - `start()` starts once: a call while starting or running returns the same promise, and a failure to start
 *   rejects it with that failure, after `onStop()` has released whatever the failed start had taken;
 * - `stop()` waits: for a start in progress to settle, then for `onStop()` to finish; a call while stopping
 *   returns the same promise, and a call before any start, or after the stop, resolves at once (idempotent);
 * - errors surface: a failing `onStop()` rejects `stop()` (the service still counts as stopped), nothing is
 *   swallowed here;
 * - starts and stops run one after the other in the order they were asked for, so the last call wins: a stop
 *   asked for after a start that waits for an earlier stop runs after that start, and a start asked for while a
 *   failed start is cleaning up runs after the cleanup;
 * - a stopped service may be started again (a test's provider coming back after an outage).
 */
export type ServiceState = 'idle' | 'starting' | 'running' | 'stopping';

export abstract class Service<StopArgs extends unknown[] = []> {
  #state: ServiceState = 'idle';
  /** What the last call asked for: the state every queued start and stop leads to. */
  #wanted: 'running' | 'idle' = 'idle';
  /** Starts and stops run one after the other, in the order they were asked for. */
  #chain: Promise<void> = Promise.resolve();
  /** The last start or stop asked for and not yet finished. */
  #last: { kind: 'start' | 'stop'; done: Promise<void> } | undefined;
  /** The start that made it running (what a start of a running service returns). */
  #started: Promise<void> = Promise.resolve();

  /** Where it is, or is headed: `stopping` from the moment a stop is asked for, even while a start it waits for runs. */
  get lifecycle(): ServiceState {
    if (this.#last === undefined) return this.#state;
    // A start or stop is asked for and not finished: where it is headed, by way of what runs now.
    if (this.#wanted === 'idle') return 'stopping';
    return this.#state === 'idle' || this.#state === 'starting' ? 'starting' : 'stopping';
  }

  /** Whether it is running: started, and no stop asked for since. */
  get running(): boolean {
    return this.lifecycle === 'running';
  }

  /** What starting does: resolve once started. Called once per start. */
  protected abstract onStart(): Promise<void>;

  /**
   * What stopping does: release everything `onStart` took (it may have failed half way; then it is called with no
   * arguments). Called once per stop.
   */
  protected abstract onStop(...args: StopArgs): Promise<void>;

  start(): Promise<void> {
    this.#wanted = 'running';
    if (this.#last?.kind === 'start') return this.#last.done;
    if (this.#last === undefined && this.#state === 'running') return this.#started;
    const done = this.#enqueue('start', () => this.#runStart());
    this.#started = done;
    return done;
  }

  stop(...args: StopArgs): Promise<void> {
    this.#wanted = 'idle';
    if (this.#last?.kind === 'stop') return this.#last.done;
    if (this.#last === undefined && this.#state === 'idle') return Promise.resolve();
    return this.#enqueue('stop', () => this.#runStop(args));
  }

  #enqueue(kind: 'start' | 'stop', run: () => Promise<void>): Promise<void> {
    const entry: { kind: 'start' | 'stop'; done: Promise<void> } = { kind, done: Promise.resolve() };
    entry.done = this.#chain.then(async () => {
      try {
        await run();
      } finally {
        // Before its callers resume: they see where it ended, not that it is still to come.
        if (this.#last === entry) this.#last = undefined;
      }
    });
    this.#last = entry;
    this.#chain = entry.done.catch(() => undefined);
    return entry.done;
  }

  async #runStart(): Promise<void> {
    if (this.#state === 'running') return;
    this.#state = 'starting';
    try {
      await this.onStart();
    } catch (err) {
      this.#state = 'stopping';
      await this.onStop(...([] as unknown as StopArgs)).catch(() => undefined);
      this.#state = 'idle';
      throw err;
    }
    this.#state = 'running';
  }

  async #runStop(args: StopArgs): Promise<void> {
    if (this.#state === 'idle') return;
    this.#state = 'stopping';
    try {
      await this.onStop(...args);
    } finally {
      this.#state = 'idle';
    }
  }
}
