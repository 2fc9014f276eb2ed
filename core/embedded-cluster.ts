/**
 * One embedded postmaster that this process owns: spawned here, or adopted (found running on our folder, left
 * by a service that died). States:
 *
 *   running ──(postmaster exits, not asked to)──▶ restarting ──(ready)──▶ running
 *   restarting ──(tries spent)──▶ failed          any ──stop()──▶ stopped
 *
 * The postmaster is spawned in its own session (`detached`), so the Ctrl-C a terminal sends to the service's
 * process group never reaches it: the service stops it last, after everything that uses it. Restart policy:
 * at most {@link MAX_RESTARTS} tries within {@link RESTART_WINDOW_MS}, waiting 0.5, 1, 2, 4, 8 s before
 * them; after a kill -9 the old backends hold the shared memory for a moment, so the first try may fail.
 */
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ActionLedgerError } from './errors.js';

export const MAX_RESTARTS = 5;
export const RESTART_WINDOW_MS = 10 * 60_000;
const READY_TIMEOUT_MS = 60_000;
const STOP_TIMEOUT_MS = 30_000;
const TAIL_LINES = 20;

export type ClusterState = 'running' | 'restarting' | 'failed' | 'stopped';

export interface ClusterEvents {
  /** The postmaster exited without being asked to; a restart follows. */
  onDied?(info: { pid: number | undefined; code: number | null; signal: string | null; tail: string[] }): void;
  onRestarted?(info: { pid: number | undefined; tries: number }): void;
  /** Restarts were spent: the cluster stays down. */
  onFailed?(err: ActionLedgerError): void;
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

export class EmbeddedCluster {
  readonly #bin: string;
  readonly #clusterDir: string;
  readonly #args: string[];
  readonly #onLog: (line: string) => void;
  #events: ClusterEvents = {};
  #child: ChildProcess | undefined;
  #adopted: number | undefined;
  #watch: NodeJS.Timeout | undefined;
  #state: ClusterState = 'stopped';
  #stopping = false;
  #restarts: number[] = [];
  #tail: string[] = [];

  constructor(options: {
    postgresBin: string;
    clusterDir: string;
    port: number;
    flags: string[];
    onLog: (line: string) => void;
  }) {
    this.#bin = options.postgresBin;
    this.#clusterDir = options.clusterDir;
    this.#args = ['-D', options.clusterDir, '-p', String(options.port), ...options.flags];
    this.#onLog = options.onLog;
  }

  get state(): ClusterState {
    return this.#state;
  }

  get pid(): number | undefined {
    return this.#child?.pid ?? this.#adopted;
  }

  /** Restarts the postmaster when it dies (service only); `events` say what happened. */
  supervise(events: ClusterEvents): void {
    this.#events = events;
  }

  /**
   * Spawns the postmaster and resolves once it accepts connections.
   * @throws Error with the cluster's last log lines when it exits first or is not ready in 60 s.
   */
  async start(): Promise<void> {
    const child = spawn(this.#bin, this.#args, {
      ...postgresIds(),
      detached: true,
      stdio: ['ignore', 'ignore', 'pipe'],
      env: { ...process.env, LC_MESSAGES: 'C' },
    });
    this.#child = child;
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
      this.#child = undefined;
      throw err;
    });
    this.#state = 'running';
    child.once('exit', (code, signal) => this.#died(child.pid, code, signal));
  }

  /** Takes ownership of a postmaster already running on our folder (left by a service that died). */
  adopt(pid: number): void {
    this.#adopted = pid;
    this.#state = 'running';
    // Not our child: no exit event, so liveness is polled.
    this.#watch = setInterval(() => {
      if (!isAlive(pid)) this.#died(pid, null, null);
    }, 1000);
    this.#watch.unref();
  }

  #died(pid: number | undefined, code: number | null, signal: string | null): void {
    if (this.#watch !== undefined) clearInterval(this.#watch);
    this.#watch = undefined;
    this.#child = undefined;
    this.#adopted = undefined;
    if (this.#stopping) return;
    this.#state = 'restarting';
    this.#events.onDied?.({ pid, code, signal, tail: [...this.#tail] });
    void this.#restart();
  }

  async #restart(): Promise<void> {
    for (let tries = 1; !this.#stopping; tries++) {
      const now = Date.now();
      this.#restarts = this.#restarts.filter((at) => now - at < RESTART_WINDOW_MS);
      if (this.#restarts.length >= MAX_RESTARTS) {
        this.#state = 'failed';
        this.#events.onFailed?.(
          new ActionLedgerError(
            'embedded_database_failed',
            `the embedded PostgreSQL in ${this.#clusterDir} died and ${MAX_RESTARTS} restarts within ${RESTART_WINDOW_MS / 60_000} minutes did not keep it up`,
            {
              details: { cluster_dir: this.#clusterDir, tail: this.#tail.slice(-5) },
            },
          ),
        );
        return;
      }
      this.#restarts.push(now);
      await new Promise((r) => setTimeout(r, 500 * 2 ** Math.min(tries - 1, 4)));
      if (this.#stopping) return;
      // A CLI command may have started it again meanwhile: then it is ours to watch, not to start.
      const running = postmasterPid(this.#clusterDir);
      if (running !== undefined && isAlive(running)) {
        this.adopt(running);
        this.#events.onRestarted?.({ pid: running, tries });
        return;
      }
      try {
        await this.start();
        this.#events.onRestarted?.({ pid: this.pid, tries });
        return;
      } catch {
        // Counted against the window; the cluster's own lines are in the log.
      }
    }
  }

  /** Stops the postmaster (fast shutdown: open transactions roll back); waits for it to exit. Safe to repeat. */
  async stop(): Promise<void> {
    this.#stopping = true;
    if (this.#watch !== undefined) clearInterval(this.#watch);
    const child = this.#child;
    const pid = child?.pid ?? this.#adopted;
    this.#state = 'stopped';
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
    this.#child = undefined;
    this.#adopted = undefined;
  }
}
