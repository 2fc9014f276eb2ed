/**
 * The API server of bench/http.ts, in a worker thread: its own event loop and its own pool, as `npm start`
 * runs it beside its callers, so the client's loop does not pay for the server's work (or the reverse).
 * Receives the database URL and the raw configuration; answers with the port it listens on.
 */
import { readlinkSync } from 'node:fs';
import { parentPort, workerData } from 'node:worker_threads';
import { compileConfig } from '../core/config.js';
import { createPool } from '../core/db.js';
import { createLogger } from '../core/log.js';
import { AuditWriter, Gate } from '../gate/index.js';
import { PrincipalStore } from '../principals/index.js';
import { buildApi } from '../server/api/app.js';
import { benchLedgerWith } from './http-config.js';

const { url, raw } = workerData as { url: string; raw: Record<string, unknown> };
const config = compileConfig(raw, { DATABASE_URL: url });
const pool = createPool(url, { max: 20, statementTimeoutMs: 60_000, applicationName: 'bench-api' });
const log = createLogger({ level: 'error', name: 'bench-api', destination: process.stderr });
const ledger = benchLedgerWith(config, pool);
const audit = new AuditWriter({ config, pool, log });
const gate = new Gate({ config, pool, ledger, log });
const { app } = await buildApi({
  config,
  pool,
  log,
  gate,
  ledger,
  principals: new PrincipalStore(config, pool, audit),
  audit,
});
await app.listen({ host: '127.0.0.1', port: 0 });
const address = app.server.address();
// This thread's Linux task id (`/proc/thread-self` is `<pid>/task/<tid>`), so the bench can tell its CPU apart.
const tid = Number(/task\/(\d+)$/.exec(readlinkSync('/proc/thread-self'))?.[1] ?? NaN);
parentPort?.postMessage({ port: typeof address === 'object' && address !== null ? address.port : 0, tid });
parentPort?.on('message', (m: unknown) => {
  if (m !== 'stop') return;
  void app.close().then(async () => {
    ledger.stop();
    await pool.end();
    parentPort?.postMessage('stopped');
  });
});
