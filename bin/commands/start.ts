/** `start`: the service (database, migrations, HTTP health and metrics). */
import { openRuntime } from '../../core/runtime.js';
import { EffectKeyer, Ledger, ledgerStatus } from '../../ledger/index.js';
import { HttpServer } from '../../server/index.js';
import { OPERATION_STATUSES } from '../../core/types.js';
import { printRefusal, type Command } from '../cli-util.js';

export const startCommand: Command = {
  summary: 'run the service: embedded or configured PostgreSQL, migrations, /healthz and /metrics',
  usage: 'actionledger start',
  async run() {
    let rt;
    try {
      rt = await openRuntime({ name: 'service', migrate: true });
    } catch (err) {
      return printRefusal(err);
    }
    const runtime = rt;
    const ledger = new Ledger(runtime.config, runtime.pool, new EffectKeyer(runtime.effectKeys));
    const http = new HttpServer({
      runtime,
      beforeScrape: async () => {
        const s = await ledgerStatus(runtime.pool, ledger.q);
        for (const st of OPERATION_STATUSES) runtime.metrics.operations.set({ status: st }, s.by_status[st]);
        runtime.metrics.outboxDepth.set(s.outbox_depth);
        runtime.metrics.oldestPendingAge.set(s.oldest_pending_age_s ?? 0);
      },
    });
    const addr = await http.start();
    runtime.log.info({ host: addr.address, port: addr.port }, 'actionledger listening');
    await new Promise<void>((resolve) => {
      const stop = (signal: string): void => {
        runtime.log.info({ signal }, 'stopping');
        resolve();
      };
      process.once('SIGTERM', () => stop('SIGTERM'));
      process.once('SIGINT', () => stop('SIGINT'));
    });
    await http.stop();
    ledger.stop();
    await runtime.close();
    return 0;
  },
};
