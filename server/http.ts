/**
 * The HTTP surface of `npm start` for now: `GET /healthz` (the process is sound: database reachable, embedded
 * cluster not down), `GET /readyz` (healthy and not stopping: route work here) and `GET /metrics`.
 * start()/stop() follow the service contract: stop is safe before start and safe to repeat.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { ActionLedgerError } from '../core/errors.js';
import type { Runtime } from '../core/runtime.js';
import type { Registry } from 'prom-client';

export interface HttpServerOptions {
  runtime: Runtime;
  /** Collects the metrics to expose (the fleet aggregates its workers'); defaults to this process's registry. */
  metrics?: () => Promise<{ contentType: string; body: string }>;
  /** Refreshes the gauges read at scrape time. */
  beforeScrape?: () => Promise<void>;
  /**
   * The service's own view, checked before the database: an error code (`embedded_database_failed` while
   * the embedded cluster restarts or after it failed) makes both probes 503 without a query.
   */
  health?: () => { error: string | null; stopping: boolean };
}

function sendJson(res: import('node:http').ServerResponse, status: number, body: Record<string, unknown>): void {
  res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body));
}

export class HttpServer {
  readonly #options: HttpServerOptions;
  #server: Server | undefined;

  constructor(options: HttpServerOptions) {
    this.#options = options;
  }

  async start(): Promise<AddressInfo> {
    if (this.#server !== undefined) return this.#server.address() as AddressInfo;
    const { runtime } = this.#options;
    const registry: Registry = runtime.metrics.registry;
    const metrics =
      this.#options.metrics ??
      (async () => ({ contentType: registry.contentType, body: await runtime.metrics.exposition() }));
    const server = createServer((req, res) => {
      const path = (req.url ?? '/').split('?')[0];
      if (req.method === 'GET' && (path === '/healthz' || path === '/readyz')) {
        const own = this.#options.health?.() ?? { error: null, stopping: false };
        if (own.error !== null) return sendJson(res, 503, { ok: false, error: own.error });
        if (path === '/readyz' && own.stopping) return sendJson(res, 503, { ok: false, error: 'stopping' });
        runtime.pool
          .query('SELECT 1')
          .then(() => sendJson(res, 200, { ok: true }))
          .catch(() => sendJson(res, 503, { ok: false, error: 'database_unavailable' }));
        return;
      }
      if (req.method === 'GET' && path === '/metrics') {
        (this.#options.beforeScrape ?? (() => Promise.resolve()))()
          .catch((err: unknown) => runtime.log.warn({ err }, 'scrape-time gauges failed'))
          .then(metrics)
          .then(({ contentType, body }) => res.writeHead(200, { 'content-type': contentType }).end(body))
          .catch((err: unknown) => {
            runtime.log.error({ err }, 'metrics failed');
            res.writeHead(500).end();
          });
        return;
      }
      res
        .writeHead(404, { 'content-type': 'application/json' })
        .end('{"ok":false,"error":"not_found","message":"no such route"}');
    });
    const port = runtime.config.http.port;
    await new Promise<void>((resolve, reject) => {
      server.once('error', (err: NodeJS.ErrnoException) => {
        if (err.code !== 'EADDRINUSE' && err.code !== 'EACCES') return reject(err);
        reject(
          new ActionLedgerError(
            'port_in_use',
            `port ${port} (http.port / PORT) on ${runtime.config.http.host} is ${err.code === 'EACCES' ? 'not permitted' : 'in use'}; set http.port in the configuration or PORT in the environment`,
            {
              details: { port, setting: 'http.port', env: 'PORT' },
            },
          ),
        );
      });
      server.listen(port, runtime.config.http.host, () => resolve());
    });
    this.#server = server;
    return server.address() as AddressInfo;
  }

  async stop(): Promise<void> {
    const server = this.#server;
    this.#server = undefined;
    if (server === undefined) return;
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}
