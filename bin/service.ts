/**
 * The parent process of `actionledger start`. States:
 *
 *   starting ──▶ running ──(SIGINT / SIGTERM / SIGHUP, or the embedded cluster failed)──▶ stopping ──▶ exit
 *   starting ──(a step failed, or a signal)──▶ stopping (only what started) ──▶ exit 1 (0 for a signal)
 *   stopping ──(a second signal)──▶ forced: workers get SIGKILL, every later step still runs, the cluster last
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
import { AggregatorRegistry } from 'prom-client';
import { loadConfig, type Config } from '../core/config.js';
import { bindQueries } from '../core/db.js';
import { asActionLedgerError, isActionLedgerError, type ActionLedgerError } from '../core/errors.js';
import { createLogger, RepeatedFailureLog, type Logger } from '../core/log.js';
import { openRuntime, type Runtime } from '../core/runtime.js';
import { acquireServiceLock } from '../core/service-lock.js';
import { isConnectionError } from '../core/sqlstate.js';
import { OPERATION_STATUSES } from '../core/types.js';
import { EffectKeyer, Ledger } from '../ledger/index.js';
import { HttpServer } from '../server/index.js';
import { printRefusal } from './cli-util.js';
import { SERVICE_QUERIES } from './queries.js';
import { WorkerSet, type StopResult } from './workers.js';

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
  // Synchronous: the final line and the refusal after it come out in order, and nothing is lost at exit.
  const destination = pino.destination({ fd: 1, sync: true });
  const log = createLogger({ level: config.logLevel, name: 'service', destination });
  const repeated = new RepeatedFailureLog(log, 'database unreachable', { intervalMs: REPEAT_LOG_INTERVAL_MS });
  const quietLog = quietConnectionErrors(log, repeated);

  const fleet = {
    workers: undefined as WorkerSet | undefined,
    inFlightAtStop: null as number | null,
    result: null as StopResult | null,
    left: null as number | null,
  };
  let failure: ActionLedgerError | null = null;
  let startError: unknown;
  let stopReason: string | null = null;
  let wakeStop: () => void = () => undefined;
  const stopRequested = new Promise<void>((resolve) => (wakeStop = resolve));
  let forceStop: () => void = () => undefined;
  const forced = new Promise<void>((resolve) => (forceStop = resolve));
  const requestStop = (reason: string, err?: ActionLedgerError): void => {
    if (err !== undefined && failure === null) failure = err;
    if (stopReason !== null) return;
    stopReason = reason;
    fleet.workers?.halt();
    wakeStop();
  };
  const onSignal = (signal: NodeJS.Signals): void => {
    if (stopReason === null) {
      log.info({ signal }, 'stopping: workers finish in-flight dispatches (a second signal forces)');
      return requestStop(signal);
    }
    log.warn({ signal }, 'second signal: forcing the stop (workers killed; the database is still stopped)');
    forceStop();
  };
  for (const s of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(s, onSignal);
  process.on('unhandledRejection', (reason) => {
    if (isConnectionError(reason)) return repeated.fail(reason, { source: 'unhandled rejection' });
    const coded = asActionLedgerError(reason);
    log.error({ code: coded.code, err: reason }, 'unhandled rejection');
  });
  process.on('uncaughtException', (err) => {
    const coded = asActionLedgerError(err);
    log.error({ code: coded.code, err }, 'uncaught exception: stopping');
    requestStop('uncaught_exception', coded);
  });

  const stops: Stop[] = [];
  let runtime: Runtime | undefined;
  let stopping = false;
  const q = bindQueries(SERVICE_QUERIES, config.schemaQuoted);
  const countExecuting = async (): Promise<number | null> => {
    if (runtime === undefined || fleet.workers === undefined || fleet.workers.pids.length === 0)
      return fleet.workers === undefined ? null : 0;
    const { rows } = await runtime.pool
      .query<{ n: number }>(q.executingUnderWorkers, [hostname(), fleet.workers.pids])
      .catch(() => ({ rows: [] as { n: number }[] }));
    return rows[0]?.n ?? null;
  };

  try {
    const lock = acquireServiceLock(config.dataDir);
    stops.push({
      name: 'lock',
      run: () => {
        lock.release();
        return Promise.resolve();
      },
    });
    runtime = await openRuntime({
      name: 'service',
      config,
      env: options.env,
      migrate: true,
      defaultMetrics: false,
      logDestination: destination,
      embedded: {
        supervise: {
          onDied: (info) =>
            log.error(
              {
                code: 'embedded_database_failed',
                postmaster_pid: info.pid,
                exit_code: info.code,
                signal: info.signal,
                last_lines: info.tail.slice(-5),
              },
              'embedded PostgreSQL died; restarting it',
            ),
          onRestarted: (info) => {
            log.warn({ postmaster_pid: info.pid, tries: info.tries }, 'embedded PostgreSQL restarted');
            repeated.ok();
          },
          onFailed: (err) => {
            log.error({ code: err.code, details: err.details }, err.message);
            requestStop('embedded_database_failed', err);
          },
        },
      },
    });
    const rt = runtime;
    stops.push({
      name: 'database',
      run: async () => {
        fleet.left = await countExecuting();
        await rt.close();
      },
    });
    const ledger = new Ledger(rt.config, rt.pool, new EffectKeyer(rt.effectKeys));
    stops.push({
      name: 'ledger',
      run: () => {
        ledger.stop();
        return Promise.resolve();
      },
    });
    let sandboxEnv: Record<string, string> = {};
    if (rt.config.sandbox.enabled && stopReason === null) {
      const { startDevSandbox } = await import('../sandbox/index.js');
      const sandbox = await startDevSandbox(rt.config, options.env, rt.log, rt.databaseUrl);
      sandboxEnv = sandbox.env;
      stops.push({ name: 'sandbox', run: () => sandbox.stop() });
    }
    const workers = options.workers ?? rt.config.dispatcher.workers;
    const embeddedState = (): string => rt.embedded?.state ?? 'running';
    const aggregator = new AggregatorRegistry();
    const http = new HttpServer({
      runtime: rt,
      health: () => ({
        error:
          embeddedState() === 'failed'
            ? 'embedded_database_failed'
            : embeddedState() === 'restarting'
              ? 'database_unavailable'
              : null,
        stopping,
      }),
      metrics: async () => {
        const own = await rt.metrics.registry.metrics();
        const fleetMetrics = workers > 0 ? await aggregator.clusterMetrics() : '';
        return { contentType: rt.metrics.registry.contentType, body: `${own}\n${fleetMetrics}` };
      },
      beforeScrape: async () => {
        const s = await ledger.status();
        for (const st of OPERATION_STATUSES) rt.metrics.operations.set({ status: st }, s.by_status[st]);
        rt.metrics.outboxDepth.set(s.outbox_depth);
        rt.metrics.oldestPendingAge.set(s.oldest_pending_age_s ?? 0);
      },
    });
    if (stopReason === null) {
      const addr = await http.start();
      stops.push({ name: 'http', run: () => http.stop() });
      lock.setAddress(`http://${addr.address}:${addr.port}`);
    }
    if (rt.config.reconciler.enabled && stopReason === null) {
      try {
        const { openReconciler, ReconcileSchedule } = await import('../reconciler/index.js');
        const kit = await openReconciler({ ...rt, log: quietLog }, { ...options.env, ...sandboxEnv });
        stops.push({
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
          log: quietLog,
          run: () => kit.pass(),
        });
        stops.push({ name: 'schedule', run: () => schedule.stop() });
        await schedule.start();
      } catch (err) {
        // An API-only node without a dispatch identity: nothing here could read a provider back.
        if (!(isActionLedgerError(err, 'config_invalid') && workers === 0)) throw err;
        rt.log.warn({ err }, 'reconciliation not scheduled on this node: no dispatch identity configured');
      }
    }
    if (stopReason === null) {
      const set = new WorkerSet({
        env: { ...sandboxEnv, ACTIONLEDGER_WORKER_DATABASE_URL: rt.databaseUrl },
        log: rt.log,
        canFork: () => embeddedState() === 'running',
      });
      fleet.workers = set;
      stops.push({
        name: 'workers',
        run: async () => {
          fleet.inFlightAtStop = await countExecuting();
          fleet.result = await set.stop(rt.config.dispatcher.shutdownDeadlineMs, forced);
        },
      });
      set.start(workers);
      const { http: h } = rt.config;
      rt.log.info({ host: h.host, port: h.port, workers }, 'actionledger listening');
    }
    await stopRequested;
  } catch (err) {
    const coded = asActionLedgerError(err);
    failure = coded;
    log.error(
      { code: coded.code, details: coded.details, ...(coded.code === 'internal' ? { err } : {}) },
      `start failed: ${coded.message}`,
    );
    startError = err;
  }

  stopping = true;
  for (const stop of stops.reverse()) {
    try {
      await stop.run();
    } catch (err) {
      const coded = asActionLedgerError(err);
      log.error({ code: coded.code, step: stop.name, err }, 'stop step failed; continuing with the next');
    }
  }
  const exitCode = failure === null ? 0 : 1;
  const r = fleet.result;
  const summary = {
    reason: stopReason ?? 'start_failed',
    exit_code: exitCode,
    ...(failure === null ? {} : { code: failure.code }),
    workers: r?.total ?? 0,
    workers_clean: r?.clean ?? 0,
    workers_killed: r?.killed ?? 0,
    in_flight_at_stop: fleet.inFlightAtStop,
    executing_left: fleet.left,
  };
  if (fleet.workers === undefined) {
    log.info(
      summary,
      `actionledger stopped before its workers started; stopped what it had started (${stops.map((s) => s.name).join(', ') || 'nothing'})`,
    );
  } else {
    const drained =
      fleet.inFlightAtStop === null || fleet.left === null
        ? 'unknown'
        : String(Math.max(0, fleet.inFlightAtStop - fleet.left));
    log.info(
      summary,
      `actionledger stopped: drained ${drained} in-flight operations, ${fleet.left ?? 'unknown'} left executing; ${summary.workers_clean}/${summary.workers} workers exited cleanly`,
    );
  }
  // The refusal last, after everything stopped: the line scripts read.
  if (startError !== undefined) printRefusal(startError);
  return exitCode;
}
