/**
 * The HTTP surface of `npm start` for now: `GET /healthz` (database reachable) and `GET /metrics`.
 * start()/stop() follow the service contract: stop is safe before start and safe to repeat.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Runtime } from '../core/runtime.js';
import type { Registry } from 'prom-client';

export interface HttpServerOptions {
  runtime: Runtime;
  /** Collects the metrics to expose (the fleet aggregates its workers'); defaults to this process's registry. */
  metrics?: () => Promise<{ contentType: string; body: string }>;
  /** Refreshes the gauges read at scrape time. */
  beforeScrape?: () => Promise<void>;
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
      this.#options.metrics ?? (async () => ({ contentType: registry.contentType, body: await registry.metrics() }));
    const server = createServer((req, res) => {
      const path = (req.url ?? '/').split('?')[0];
      if (req.method === 'GET' && path === '/healthz') {
        runtime.pool
          .query('SELECT 1')
          .then(() => {
            res.writeHead(200, { 'content-type': 'application/json' }).end('{"ok":true}');
          })
          .catch(() => {
            res.writeHead(503, { 'content-type': 'application/json' }).end('{"ok":false,"error":"database_unavailable"}');
          });
        return;
      }
      if (req.method === 'GET' && path === '/metrics') {
        (this.#options.beforeScrape ?? (async () => undefined))()
          .catch((err: unknown) => runtime.log.warn({ err }, 'scrape-time gauges failed'))
          .then(metrics)
          .then(({ contentType, body }) => res.writeHead(200, { 'content-type': contentType }).end(body))
          .catch((err: unknown) => {
            runtime.log.error({ err }, 'metrics failed');
            res.writeHead(500).end();
          });
        return;
      }
      res.writeHead(404, { 'content-type': 'application/json' }).end('{"ok":false,"error":"not_found","message":"no such route"}');
    });
    this.#server = server;
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(runtime.config.http.port, runtime.config.http.host, () => resolve());
    });
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
