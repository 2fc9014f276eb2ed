/**
 * One dispatcher in this process (`actionledger dispatcher`, or a fleet worker under `start`): opens the
 * runtime, runs until a signal or the fleet parent's "stop", drains, exits. A fleet worker also serves the HTTP
 * API on the fleet's shared listener (bin/worker-http.ts) from before its dispatcher opens until its stop,
 * which drains the requests in flight beside the dispatches. Loaded only by those commands.
 */
import cluster from 'node:cluster';
import { AggregatorRegistry } from 'prom-client';
import { loadConfig } from '../config/index.js';
import { asActionLedgerError } from '../core/errors.js';
import { atTerminal, prettyDestination } from '../core/log-terminal.js';
import { openRuntime, type Runtime } from '../runtime/index.js';
import { dispatcherPoolFloor, openDispatcher } from '../dispatcher/index.js';
import { WORKER_ID_MESSAGE } from './workers.js';
import { AuditWriter } from '../gate/index.js';
import { NotificationDelivery } from '../notifier/index.js';
import { printRefusal } from './cli-util.js';
import { ParentChannel } from './fleet-ipc.js';
import { serveHttp, type WorkerHttp } from './worker-http.js';

/**
 * Resolves on the first SIGTERM / SIGINT / SIGHUP. The handlers stay installed: a worker under `start` gets a
 * terminal's Ctrl-C and then the parent's SIGTERM, and must not die of the second while it drains (the
 * parent decides when to force, with SIGKILL).
 */
function waitForSignal(): Promise<string> {
  return new Promise((resolve) => {
    let first = true;
    const on = (signal: string): void => {
      if (first) resolve(signal);
      first = false;
    };
    for (const s of ['SIGTERM', 'SIGINT', 'SIGHUP'] as const) process.on(s, on);
  });
}

/** Runs one dispatcher in this process until SIGTERM / SIGINT (or an IPC "stop" from the fleet parent). */
export async function runWorker(env: NodeJS.ProcessEnv, concurrency: number | undefined): Promise<number> {
  let rt: Runtime;
  try {
    const config = loadConfig(env);
    // Each operation in flight holds a connection from its batch's opening to its outcome; plus the LISTEN
    // connection and heartbeats. A smaller pool starves dispatches (and heartbeats) under load.
    // The claim connection is one more, outside the pool (dispatcher/claim-session.ts).
    const slots = concurrency ?? config.dispatcher.concurrency;
    const poolMax = Math.max(config.database.poolMax, slots + 4);
    rt = await openRuntime({
      name: 'dispatcher',
      config,
      poolMax,
      poolMin: dispatcherPoolFloor(slots),
      effectKeys: false,
      ledgerMetrics: false,
      // At a terminal (a fleet worker: as its parent decided), logs for people; otherwise pino's JSON on stdout.
      ...(atTerminal(env, 1) ? { logDestination: prettyDestination(1) } : {}),
      ...(env.ACTIONLEDGER_WORKER_DATABASE_URL === undefined
        ? {}
        : { databaseUrl: env.ACTIONLEDGER_WORKER_DATABASE_URL }),
    });
  } catch (err) {
    return printRefusal(err);
  }
  const log = rt.log;
  // A stray rejection (a pool or LISTEN client failing while the database restarts or stops) is logged with
  // its code; without a handler Node would end the worker in the middle of its drain.
  process.on('unhandledRejection', (reason) =>
    log.warn({ code: asActionLedgerError(reason).code, err: reason }, 'unhandled rejection in dispatcher worker'),
  );
  // Listening from here on: a signal that arrives while the dispatcher starts stops it once started, instead of
  // ending the process with a worker row registered and the runtime left open.
  const stopSignal = waitForSignal();
  const channel = cluster.isWorker ? new ParentChannel() : null;
  let http: WorkerHttp | null = null;
  try {
    if (channel !== null) {
      // The constructor installs the IPC listener that answers the parent's metrics requests: before serving,
      // so a scrape this worker asks the parent for includes this worker.
      new AggregatorRegistry();
      AggregatorRegistry.setRegistries([rt.metrics.registry]);
      http = await serveHttp(rt, env, channel, {
        slot: Number(env.ACTIONLEDGER_WORKER_SLOT ?? '1'),
        peerDir: env.ACTIONLEDGER_PEER_DIR,
        embedded: env.ACTIONLEDGER_WORKER_EMBEDDED === '1',
      });
    }
    const dispatcher = await openDispatcher(rt, env, concurrency === undefined ? {} : { concurrency });
    if (channel !== null) {
      // The parent marks this worker stopped the moment it sees the process exit (so its claims are reconciled
      // at once): by its id, told before it can claim anything, never by a pid another process may hold.
      process.send?.({ type: WORKER_ID_MESSAGE, workerId: dispatcher.workerId });
    }
    // Notifications ride in the same worker processes: their delivery loop claims from its own outbox.
    const notifier = new NotificationDelivery({
      config: rt.config,
      pool: rt.pool,
      audit: new AuditWriter({ config: rt.config, pool: rt.pool, log: rt.log, metrics: rt.metrics }),
      log: rt.log,
      env,
      registry: rt.metrics.registry,
    });
    await dispatcher.start();
    await notifier.start();
    rt.log.info({ concurrency: concurrency ?? rt.config.dispatcher.concurrency }, 'dispatcher running');
    const signal = await stopSignal;
    rt.log.info(
      { signal, in_flight: dispatcher.inFlight, ...(http === null ? {} : { http_in_flight: http.inFlight }) },
      'dispatcher stopping',
    );
    const deadline = rt.config.dispatcher.shutdownDeadlineMs;
    await Promise.all([dispatcher.stop(deadline), notifier.stop(), http?.stop(deadline)]);
    http = null;
    return 0;
  } catch (err) {
    return printRefusal(err);
  } finally {
    await http?.stop(0);
    channel?.close();
    await rt.close();
  }
}
