/**
 * The parent process of `actionledger start`. States:
 *
 *   starting ──▶ running ──(SIGINT / SIGTERM / SIGHUP)──▶ stopping ──▶ exit
 *   starting ──(a step failed, or a signal)──▶ stopping (only what started) ──▶ exit 1 (0 for a signal)
 *   stopping ──(a second signal)──▶ forced: workers get SIGKILL, every later step still runs, the cluster last
 *
 * The embedded cluster dying is not a way out of running: the service stays up (the probes answer 503
 * `database_restarting`, the API 503 `database_unavailable`, workers keep retrying their writes) while the
 * cluster is restarted with a growing wait, as long as it takes (embedded/cluster.ts). A service killed
 * outright (SIGKILL) takes its postmaster with it: the cluster's watchdog stops it when this process is gone.
 *
 * Each start step pushes its stop on a stack that stopping unwinds in reverse, so a failed start stops
 * exactly what it started and a full stop runs in this order: workers (no new claims; in-flight dispatches
 * finish and record their outcomes up to dispatcher.shutdown_deadline_ms), the reconcile schedule (pg-boss),
 * HTTP, the sandbox, the ledger, the pool, the embedded cluster (only one this service owns), the lock.
 * The embedded cluster runs in its own session: a terminal's Ctrl-C reaches this process and the workers,
 * never the database they still need.
 */
import { hostname } from 'node:os';
import { pino } from 'pino';
import { loadConfig, type Config } from '../config/index.js';
import { bindQueries } from '../db/index.js';
import { asActionLedgerError, isActionLedgerError, type ActionLedgerError } from '../core/errors.js';
import { createLogger, RepeatedFailureLog, type Logger } from '../core/log.js';
import { atTerminal, prettyDestination } from '../core/log-terminal.js';
import { embeddedProbeError } from '../embedded/index.js';
import { openRuntime, type Runtime } from '../runtime/index.js';
import { flushTracing, startTracing } from '../core/tracing.js';
import { acquireServiceLock } from '../db/index.js';
import { isConnectionError } from '../core/sqlstate.js';
import { EffectKeyer, Ledger } from '../ledger/index.js';
import { readGateStatus } from '../gate/index.js';
import { readFleetHealth } from '../reconciler/index.js';
import { printRefusal } from './cli-util.js';
import { SERVICE_QUERIES } from './queries.js';
import { WorkerSet, type StopResult } from './workers.js';
import { FleetHttp } from './fleet-http.js';
import { supervisionLog } from './supervision-log.js';
import { readyBanner } from './ready-banner.js';
import { checkDestinations } from '../notifier/index.js';

/** How often a repeating database failure in this process is logged (with the count of the ones between). */
const REPEAT_LOG_INTERVAL_MS = 30_000;

/**
 * A logger whose warn/error lines about a lost database connection go through `repeated` (one line per
 * interval with a count) instead of one line with a stack each: pg-boss reports every failed poll of a
 * dead database as an `error` event, about 7 a second.
 */
export function quietConnectionErrors(log: Logger, repeated: RepeatedFailureLog): Logger {
  return new Proxy(log, {
    get(target, prop) {
      if (prop === 'warn' || prop === 'error') {
        return (obj: unknown, ...rest: unknown[]) => {
          const err = (obj as { err?: unknown } | null)?.err ?? obj;
          if (isConnectionError(err)) return repeated.fail(err, typeof rest[0] === 'string' ? { source: rest[0] } : {});
          const write: (...args: unknown[]) => void = target[prop];
          return write.call(target, obj, ...rest);
        };
      }
      if (prop === 'child')
        return (...args: Parameters<Logger['child']>) =>
          quietConnectionErrors(target.child(...args) as unknown as Logger, repeated);
      const value: unknown = Reflect.get(target, prop, target);
      return typeof value === 'function' ? (value as (...a: unknown[]) => unknown).bind(target) : value;
    },
  });
}

interface Stop {
  name: string;
  run(): Promise<void>;
}

export interface ServiceOptions {
  workers: number | undefined;
  env: NodeJS.ProcessEnv;
}

/** Runs the service until a signal (exit 0) or a failure (exit 1). Never rejects. */
export async function runService(options: ServiceOptions): Promise<number> {
  let config: Config;
  try {
    config = loadConfig(options.env);
  } catch (err) {
    return printRefusal(err);
  }
  // Before the parent's logger exists, so its lines carry the active span's ids (core/log.ts).
  await startTracing(options.env, 'service');
  try {
    return await new Service(config, options).run();
  } finally {
    await flushTracing();
  }
}

/** One run of the service: its start steps, each pushing its stop, then the stops in reverse and the summary. */
class Service {
  readonly #config: Config;
  readonly #options: ServiceOptions;
  /** A person reads stdout: logs for people, and where to go once ready (JSON only otherwise). */
  readonly #terminal: boolean;
  // Synchronous: the final line and the refusal after it come out in order, and nothing is lost at exit.
  readonly #destination: pino.DestinationStream;
  readonly #log: Logger;
  readonly #repeated: RepeatedFailureLog;
  readonly #quietLog: Logger;
  readonly #q: Readonly<typeof SERVICE_QUERIES>;
  readonly #fleet = {
    workers: undefined as WorkerSet | undefined,
    /** Tells the workers what to answer for the fleet (probes, /metrics). */
    http: undefined as FleetHttp | undefined,
    inFlightAtStop: null as number | null,
    result: null as StopResult | null,
    left: null as number | null,
  };
  readonly #stops: Stop[] = [];
  #runtime: Runtime | undefined;
  #orphanWatch: { workerExited(workerId: string): void } | undefined;
  #failure: ActionLedgerError | null = null;
  #startError: unknown;
  #stopReason: string | null = null;
  #stopping = false;
  #wakeStop: () => void = () => undefined;
  readonly #stopRequested = new Promise<void>((resolve) => (this.#wakeStop = resolve));
  #forceStop: () => void = () => undefined;
  readonly #forced = new Promise<void>((resolve) => (this.#forceStop = resolve));

  constructor(config: Config, options: ServiceOptions) {
    this.#config = config;
    this.#options = options;
    this.#terminal = atTerminal(options.env, 1);
    this.#destination = this.#terminal ? prettyDestination(1) : pino.destination({ fd: 1, sync: true });
    this.#log = createLogger({
      level: config.logLevel,
      name: 'service',
      destination: this.#destination,
      cluster: config.cluster,
    });
    this.#repeated = new RepeatedFailureLog(this.#log, 'database unreachable', { intervalMs: REPEAT_LOG_INTERVAL_MS });
    this.#quietLog = quietConnectionErrors(this.#log, this.#repeated);
    this.#q = bindQueries(SERVICE_QUERIES, config.schemaQuoted);
  }

  async run(): Promise<number> {
    this.#listen();
    try {
      const port = await this.#start();
      if (this.#terminal && port !== null && this.#stopReason === null)
        process.stdout.write(readyBanner(this.#config, port));
      await this.#stopRequested;
    } catch (err) {
      const coded = asActionLedgerError(err);
      this.#failure = coded;
      this.#log.error(
        { code: coded.code, details: coded.details, ...(coded.code === 'internal' ? { err } : {}) },
        `start failed: ${coded.message}`,
      );
      this.#startError = err;
    }
    await this.#stopAll();
    const exitCode = this.#report();
    // The refusal last, after everything stopped: the line scripts read.
    if (this.#startError !== undefined) printRefusal(this.#startError);
    return exitCode;
  }

  #requestStop(reason: string, err?: ActionLedgerError): void {
    if (err !== undefined && this.#failure === null) this.#failure = err;
    if (this.#stopReason !== null) return;
    this.#stopReason = reason;
    this.#fleet.workers?.halt();
    this.#wakeStop();
  }

  /** Signals stop the service (a second one forces); nothing unhandled ends the process unannounced. */
  #listen(): void {
    const log = this.#log;
    const onSignal = (signal: NodeJS.Signals): void => {
      if (this.#stopReason === null) {
        log.info({ signal }, 'stopping: workers finish in-flight dispatches (a second signal forces)');
        return this.#requestStop(signal);
      }
      log.warn({ signal }, 'second signal: forcing the stop (workers killed; the database is still stopped)');
      this.#forceStop();
    };
    for (const s of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(s, onSignal);
    process.on('unhandledRejection', (reason) => {
      if (isConnectionError(reason)) return this.#repeated.fail(reason, { source: 'unhandled rejection' });
      const coded = asActionLedgerError(reason);
      log.error({ code: coded.code, err: reason }, 'unhandled rejection');
    });
    process.on('uncaughtException', (err) => {
      const coded = asActionLedgerError(err);
      log.error({ code: coded.code, err }, 'uncaught exception: stopping');
      this.#requestStop('uncaught_exception', coded);
    });
  }

  /** Operations still executing under this service's workers; null when unknown. */
  async #countExecuting(): Promise<number | null> {
    const { workers } = this.#fleet;
    if (this.#runtime === undefined || workers === undefined || workers.pids.length === 0)
      return workers === undefined ? null : 0;
    const { rows } = await this.#runtime.pool
      .query<{ n: number }>(this.#q.executingUnderWorkers, [hostname(), workers.pids])
      .catch(() => ({ rows: [] as { n: number }[] }));
    return rows[0]?.n ?? null;
  }

  /**
   * The start steps in order; each pushes its stop. A signal during start skips the steps after it. Resolves
   * with the port served on (null when stopped before serving).
   */
  async #start(): Promise<number | null> {
    const lock = acquireServiceLock(this.#config.dataDir);
    this.#stops.push({
      name: 'lock',
      run: () => {
        lock.release();
        return Promise.resolve();
      },
    });
    // Notification secrets first: the workers would otherwise each fail on a missing one, and be replaced.
    // With the log: a destination allowed to reach private networks is said so once, here, not by each worker.
    checkDestinations(this.#config.notifications, this.#options.env, this.#log);
    const rt = await this.#openRuntime();
    const ledger = new Ledger(rt.config, rt.pool, new EffectKeyer(rt.effectKeys));
    this.#stops.push({
      name: 'ledger',
      run: () => {
        ledger.stop();
        return Promise.resolve();
      },
    });
    let sandboxEnv: Record<string, string> = {};
    if (rt.config.sandbox.enabled && this.#stopReason === null) {
      const { startDevSandbox } = await import('../sandbox/index.js');
      const sandbox = await startDevSandbox(rt.config, this.#options.env, rt.log, rt.databaseUrl);
      sandboxEnv = sandbox.env;
      this.#stops.push({ name: 'sandbox', run: () => sandbox.stop() });
    }
    const workers = this.#options.workers ?? rt.config.dispatcher.workers;
    let port: number | null = null;
    // With workers, they serve the API (bin/worker-http.ts); with none, this process does.
    if (this.#stopReason === null && workers === 0) {
      const addr = await this.#startHttp(rt, ledger);
      lock.setAddress(`http://${addr.address}:${addr.port}`);
      port = addr.port;
    }
    if (rt.config.reconciler.enabled && this.#stopReason === null) await this.#startReconciler(rt, sandboxEnv, workers);
    if (this.#stopReason === null) {
      const addr = await this.#startWorkers(rt, ledger, sandboxEnv, workers);
      if (addr !== null) lock.setAddress(`http://${addr.address}:${addr.port}`);
      port = addr?.port ?? port;
    }
    return this.#stopReason === null ? port : null;
  }

  /** The runtime (pool, migrations, the embedded cluster under supervision). */
  async #openRuntime(): Promise<Runtime> {
    const log = this.#log;
    const rt = await openRuntime({
      name: 'service',
      config: this.#config,
      env: this.#options.env,
      migrate: true,
      defaultMetrics: false,
      logDestination: this.#destination,
      embedded: {
        supervise: supervisionLog(
          log,
          () => this.#fleet.http?.checkHealth(),
          () => this.#repeated.ok(),
        ),
      },
    });
    this.#runtime = rt;
    this.#stops.push({
      name: 'database',
      run: async () => {
        this.#fleet.left = await this.#countExecuting();
        await rt.close();
      },
    });
    return rt;
  }

  /** What the probes say about the service itself, before they look at the database. */
  #health(rt: Runtime): { error: string | null; stopping: boolean } {
    return { error: embeddedProbeError(rt.embedded?.state), stopping: this.#stopping };
  }

  /** The gauges read at scrape time: the ledger's, the gate's, the fleet's. */
  #beforeScrape(rt: Runtime, ledger: Ledger): () => Promise<void> {
    return () =>
      rt.metrics.readLedger(async () => ({
        ...(await ledger.status()),
        gate: await readGateStatus(rt.pool, rt.config.schemaQuoted),
        fleet: await readFleetHealth(rt.pool, rt.config.schema, rt.config.schemaQuoted),
      }));
  }

  /**
   * With no workers: the API, `/healthz`, `/readyz` and `/metrics`, served by this process alone. The server
   * (fastify, the MCP SDK) is loaded only here: a parent with workers never serves the API itself, and loading it
   * was half a second of CPU at every start.
   */
  async #startHttp(rt: Runtime, ledger: Ledger): Promise<{ address: string; port: number }> {
    const { HttpServer } = await import('../server/index.js');
    const http = new HttpServer({
      runtime: rt,
      ledger,
      env: this.#options.env,
      health: () => this.#health(rt),
      beforeScrape: this.#beforeScrape(rt, ledger),
    });
    await http.start();
    const addr = http.address;
    this.#stops.push({ name: 'http', run: () => http.stop(rt.config.dispatcher.shutdownDeadlineMs) });
    return addr;
  }

  /** The reconciler and its schedule; a node without a dispatch identity and no workers runs none. */
  async #startReconciler(rt: Runtime, sandboxEnv: Record<string, string>, workers: number): Promise<void> {
    try {
      const { openReconciler, OrphanWatch, ReconcileSchedule } = await import('../reconciler/index.js');
      const kit = await openReconciler({ ...rt, log: this.#quietLog }, { ...this.#options.env, ...sandboxEnv });
      this.#stops.push({
        name: 'reconciler',
        run: () => {
          kit.close();
          return Promise.resolve();
        },
      });
      const schedule = new ReconcileSchedule({
        databaseUrl: rt.databaseUrl,
        schema: rt.config.schema,
        cron: rt.config.reconciler.schedule,
        log: this.#quietLog,
        run: () => kit.pass(),
      });
      this.#stops.push({ name: 'schedule', run: () => schedule.stop() });
      await schedule.start();
      // Orphaned claims (a worker that died or stopped heartbeating) are reconciled within seconds, and a start
      // heals at once what a crash left, without waiting for the schedule's next minute.
      const watch = new OrphanWatch({ config: rt.config, pool: rt.pool, log: this.#quietLog, pass: () => kit.pass() });
      this.#orphanWatch = watch;
      this.#stops.push({ name: 'orphan watch', run: () => watch.stop() });
      await watch.start();
    } catch (err) {
      // An API-only node without a dispatch identity: nothing here could read a provider back.
      if (!(isActionLedgerError(err, 'config_invalid') && workers === 0)) throw err;
      rt.log.warn({ err }, 'reconciliation not scheduled on this node: no dispatch identity configured');
    }
  }

  /**
   * The workers, each serving the API and dispatching; resolves once every one serves (with the address), or,
   * with none, once started (null). A worker's refusal to serve (`port_in_use`) fails the start.
   */
  async #startWorkers(
    rt: Runtime,
    ledger: Ledger,
    sandboxEnv: Record<string, string>,
    workers: number,
  ): Promise<{ address: string; port: number } | null> {
    const fleetHttp =
      workers === 0
        ? null
        : new FleetHttp({
            runtime: rt,
            slots: workers,
            health: () => this.#health(rt),
            beforeScrape: this.#beforeScrape(rt, ledger),
            log: this.#log,
          });
    this.#fleet.http = fleetHttp ?? undefined;
    // After the workers' stop (pushed below): the peer sockets' folder outlives them.
    if (fleetHttp !== null) this.#stops.push({ name: 'http', run: () => Promise.resolve(fleetHttp.close()) });
    const set = new WorkerSet({
      count: workers,
      env: {
        ...sandboxEnv,
        // The workers log as this process does: for a person, or JSON.
        ACTIONLEDGER_TERMINAL: this.#terminal ? '1' : '0',
        ACTIONLEDGER_WORKER_DATABASE_URL: rt.databaseUrl,
        ...(fleetHttp === null ? {} : { ACTIONLEDGER_PEER_DIR: fleetHttp.peerDir }),
        ...(rt.embedded === null ? {} : { ACTIONLEDGER_WORKER_EMBEDDED: '1' }),
      },
      log: rt.log,
      canFork: () => (rt.embedded?.state ?? 'running') === 'running',
      onExit: (workerId) => this.#orphanWatch?.workerExited(workerId),
      onFork: (w) => fleetHttp?.forked(w),
      onMessage: (w, slot, m) => fleetHttp?.message(w, slot, m),
    });
    this.#fleet.workers = set;
    this.#stops.push({
      name: 'workers',
      run: async () => {
        this.#fleet.inFlightAtStop = await this.#countExecuting();
        await set.stop(rt.config.dispatcher.shutdownDeadlineMs, this.#forced);
        this.#fleet.result = set.result;
      },
    });
    await set.start();
    const addr =
      fleetHttp === null ? null : await Promise.race([fleetHttp.serving(), this.#stopRequested.then(() => null)]);
    if (this.#stopReason !== null) return null;
    const { http: h } = rt.config;
    rt.log.info({ host: h.host, port: addr?.port ?? h.port, workers }, 'actionledger listening');
    return addr;
  }

  /** Every stop that was pushed, in reverse; a failing one is logged and the next still runs. */
  async #stopAll(): Promise<void> {
    this.#stopping = true;
    for (const stop of this.#stops.reverse()) {
      try {
        await stop.run();
      } catch (err) {
        const coded = asActionLedgerError(err);
        this.#log.error({ code: coded.code, step: stop.name, err }, 'stop step failed; continuing with the next');
      }
    }
  }

  /** The final log line: why it stopped, what was drained, what was left. Returns the exit code. */
  #report(): number {
    const fleet = this.#fleet;
    const failure = this.#failure;
    const exitCode = failure === null ? 0 : 1;
    const r = fleet.result;
    const summary = {
      reason: this.#stopReason ?? 'start_failed',
      exit_code: exitCode,
      ...(failure === null ? {} : { code: failure.code }),
      workers: r?.total ?? 0,
      workers_clean: r?.clean ?? 0,
      workers_killed: r?.killed ?? 0,
      in_flight_at_stop: fleet.inFlightAtStop,
      executing_left: fleet.left,
    };
    if (fleet.workers === undefined) {
      this.#log.info(
        summary,
        `actionledger stopped before its workers started; stopped what it had started (${this.#stops.map((s) => s.name).join(', ') || 'nothing'})`,
      );
      return exitCode;
    }
    const drained =
      fleet.inFlightAtStop === null || fleet.left === null
        ? 'unknown'
        : String(Math.max(0, fleet.inFlightAtStop - fleet.left));
    this.#log.info(
      summary,
      `actionledger stopped: drained ${drained} in-flight operations, ${fleet.left ?? 'unknown'} left executing; ${summary.workers_clean}/${summary.workers} workers exited cleanly`,
    );
    return exitCode;
  }
}
