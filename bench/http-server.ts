/**
 * The API server of bench/http.ts, in a worker thread: its own event loop and its own pool, as `npm start`
 * runs it beside its callers, so the client's loop does not pay for the server's work (or the reverse).
 * Receives the database URL and the raw configuration; answers with the port it listens on. With `bare`, it
 * serves the HTTP floor instead ({@link serveBare}).
 */
import { readlinkSync } from 'node:fs';
import { createServer } from 'node:http';
import { parentPort, workerData } from 'node:worker_threads';
import { compileConfig } from '../config/index.js';
import { createPool } from '../db/db.js';
import { createLogger } from '../core/log.js';
import type { TrustedContext } from '../core/types.js';
import { AuditWriter, Gate } from '../gate/index.js';
import { PrincipalStore } from '../principals/index.js';
import { buildApi } from '../server/api/app.js';
import { benchLedgerWith } from './http-config.js';

const { url, raw, bare } = workerData as {
  url: string;
  raw: Record<string, unknown>;
  bare?: 'plain' | 'authenticated';
};
const config = compileConfig(raw, { DATABASE_URL: url });
const pool = createPool(url, { max: 20, statementTimeoutMs: 60_000, applicationName: 'bench-api' });
const log = createLogger({ level: 'error', name: 'bench-api', destination: process.stderr });
const ledger = benchLedgerWith(config, pool);
// This thread's Linux task id (`/proc/thread-self` is `<pid>/task/<tid>`), so the bench can tell its CPU apart.
const tid = Number(/task\/(\d+)$/.exec(readlinkSync('/proc/thread-self'))?.[1] ?? NaN);
if (bare !== undefined) await serveBare(bare === 'authenticated');
else await serveApi();

/**
 * The HTTP floor: node:http, `JSON.parse` of the body, `Ledger#reserve` with the context the body names, the
 * reservation's JSON back. No authentication, request window, schema, audit or error mapping: the least any
 * HTTP reservation does on this machine. With `authenticate`, the bearer token is first authenticated and
 * counted in the fleet-wide request window by the API's own statement (`PrincipalStore#authenticate`): the
 * least an authenticated reservation does.
 */
async function serveBare(authenticate: boolean): Promise<void> {
  const principals = new PrincipalStore(config, pool);
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as {
        context: TrustedContext;
        tool: string;
        arguments: unknown;
      };
      const token = /^Bearer (.+)$/.exec(req.headers.authorization ?? '')?.[1] ?? '';
      (authenticate ? principals.authenticate(token) : Promise.resolve())
        .then(() => ledger.reserve(body.context, body.tool, body.arguments))
        .then(
          (r) => {
            res.writeHead(200, { 'content-type': 'application/json' });
            res.end(JSON.stringify(r));
          },
          (err: unknown) => {
            res.writeHead(500, { 'content-type': 'application/json' });
            res.end(JSON.stringify({ ok: false, error: String(err) }));
          },
        );
    });
  });
  server.keepAliveTimeout = 60_000;
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  parentPort?.postMessage({ port: typeof address === 'object' && address !== null ? address.port : 0, tid });
  onStop(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });
}

async function serveApi(): Promise<void> {
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
  parentPort?.postMessage({ port: typeof address === 'object' && address !== null ? address.port : 0, tid });
  onStop(() => app.close());
}

/** On `stop`: closes the server, then the ledger and the pool, and answers `stopped`. */
function onStop(close: () => Promise<unknown>): void {
  parentPort?.on('message', (m: unknown) => {
    if (m !== 'stop') return;
    void close().then(async () => {
      ledger.stop();
      await pool.end();
      parentPort?.postMessage('stopped');
    });
  });
}
