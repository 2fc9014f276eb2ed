/**
 * One embedded postmaster that this process owns: spawned here, or adopted (found running on our folder, left
 * by a service that died). States:
 *
 *   running ──(postmaster exits, not asked to)──▶ restarting ──(ready)──▶ running
 *   restarting ──(a try fails)──▶ restarting (the next try waits longer)
 *   any ──stop()──▶ stopped
 *
 * There is no state that gives up: while the service lives the database is its only way to make progress, so
 * the service keeps serving (the probes say `database_restarting`, the API refuses with
 * `database_unavailable`) and keeps trying. Before try n it waits `initial * 2^(n-1)`, capped at `max`, less up
 * to a quarter of it at random (two services on one host do not retry in step; below the cap each wait is
 * still longer than the one before). A postmaster that stayed up for `max` starts the count again at 1. After
 * a kill -9 the old backends hold the shared memory for a moment, so the first try may fail.
 *
 * The postmaster is spawned in its own session (`detached`), so the Ctrl-C a terminal sends to the service's
 * process group never reaches it: the service stops it last, after everything that uses it. That also means
 * it would outlive a service killed with SIGKILL; a tethered cluster (the service's) therefore gets a
 * watchdog per postmaster: a `sh`, in its own session too, reading a pipe whose only writer is this process.
 * When this process dies, however it dies, the kernel closes the pipe, the watchdog's `read` sees the end and
 * it stops the postmaster (fast shutdown: open transactions roll back) if `postmaster.pid` still names it.
 * When this process stops the postmaster itself, or sees it die, it kills the watchdog first. A watchdog that
 * is itself killed leaves the postmaster running; the next start adopts it (see embedded/embedded.ts).
 *
 * The start/stop life is core/service.ts's: `start()` (spawn) or `adopt(pid)` starts it once, `stop()` waits for
 * the postmaster to exit and is idempotent, a failure surfaces. One part does not fit the base: a postmaster
 * that dies is not a stop, and the base has no restart inside `running`. So the restarts stay this class's own:
 * `state` says `restarting` while the base says running, and the restart loop spawns (or adopts) through the
 * same private steps as a start, not through `start()` (which does nothing to a running service). `stop()` ends
 * the loop too: it cuts the loop's wait short, stops the postmaster of a try in progress, and returns only once
 * the loop is over, so a cluster started again after a stop never has an earlier loop's try beside it.
 */
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { backoffMs } from '../core/retry.js';
import { Service } from '../core/service.js';

/** Defaults of `database.embedded_restart_initial_ms` and `database.embedded_restart_max_ms`. */
export const RESTART_INITIAL_MS = 500;
export const RESTART_MAX_MS = 60_000;
const READY_TIMEOUT_MS = 60_000;
const STOP_TIMEOUT_MS = 30_000;
const TAIL_LINES = 20;

export type ClusterState = 'running' | 'restarting' | 'stopped';

/**
 * What the probes (`/healthz`, `/readyz`) say about the embedded cluster in `state`: `database_restarting`
 * while it is down and being restarted, null otherwise (then the probe asks the database itself). The one
 * place that turns the supervisor's state into the probes' vocabulary.
 */
export function embeddedProbeError(state: ClusterState | undefined): 'database_restarting' | null {
  return state === 'restarting' ? 'database_restarting' : null;
}

export interface RestartBackoff {
  /** The wait before the first try after a death (ms). */
  initialMs: number;
  /** The longest wait (ms); also how long a postmaster must stay up for the count to start again. */
  maxMs: number;
}

/** The wait before try `attempt` (1, 2, ...): `random` in [0, 1) takes up to a quarter off the doubled wait. */
export function restartDelay(attempt: number, backoff: RestartBackoff, random: number = Math.random()): number {
  return backoffMs({ baseDelayMs: backoff.initialMs, maxDelayMs: backoff.maxMs, jitter: 0.25 }, attempt, () => random);
}

export interface ClusterEvents {
  /** The postmaster exited without being asked to; restart tries follow. */
  onDied?(info: { pid: number | undefined; code: number | null; signal: string | null; tail: string[] }): void;
  /** Try `attempt` starts after `delayMs`. */
  onRestartScheduled?(info: { attempt: number; delayMs: number }): void;
  /** Try `attempt` did not bring it up; the next one is scheduled. */
  onRestartFailed?(info: { attempt: number; message: string }): void;
  onRestarted?(info: { pid: number | undefined; attempt: number; watchdogPid: number | undefined }): void;
}

function postgresIds(): { uid?: number; gid?: number } {
  if (process.getuid?.() !== 0) return {};
  const id = (flag: string): number => Number(execFileSync('id', [flag, 'postgres'], { encoding: 'utf8' }).trim());
  return { uid: id('-u'), gid: id('-g') };
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** The postmaster's pid from `postmaster.pid` (first line), or undefined. */
export function postmasterPid(clusterDir: string): number | undefined {
  try {
    const pid = Number(readFileSync(join(clusterDir, 'postmaster.pid'), 'utf8').split('\n')[0]);
    return Number.isInteger(pid) && pid > 0 ? pid : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The watchdog (see the top of this file). $1 the postmaster's pid, $2 its `postmaster.pid`. The first loop
 * ends only at end of file, when every writer of the pipe is gone. The pid is checked against the file so a
 * pid reused by another process after the postmaster died is never signalled; SIGQUIT (immediate shutdown)
 * follows when a fast shutdown has not finished in 30 s.
 */
const WATCHDOG = `
while read -r _; do :; done
first=
{ read -r first < "$2"; } 2>/dev/null
[ "$first" = "$1" ] || exit 0
kill -INT "$1" 2>/dev/null || exit 0
i=0
while kill -0 "$1" 2>/dev/null; do
  i=$((i + 1))
  if [ "$i" -gt 30 ]; then kill -QUIT "$1" 2>/dev/null; exit 0; fi
  sleep 1
done
`;

export class EmbeddedCluster extends Service {
  readonly #bin: string;
  readonly #clusterDir: string;
  readonly #args: string[];
  readonly #onLog: (line: string) => void;
  readonly #backoff: RestartBackoff;
  readonly #tether: boolean;
  #events: ClusterEvents = {};
  #child: ChildProcess | undefined;
  #adopted: number | undefined;
  #watch: NodeJS.Timeout | undefined;
  #watchdog: ChildProcess | undefined;
  /** The postmaster died and the restart loop has not brought one back yet (`restarting`). */
  #down = false;
  /** Set by this cluster's stop, from the moment it runs: a death is then no cause to restart. */
  #stopping = false;
  /** The postmaster `adopt()` asked the next start to take over instead of spawning one. */
  #toAdopt: number | undefined;
  /** The restart loop while it runs, and what cuts its wait short. */
  #restarting: Promise<void> | undefined;
  #cutWait: (() => void) | undefined;
  /** Tries since the last postmaster that stayed up for the cap; the next try is `#attempts + 1`. */
  #attempts = 0;
  #upSince = 0;
  #restarts = 0;
  #tail: string[] = [];

  constructor(options: {
    postgresBin: string;
    clusterDir: string;
    port: number;
    flags: string[];
    onLog: (line: string) => void;
    /** The waits between restart tries (default 0.5 s doubling to 60 s). */
    backoff?: RestartBackoff;
    /** Stop the postmaster when this process dies (the watchdog above); the service's cluster only. */
    tether?: boolean;
  }) {
    super();
    this.#bin = options.postgresBin;
    this.#clusterDir = options.clusterDir;
    this.#args = ['-D', options.clusterDir, '-p', String(options.port), ...options.flags];
    this.#onLog = options.onLog;
    this.#backoff = options.backoff ?? { initialMs: RESTART_INITIAL_MS, maxMs: RESTART_MAX_MS };
    this.#tether = options.tether === true && process.platform !== 'win32';
  }

  /** `stopped` unless the base says running (so also while it starts and stops); then up or restarting. */
  get state(): ClusterState {
    return !this.running ? 'stopped' : this.#down ? 'restarting' : 'running';
  }

  get pid(): number | undefined {
    return this.#child?.pid ?? this.#adopted;
  }

  /** Postmasters brought back up since this process took the cluster over. */
  get restarts(): number {
    return this.#restarts;
  }

  /** The watchdog's pid while one is armed (a test kills it to leave an orphan behind). */
  get watchdogPid(): number | undefined {
    return this.#watchdog?.pid;
  }

  /** Restarts the postmaster when it dies (service only); `events` say what happened. */
  supervise(events: ClusterEvents): void {
    this.#events = events;
  }

  /** Starts by taking over a postmaster already running on our folder (left by a service that died). */
  adopt(pid: number): Promise<void> {
    if (this.lifecycle !== 'idle')
      return Promise.reject(new Error(`cannot adopt postmaster ${pid}: the cluster is ${this.lifecycle}`));
    this.#toAdopt = pid;
    return this.start();
  }

  /**
   * Spawns the postmaster, ready once it accepts connections (or takes over the one `adopt()` names).
   * @throws Error with the cluster's last log lines when it exits first or is not ready in 60 s.
   */
  protected async onStart(): Promise<void> {
    this.#stopping = false;
    this.#down = false;
    const adopt = this.#toAdopt;
    this.#toAdopt = undefined;
    if (adopt === undefined) await this.#spawn();
    else this.#takeOver(adopt);
  }

  async #spawn(): Promise<void> {
    const child = spawn(this.#bin, this.#args, {
      ...postgresIds(),
      detached: true,
      stdio: ['ignore', 'ignore', 'pipe'],
      env: { ...process.env, LC_MESSAGES: 'C' },
    });
    this.#child = child;
    // Armed before it is ready: a service killed while the postmaster starts leaves nothing behind either.
    if (child.pid !== undefined) this.#arm(child.pid);
    let buffered = '';
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        child.kill('SIGQUIT');
        reject(new Error(`embedded PostgreSQL not ready after ${READY_TIMEOUT_MS} ms: ${this.#tail.join(' | ')}`));
      }, READY_TIMEOUT_MS);
      child.stderr?.on('data', (chunk: Buffer) => {
        buffered += chunk.toString('utf8');
        const lines = buffered.split('\n');
        buffered = lines.pop() ?? '';
        for (const line of lines) {
          this.#tail.push(line);
          if (this.#tail.length > TAIL_LINES) this.#tail.shift();
          this.#onLog(line);
          if (line.includes('database system is ready to accept connections')) {
            clearTimeout(timer);
            resolve();
          }
        }
      });
      child.once('exit', (code, signal) => {
        clearTimeout(timer);
        reject(
          new Error(
            `embedded PostgreSQL exited (code ${code}, signal ${signal}) before it was ready: ${this.#tail.slice(-5).join(' | ')}`,
          ),
        );
      });
      child.once('error', (err) => {
        clearTimeout(timer);
        reject(err);
      });
    }).catch((err: unknown) => {
      this.#disarm();
      this.#child = undefined;
      throw err;
    });
    this.#down = false;
    this.#upSince = Date.now();
    child.once('exit', (code, signal) => this.#died(child.pid, code, signal));
  }

  #takeOver(pid: number): void {
    this.#adopted = pid;
    this.#down = false;
    this.#upSince = Date.now();
    this.#arm(pid);
    // Not our child: no exit event, so liveness is polled.
    this.#watch = setInterval(() => {
      if (!isAlive(pid)) this.#died(pid, null, null);
    }, 1000);
    this.#watch.unref();
  }

  /** Starts the watchdog of postmaster `pid` (tethered clusters only), replacing any earlier one. */
  #arm(pid: number): void {
    if (!this.#tether) return;
    this.#disarm();
    const dog = spawn(
      '/bin/sh',
      ['-c', WATCHDOG, 'actionledger-pg-watchdog', String(pid), join(this.#clusterDir, 'postmaster.pid')],
      { detached: true, stdio: ['pipe', 'ignore', 'ignore'] },
    );
    // A watchdog that could not start protects nothing, but the cluster still runs: adoption covers it.
    dog.once('error', (err) => this.#onLog(`watchdog for postmaster ${pid} did not start: ${err.message}`));
    // Neither the watchdog nor its pipe keeps this process alive; the pipe's write end is never written.
    dog.stdin?.on('error', () => undefined);
    (dog.stdin as unknown as { unref?: () => void } | null)?.unref?.();
    dog.unref();
    this.#watchdog = dog;
  }

  /** Kills the watchdog without letting it act: its pipe stays open until it is gone. */
  #disarm(): void {
    const dog = this.#watchdog;
    this.#watchdog = undefined;
    if (dog !== undefined && dog.exitCode === null && dog.signalCode === null) dog.kill('SIGKILL');
  }

  #died(pid: number | undefined, code: number | null, signal: string | null): void {
    if (this.#watch !== undefined) clearInterval(this.#watch);
    this.#watch = undefined;
    this.#disarm();
    this.#child = undefined;
    this.#adopted = undefined;
    if (this.#stopping) return;
    this.#down = true;
    // A postmaster that stayed up as long as the longest wait starts the count again.
    if (Date.now() - this.#upSince >= this.#backoff.maxMs) this.#attempts = 0;
    this.#events.onDied?.({ pid, code, signal, tail: [...this.#tail] });
    const loop = this.#restart().finally(() => {
      if (this.#restarting === loop) this.#restarting = undefined;
    });
    this.#restarting = loop;
  }

  /** Tries until the postmaster is up again or stop() is called; never gives up on its own. */
  async #restart(): Promise<void> {
    while (!this.#stopping) {
      const attempt = ++this.#attempts;
      const delayMs = restartDelay(attempt, this.#backoff);
      this.#events.onRestartScheduled?.({ attempt, delayMs });
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, delayMs);
        this.#cutWait = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.#cutWait = undefined;
      if (this.#stopping) return;
      // A CLI command may have started it again meanwhile: then it is ours to watch, not to start.
      const running = postmasterPid(this.#clusterDir);
      if (running !== undefined && isAlive(running)) {
        this.#takeOver(running);
        this.#restarted(attempt);
        return;
      }
      try {
        await this.#spawn();
        this.#restarted(attempt);
        return;
      } catch (err) {
        // stop() during a try: the try's own postmaster was stopped with it; nothing more to do.
        if (this.#stopping) return;
        this.#events.onRestartFailed?.({ attempt, message: (err as Error).message });
      }
    }
  }

  #restarted(attempt: number): void {
    this.#restarts++;
    this.#events.onRestarted?.({ pid: this.pid, attempt, watchdogPid: this.watchdogPid });
  }

  /** Stops the postmaster (fast shutdown: open transactions roll back), waits for it, and ends the restart loop. */
  protected async onStop(): Promise<void> {
    this.#stopping = true;
    this.#cutWait?.();
    if (this.#watch !== undefined) clearInterval(this.#watch);
    this.#watch = undefined;
    // This process stops it now: the watchdog must not act on the pipe closing at this process's exit.
    this.#disarm();
    await this.#stopPostmaster().finally(() => {
      this.#child = undefined;
      this.#adopted = undefined;
    });
    await this.#restarting;
  }

  async #stopPostmaster(): Promise<void> {
    const child = this.#child;
    const pid = child?.pid ?? this.#adopted;
    if (pid === undefined) return;
    if (child !== undefined && child.exitCode === null && child.signalCode === null) {
      const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
      child.kill('SIGINT');
      const timer = setTimeout(() => child.kill('SIGQUIT'), STOP_TIMEOUT_MS);
      await exited;
      clearTimeout(timer);
    } else if (child === undefined) {
      try {
        process.kill(pid, 'SIGINT');
      } catch {
        return;
      }
      for (const started = Date.now(); isAlive(pid);) {
        if (Date.now() - started > STOP_TIMEOUT_MS) process.kill(pid, 'SIGQUIT');
        await new Promise((r) => setTimeout(r, 100));
      }
    }
  }
}
