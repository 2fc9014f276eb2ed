/**
 * `start`: the fleet. The parent (bin/service.ts) opens the database (embedded or configured), migrates, runs
 * the sandbox when enabled, serves /healthz, /readyz and /metrics (aggregated across workers with
 * prom-client's AggregatorRegistry), and forks N dispatcher workers with node:cluster. SIGINT / SIGTERM: the
 * workers stop claiming, finish in-flight dispatches up to the deadline and exit 0; then the parent stops
 * the rest, the embedded cluster last.
 *
 * `dispatcher`: one worker process on its own (for running workers under another supervisor).
 */
import cluster from 'node:cluster';
import { parseArgs } from 'node:util';
import { AggregatorRegistry } from 'prom-client';
import { loadConfig } from '../../core/config.js';
import { asActionLedgerError } from '../../core/errors.js';
import { openRuntime, type Runtime } from '../../core/runtime.js';
import { openDispatcher } from '../../dispatcher/index.js';
import { printRefusal, usageError, type Command } from '../cli-util.js';
import { runService } from '../service.js';

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
async function runWorker(env: NodeJS.ProcessEnv, concurrency: number | undefined): Promise<number> {
  let rt: Runtime;
  try {
    const config = loadConfig(env);
    // Each operation in flight holds a connection from its final check to its outcome; plus the LISTEN
    // connection, claims and heartbeats. A smaller pool starves dispatches (and heartbeats) under load.
    const poolMax = Math.max(config.database.poolMax, (concurrency ?? config.dispatcher.concurrency) + 4);
    rt = await openRuntime({
      name: 'dispatcher',
      config,
      poolMax,
      effectKeys: false,
      ledgerMetrics: false,
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
  try {
    const dispatcher = await openDispatcher(rt, env, concurrency === undefined ? {} : { concurrency });
    if (cluster.isWorker) {
      // The constructor installs the IPC listener that answers the parent's metrics requests.
      new AggregatorRegistry();
      AggregatorRegistry.setRegistries([rt.metrics.registry]);
    }
    await dispatcher.start();
    rt.log.info({ concurrency: concurrency ?? rt.config.dispatcher.concurrency }, 'dispatcher running');
    const signal = await waitForSignal();
    rt.log.info({ signal, in_flight: dispatcher.inFlight }, 'dispatcher stopping');
    await dispatcher.stop(rt.config.dispatcher.shutdownDeadlineMs);
    return 0;
  } catch (err) {
    return printRefusal(err);
  } finally {
    await rt.close();
  }
}

export const dispatcherCommand: Command = {
  summary: 'run one dispatcher worker process',
  usage: 'actionledger dispatcher [--concurrency N]',
  async run(argv) {
    const { values } = parseArgs({ args: argv, options: { concurrency: { type: 'string' } } });
    const n = values.concurrency === undefined ? undefined : Number(values.concurrency);
    if (n !== undefined && (!Number.isInteger(n) || n < 1))
      return usageError('dispatcher', '--concurrency must be a positive integer', this.usage);
    return runWorker(process.env, n);
  },
};

export const startCommand: Command = {
  summary: 'run the service: database, migrations, sandbox (dev), N dispatcher workers, /healthz, /readyz and /metrics',
  usage: 'actionledger start [--workers N] [--concurrency N]',
  async run(argv) {
    const { values } = parseArgs({
      args: argv,
      options: { workers: { type: 'string' }, concurrency: { type: 'string' } },
    });
    const concurrency = values.concurrency === undefined ? undefined : Number(values.concurrency);
    if (cluster.isWorker) return runWorker(process.env, concurrency);
    const workers = values.workers === undefined ? undefined : Number(values.workers);
    if (workers !== undefined && (!Number.isInteger(workers) || workers < 0))
      return usageError('start', '--workers must be a non-negative integer', this.usage);
    return runService({ workers, env: process.env });
  },
};
