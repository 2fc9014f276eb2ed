/**
 * The HTTP listener of `actionledger start`: the API (server/api/), MCP, the console, `/healthz`, `/readyz`
 * and `/metrics`, on one port for the whole fleet. In a fleet every worker process runs one of these on
 * node:cluster's shared listener (`/metrics` and the probes' view of the service come from the fleet's parent:
 * the `metrics` and `health` options); with `--workers 0` the parent runs the only one. Loopback by default;
 * another address needs TLS (`http.tls`) unless the configuration explicitly allows plain HTTP
 * (config/api.ts). start()/stop() follow the service contract: stop is safe before start and safe to repeat.
 *
 * Stopping drains: the listener stops accepting, idle connections are closed, every answer from then on says
 * `connection: close`, and the requests in flight are waited for (up to the stop's deadline; an MCP event
 * stream, open by design, is not waited for) before the app closes and cuts what is left.
 */
import { readFileSync } from 'node:fs';
import type { IncomingMessage, Server as NodeServer, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { hostname } from 'node:os';
import type { FastifyInstance } from 'fastify';
import { Counter, type Registry } from 'prom-client';
import { ActionLedgerError } from '../core/errors.js';
import type { Runtime } from '../runtime/index.js';
import { Compensator } from '../compensator/index.js';
import { AuditWriter, Gate } from '../gate/index.js';
import type { Ledger } from '../ledger/index.js';
import { PrincipalStore } from '../principals/index.js';
import { Review } from '../reconciler/index.js';
import { buildApi } from './api/app.js';
import { SlackInteractions } from '../notifier/index.js';
import type { ApiDeps } from './api/types.js';
import { WriteProbe } from './write-probe.js';
import { Service } from '../core/service.js';
import { forwardingHandler, listenForPeers, type McpPeers } from './mcp/peers.js';

/** How long a stop waits for the requests in flight when its caller names no deadline. */
export const DRAIN_MS = 10_000;

export interface HttpServerOptions {
  runtime: Runtime;
  ledger: Ledger;
  /**
   * The gate the API calls. Defaults to one without business validators or resource resolvers (they are
   * code): a tool that names one is then refused `config_invalid` at call time. Embed the API with your own
   * Gate to run them.
   */
  gate?: Gate;
  /** Collects the metrics to expose (the fleet aggregates its workers'); defaults to this process's registry. */
  metrics?: (o: { openMetrics: boolean }) => Promise<{ contentType: string; body: string }>;
  /** Refreshes the gauges read at scrape time. */
  beforeScrape?: () => Promise<void>;
  /** See {@link ApiDeps.health}. */
  health?: () => { error: string | null; stopping: boolean };
  /** Where the Slack destinations' and the console OIDC client's secrets are read (their names are configured). */
  env?: NodeJS.ProcessEnv;
  /**
   * In a fleet worker: this process's place among its peers, so MCP sessions work whichever worker a
   * connection reaches (server/mcp/peers.ts).
   */
  mcpPeers?: McpPeers;
}

const SERVED = 'actionledger_http_requests_served_total';

export class HttpServer extends Service<[drainMs?: number]> {
  readonly #options: HttpServerOptions;
  #app: FastifyInstance | undefined;
  #peerServer: NodeServer | undefined;
  readonly #writes: WriteProbe;
  readonly #served: Counter;
  /** The requests in flight, and whether a stop is draining them. */
  readonly #inFlight = new Set<ServerResponse>();
  #draining = false;
  #drained: () => void = () => undefined;

  constructor(options: HttpServerOptions) {
    super();
    this.#options = options;
    const rt = options.runtime;
    this.#writes = new WriteProbe({
      pool: rt.pool,
      schemaQuoted: rt.config.schemaQuoted,
      intervalMs: rt.config.http.writeProbeIntervalMs,
      log: rt.log,
      registry: rt.metrics.registry,
    });
    this.#served = servedCounter(rt.metrics.registry);
  }

  /** Whether the database takes writes, as this server's probe last saw it. */
  get writes(): WriteProbe {
    return this.#writes;
  }

  /** The API's dependencies, built from the runtime. */
  #deps(): ApiDeps {
    const { runtime: rt, ledger } = this.#options;
    const audit = new AuditWriter({ config: rt.config, pool: rt.pool, log: rt.log, metrics: rt.metrics });
    const gate =
      this.#options.gate ??
      new Gate({
        config: rt.config,
        pool: rt.pool,
        ledger,
        withoutValidators: true,
        withoutResolvers: true,
        log: rt.log,
        metrics: rt.metrics,
      });
    // A compensation a reviewer asks for is minted through this process's ledger.
    const compensator = new Compensator({
      config: rt.config,
      pool: rt.pool,
      ledger,
      log: rt.log,
      actor: `api:${hostname()}:${process.pid}`,
    });
    const principals = new PrincipalStore(rt.config, rt.pool, audit);
    const slackConfigured = [...rt.config.notifications.destinations.values()].some((d) => d.type === 'slack');
    return {
      config: rt.config,
      pool: rt.pool,
      log: rt.log,
      gate,
      ledger,
      principals,
      ...(slackConfigured
        ? {
            slack: new SlackInteractions({
              config: rt.config,
              pool: rt.pool,
              gate,
              principals,
              audit,
              log: rt.log,
              env: this.#options.env ?? {},
              registry: rt.metrics.registry,
            }),
          }
        : {}),
      audit,
      ...(this.#options.env === undefined ? {} : { env: this.#options.env }),
      review: new Review(rt.config, rt.pool, compensator),
      metrics: rt.metrics,
      ...(this.#options.metrics === undefined ? {} : { exposition: this.#options.metrics }),
      ...(this.#options.beforeScrape === undefined ? {} : { beforeScrape: this.#options.beforeScrape }),
      ...(this.#options.health === undefined ? {} : { health: this.#options.health }),
      writes: this.#writes,
      ...(this.#options.mcpPeers === undefined ? {} : { mcpSessionTag: this.#options.mcpPeers.self }),
    };
  }

  /** Where it listens; throws before it has started. */
  get address(): AddressInfo {
    if (this.#app === undefined) throw new Error('the HTTP server is not listening');
    return this.#app.server.address() as AddressInfo;
  }

  /**
   * Probes a write, then listens (in a fleet worker, on node:cluster's shared listener; with `mcpPeers`, on its
   * peer socket too); `port_in_use` when the port is taken.
   */
  protected async onStart(): Promise<void> {
    const { config } = this.#options.runtime;
    const { app } = await buildApi(this.#deps(), { https: tlsOptions(config.http.tls) });
    this.#draining = false;
    const handler = fastifyHandler(app);
    this.#takeRequests(app, handler);
    const { host, port } = config.http;
    // The first probe before listening: `/readyz` never says ready before a write went through.
    await this.#writes.start();
    try {
      const peers = this.#options.mcpPeers;
      if (peers !== undefined)
        this.#peerServer = await listenForPeers(peers.socketPath(peers.self), (req, res) => {
          this.#track(req, res);
          handler(req, res);
        });
      await app.listen({ host, port });
    } catch (err) {
      await this.#writes.stop();
      await closePeerServer(this.#peerServer);
      this.#peerServer = undefined;
      await app.close();
      const code = (err as NodeJS.ErrnoException).code;
      if (code !== 'EADDRINUSE' && code !== 'EACCES') throw err;
      throw new ActionLedgerError(
        'port_in_use',
        `port ${port} (http.port / PORT) on ${host} is ${code === 'EACCES' ? 'not permitted' : 'in use'}; set http.port in the configuration or PORT in the environment`,
        { details: { port, setting: 'http.port', env: 'PORT' } },
      );
    }
    this.#app = app;
  }

  /**
   * The listener's requests go through here to fastify's own handler (`app.routing`, the very function fastify
   * installed): each is counted ({@link SERVED}) and kept while in flight, told `connection: close` while
   * draining, and an MCP request for a session of another fleet process is forwarded to it. Throws when
   * fastify's handler is not the listener's (a fastify that changed under this).
   */
  #takeRequests(app: FastifyInstance, handler: Handler): void {
    const server = app.server;
    if (!server.listeners('request').includes(handler))
      throw new ActionLedgerError('internal', "fastify's request handler is not its server's request listener");
    server.off('request', handler);
    const peers = this.#options.mcpPeers;
    const route = peers === undefined ? handler : forwardingHandler(peers, handler);
    server.on('request', (req: IncomingMessage, res: ServerResponse) => {
      this.#served.inc();
      this.#track(req, res);
      route(req, res);
    });
  }

  /** Keeps a request while in flight, for the drain (a request forwarded from a peer too). */
  #track(req: IncomingMessage, res: ServerResponse): void {
    if (this.#draining) res.setHeader('connection', 'close');
    // An MCP event stream stays open by design: a drain does not wait for it (closing the app ends it).
    if (req.method === 'GET' && (req.url ?? '').split('?')[0] === '/mcp') return;
    this.#inFlight.add(res);
    res.once('close', () => {
      this.#inFlight.delete(res);
      if (this.#inFlight.size === 0) this.#drained();
    });
  }

  /** Requests in flight on this listener now (an MCP event stream not counted). */
  get inFlight(): number {
    return this.#inFlight.size;
  }

  /** Drains (up to `drainMs`), then closes the app, which cuts whatever is still open. */
  protected async onStop(drainMs = DRAIN_MS): Promise<void> {
    const app = this.#app;
    this.#app = undefined;
    if (app === undefined) return;
    await this.#drain(app, drainMs);
    await this.#writes.stop();
    await closePeerServer(this.#peerServer);
    this.#peerServer = undefined;
    await app.close();
  }

  async #drain(app: FastifyInstance, drainMs: number): Promise<void> {
    this.#draining = true;
    // No new connections (a fleet worker leaves the shared listener's rotation); idle ones are closed now, and
    // every other one after its answer.
    app.server.close();
    app.server.closeIdleConnections();
    this.#peerServer?.close();
    for (const res of this.#inFlight) if (!res.headersSent) res.setHeader('connection', 'close');
    if (this.#inFlight.size === 0) return;
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      new Promise<void>((resolve) => (this.#drained = resolve)),
      new Promise<void>((resolve) => (timer = setTimeout(resolve, drainMs))),
    ]);
    clearTimeout(timer);
    this.#drained = () => undefined;
  }
}

type Handler = (req: IncomingMessage, res: ServerResponse) => void;

/**
 * fastify's request handler: `app.routing` is the very function fastify gave its server as the `request`
 * listener (fastify.js `routing: httpHandler`), a plain function that does not use `this`.
 */
function fastifyHandler(app: FastifyInstance): Handler {
  // eslint-disable-next-line @typescript-eslint/unbound-method -- see above
  return app.routing;
}

/** One counter per registry: an embedder may build more than one server over one runtime. */
function servedCounter(registry: Registry): Counter {
  const existing = registry.getSingleMetric(SERVED);
  return (
    (existing as Counter | undefined) ??
    new Counter({
      name: SERVED,
      help: "HTTP requests that arrived at this process's listener, whatever their answer (a fleet worker's carry its worker slot; an MCP request forwarded to the session's process counts where it arrived): how the fleet's connections spread over its processes.",
      registers: [registry],
    })
  );
}

async function closePeerServer(server: NodeServer | undefined): Promise<void> {
  if (server === undefined) return;
  const closed = new Promise<void>((resolve) => server.close(() => resolve()));
  server.closeAllConnections();
  await closed;
}

/** The HTTPS options of `http.tls`, or null. Throws `config_invalid` when a file cannot be read. */
function tlsOptions(tls: Runtime['config']['http']['tls']): Record<string, unknown> | null {
  if (tls === null) return null;
  try {
    return {
      cert: readFileSync(tls.certFile),
      key: readFileSync(tls.keyFile),
      minVersion: 'TLSv1.2',
      ...(tls.clientCaFile === null
        ? {}
        : { ca: readFileSync(tls.clientCaFile), requestCert: true, rejectUnauthorized: false }),
    };
  } catch (cause) {
    throw new ActionLedgerError('config_invalid', `cannot read the http.tls files: ${(cause as Error).message}`, {
      cause,
    });
  }
}
