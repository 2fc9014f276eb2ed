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
import { AggregatorRegistry } from 'prom-client';
import { loadConfig } from '../../core/config.js';
import { asActionLedgerError } from '../../core/errors.js';
import { openRuntime, type Runtime } from '../../core/runtime.js';
import { openDispatcher } from '../../dispatcher/index.js';
import { EXIT, intOption, parseCommand, printRefusal, usageError, type Command, type OptionSpec } from '../cli-util.js';
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

const CONCURRENCY: OptionSpec = {
  type: 'string',
  value: 'N',
  description: 'dispatches in flight per worker, 1 to 1024',
  default: 'dispatcher.concurrency from the configuration (16 unless set)',
};

export const dispatcherCommand: Command = {
  name: 'dispatcher',
  summary: 'run one dispatcher worker process',
  notes: 'Runs until SIGTERM or SIGINT, then stops claiming and finishes in-flight dispatches up to the deadline.',
  options: { concurrency: CONCURRENCY },
  examples: ['actionledger dispatcher', 'actionledger dispatcher --concurrency 4'],
  exits: [EXIT.ok, EXIT.refused, EXIT.usage],
  async run(argv) {
    const parsed = parseCommand(this, argv);
    if (typeof parsed === 'number') return parsed;
    const n = intOption(parsed.values, 'concurrency', 1, 1024);
    if ('problem' in n) return usageError(this, n.problem);
    return runWorker(process.env, n.value);
  },
};

export const startCommand: Command = {
  name: 'start',
  summary: 'run the service: database, migrations, sandbox (dev), N dispatcher workers, /healthz, /readyz and /metrics',
  notes:
    'Runs until SIGTERM or SIGINT; the workers drain, then the parent stops the rest (the embedded database last).',
  options: {
    workers: {
      type: 'string',
      value: 'N',
      description: 'dispatcher worker processes, 0 to 64 (0: no dispatching here)',
      default: 'dispatcher.workers from the configuration (2 unless set)',
    },
    concurrency: CONCURRENCY,
  },
  examples: ['actionledger start', 'actionledger start --workers 4 --concurrency 8', 'actionledger start --workers 0'],
  exits: [EXIT.ok, EXIT.refused, EXIT.usage],
  async run(argv) {
    const parsed = parseCommand(this, argv);
    if (typeof parsed === 'number') return parsed;
    const concurrency = intOption(parsed.values, 'concurrency', 1, 1024);
    if ('problem' in concurrency) return usageError(this, concurrency.problem);
    if (cluster.isWorker) return runWorker(process.env, concurrency.value);
    const workers = intOption(parsed.values, 'workers', 0, 64);
    if ('problem' in workers) return usageError(this, workers.problem);
    return runService({ workers: workers.value, env: process.env });
  },
};
