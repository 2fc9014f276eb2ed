/**
 * The one start/stop life every long-running part of the system has (servers, pollers, the dispatcher, the
 * embedded PostgreSQL's supervisor), so each of them only says what starting and stopping it does:
 *
 * - `start()` starts once: a call while starting or running returns the same promise, and a failure to start
 *   rejects it with that failure, after `onStop()` has released whatever the failed start had taken;
 * - `stop()` waits: for a start in progress to settle, then for `onStop()` to finish; a call while stopping
 *   returns the same promise, and a call before any start, or after the stop, resolves at once (idempotent);
 * - errors surface: a failing `onStop()` rejects `stop()` (the service still counts as stopped), nothing is
 *   swallowed here;
 * - a stopped service may be started again (a test's provider coming back after an outage); a start asked for
 *   while it is stopping waits for that stop first.
 */
export type ServiceState = 'idle' | 'starting' | 'running' | 'stopping';

export abstract class Service<StopArgs extends unknown[] = []> {
  #state: ServiceState = 'idle';
  #starting: Promise<void> | undefined;
  #stopping: Promise<void> | undefined;

  get lifecycle(): ServiceState {
    return this.#state;
  }

  /** Whether it is running: started, and not stopping. */
  get running(): boolean {
    return this.#state === 'running';
  }

  /** What starting does: resolve once started. Called once per start. */
  protected abstract onStart(): Promise<void>;

  /** What stopping does: release everything `onStart` took (it may have stopped half way). Called once per stop. */
  protected abstract onStop(...args: StopArgs): Promise<void>;

  start(): Promise<void> {
    if (this.#state === 'starting' || this.#state === 'running') return this.#starting!;
    if (this.#stopping !== undefined) return this.#stopping.catch(() => undefined).then(() => this.start());
    this.#state = 'starting';
    const starting = (async () => {
      try {
        await this.onStart();
      } catch (err) {
        this.#state = 'stopping';
        await this.onStop(...([] as unknown as StopArgs)).catch(() => undefined);
        this.#state = 'idle';
        this.#starting = undefined;
        throw err;
      }
      // A stop asked for while starting runs once the start is done; the state is then `stopping` already.
      if (this.#state === 'starting') this.#state = 'running';
    })();
    this.#starting = starting;
    return starting;
  }

  stop(...args: StopArgs): Promise<void> {
    if (this.#stopping !== undefined) return this.#stopping;
    if (this.#state === 'idle') return Promise.resolve();
    const started = this.#starting ?? Promise.resolve();
    this.#state = 'stopping';
    const stopping = started
      .then(
        () => this.onStop(...args),
        // A start that failed has released what it took already.
        () => undefined,
      )
      .finally(() => {
        this.#state = 'idle';
        this.#starting = undefined;
        this.#stopping = undefined;
      });
    this.#stopping = stopping;
    return stopping;
  }
}
