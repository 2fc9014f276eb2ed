/**
 * `start`: the fleet. The parent opens the database (embedded or configured), migrates, runs the sandbox when
 * enabled, serves /healthz and /metrics (aggregated across workers with prom-client's AggregatorRegistry),
 * and forks N dispatcher workers with node:cluster. SIGTERM: the workers stop claiming, finish in-flight
 * dispatches up to the deadline and exit 0; then the parent stops.
 *
 * `dispatcher`: one worker process on its own (for running workers under another supervisor).
 */
import cluster, { type Worker } from 'node:cluster';
import { parseArgs } from 'node:util';
import { AggregatorRegistry } from 'prom-client';
import { isActionLedgerError } from '../../core/errors.js';
import { loadConfig } from '../../core/config.js';
import { openRuntime, type Runtime } from '../../core/runtime.js';
import { OPERATION_STATUSES } from '../../core/types.js';
import { openDispatcher } from '../../dispatcher/index.js';
import { EffectKeyer, Ledger, ledgerStatus } from '../../ledger/index.js';
import { HttpServer } from '../../server/index.js';
import { printRefusal, usageError, type Command } from '../cli-util.js';

function waitForSignal(): Promise<string> {
  return new Promise((resolve) => {
    process.once('SIGTERM', () => resolve('SIGTERM'));
    process.once('SIGINT', () => resolve('SIGINT'));
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
    rt = await openRuntime({ name: 'dispatcher', config, poolMax, effectKeys: false, ledgerMetrics: false, ...(env.ACTIONLEDGER_WORKER_DATABASE_URL === undefined ? {} : { databaseUrl: env.ACTIONLEDGER_WORKER_DATABASE_URL }) });
  } catch (err) {
    return printRefusal(err);
  }
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
    if (n !== undefined && (!Number.isInteger(n) || n < 1)) return usageError('dispatcher', '--concurrency must be a positive integer', this.usage);
    return runWorker(process.env, n);
  },
};

export const startCommand: Command = {
  summary: 'run the service: database, migrations, sandbox (dev), N dispatcher workers, /healthz and /metrics',
  usage: 'actionledger start [--workers N] [--concurrency N]',
  async run(argv) {
    const { values } = parseArgs({ args: argv, options: { workers: { type: 'string' }, concurrency: { type: 'string' } } });
    const concurrency = values.concurrency === undefined ? undefined : Number(values.concurrency);
    if (cluster.isWorker) return runWorker(process.env, concurrency);
    let rt: Runtime;
    try {
      rt = await openRuntime({ name: 'service', migrate: true, defaultMetrics: false });
    } catch (err) {
      return printRefusal(err);
    }
    const runtime = rt;
    const workers = values.workers === undefined ? runtime.config.dispatcher.workers : Number(values.workers);
    if (!Number.isInteger(workers) || workers < 0) return usageError('start', '--workers must be a non-negative integer', this.usage);
    const ledger = new Ledger(runtime.config, runtime.pool, new EffectKeyer(runtime.effectKeys));
    let sandbox: { env: Record<string, string>; stop(): Promise<void> } | undefined;
    if (runtime.config.sandbox.enabled) {
      const { startDevSandbox } = await import('../../sandbox/dev.js');
      sandbox = await startDevSandbox(runtime.config, process.env, runtime.log);
    }
    const aggregator = new AggregatorRegistry();
    const http = new HttpServer({
      runtime,
      metrics: async () => {
        const own = await runtime.metrics.registry.metrics();
        const fleet = workers > 0 ? await aggregator.clusterMetrics() : '';
        return { contentType: runtime.metrics.registry.contentType, body: `${own}\n${fleet}` };
      },
      beforeScrape: async () => {
        const s = await ledgerStatus(runtime.pool, ledger.q);
        for (const st of OPERATION_STATUSES) runtime.metrics.operations.set({ status: st }, s.by_status[st]);
        runtime.metrics.outboxDepth.set(s.outbox_depth);
        runtime.metrics.oldestPendingAge.set(s.oldest_pending_age_s ?? 0);
      },
    });
    let schedule: { stop(): Promise<void> } | undefined;
    let reconcileKit: { close(): void } | undefined;
    if (runtime.config.reconciler.enabled) {
      try {
        const { openReconciler, ReconcileSchedule } = await import('../../reconciler/index.js');
        const kit = await openReconciler(runtime, { ...process.env, ...sandbox?.env });
        reconcileKit = kit;
        const s = new ReconcileSchedule({ databaseUrl: runtime.databaseUrl, schema: runtime.config.schema, cron: runtime.config.reconciler.schedule, log: runtime.log, run: () => kit.pass() });
        await s.start();
        schedule = s;
      } catch (err) {
        if (isActionLedgerError(err, 'config_invalid') && workers === 0) {
          // An API-only node without a dispatch identity: nothing here could read a provider back.
          runtime.log.warn({ err }, 'reconciliation not scheduled on this node: no dispatch identity configured');
        } else {
          await sandbox?.stop();
          ledger.stop();
          await runtime.close();
          return printRefusal(err);
        }
      }
    }
    const addr = await http.start();
    const children = new Set<Worker>();
    let stopping = false;
    const fork = (): void => {
      const w = cluster.fork({ ...sandbox?.env, ACTIONLEDGER_WORKER_DATABASE_URL: runtime.databaseUrl });
      children.add(w);
      w.on('exit', (code, signal) => {
        children.delete(w);
        if (stopping) return;
        runtime.log.error({ worker_pid: w.process.pid, code, signal }, 'dispatcher worker exited; starting another');
        setTimeout(fork, 1000).unref();
      });
    };
    for (let i = 0; i < workers; i++) fork();
    runtime.log.info({ host: addr.address, port: addr.port, workers }, 'actionledger listening');

    const signal = await waitForSignal();
    stopping = true;
    runtime.log.info({ signal }, 'stopping: workers finish in-flight dispatches');
    await Promise.all(
      [...children].map(
        (w) =>
          new Promise<void>((resolve) => {
            w.once('exit', () => resolve());
            w.process.kill('SIGTERM');
          }),
      ),
    );
    await schedule?.stop();
    reconcileKit?.close();
    await http.stop();
    ledger.stop();
    await sandbox?.stop();
    await runtime.close();
    return 0;
  },
};
