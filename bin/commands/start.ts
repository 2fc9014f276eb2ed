/**
 * `start`: the fleet. The parent (bin/service.ts) opens the database (embedded or configured), migrates, runs
 * the sandbox when enabled and the reconcile schedule, and forks N workers with node:cluster; each worker serves
 * the HTTP API, MCP, the console, /healthz, /readyz and /metrics on the shared listener (/metrics aggregated
 * across the fleet by the parent) and runs a dispatcher. With `--workers 0` the parent serves the API alone.
 * SIGINT / SIGTERM: the workers answer the requests in flight, stop claiming, finish in-flight dispatches up to
 * the deadline and exit 0; then the parent stops the rest, the embedded cluster last.
 *
 * `dispatcher`: one worker process on its own (for running workers under another supervisor).
 */
import cluster from 'node:cluster';
import { EXIT, intOption, parseCommand, usageError, type Command, type OptionSpec } from '../cli-util.js';
import { load } from './load.js';

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
    return (await load.worker()).runWorker(process.env, n.value);
  },
};

export const startCommand: Command = {
  name: 'start',
  summary: 'run the service: database, migrations, sandbox (dev), N workers each serving the API and dispatching',
  notes:
    'Runs until SIGTERM or SIGINT; the workers drain, then the parent stops the rest (the embedded database last).',
  options: {
    workers: {
      type: 'string',
      value: 'N',
      description: 'worker processes, each serving the API and dispatching, 0 to 64 (0: the API only, no dispatching)',
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
    if (cluster.isWorker) return (await load.worker()).runWorker(process.env, concurrency.value);
    const workers = intOption(parsed.values, 'workers', 0, 64);
    if ('problem' in workers) return usageError(this, workers.problem);
    return (await load.service()).runService({ workers: workers.value, env: process.env });
  },
};
