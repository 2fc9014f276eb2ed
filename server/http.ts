/**
 * The HTTP listener of `npm start`: the API (server/api/), `/healthz`, `/readyz` and `/metrics`, on one port
 * for the whole fleet. Loopback by default; another address needs TLS (`http.tls`) unless the configuration
 * explicitly allows plain HTTP (config/api.ts). start()/stop() follow the service contract: stop is safe
 * before start and safe to repeat.
 */
import { readFileSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { hostname } from 'node:os';
import type { FastifyInstance } from 'fastify';
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
  metrics?: () => Promise<{ contentType: string; body: string }>;
  /** Refreshes the gauges read at scrape time. */
  beforeScrape?: () => Promise<void>;
  /** See {@link ApiDeps.health}. */
  health?: () => { error: string | null; stopping: boolean };
  /** Where the Slack destinations' secrets are read (their variable names are in the configuration). */
  env?: NodeJS.ProcessEnv;
}

export class HttpServer extends Service {
  readonly #options: HttpServerOptions;
  #app: FastifyInstance | undefined;
  readonly #writes: WriteProbe;

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
      review: new Review(rt.config, rt.pool, compensator),
      metrics: rt.metrics,
      ...(this.#options.metrics === undefined ? {} : { exposition: this.#options.metrics }),
      ...(this.#options.beforeScrape === undefined ? {} : { beforeScrape: this.#options.beforeScrape }),
      ...(this.#options.health === undefined ? {} : { health: this.#options.health }),
      writes: this.#writes,
    };
  }

  /** Where it listens; throws before it has started. */
  get address(): AddressInfo {
    if (this.#app === undefined) throw new Error('the HTTP server is not listening');
    return this.#app.server.address() as AddressInfo;
  }

  /** Probes a write, then listens; `port_in_use` when the port is taken. */
  protected async onStart(): Promise<void> {
    const { config } = this.#options.runtime;
    const { app } = await buildApi(this.#deps(), { https: tlsOptions(config.http.tls) });
    const { host, port } = config.http;
    // The first probe before listening: `/readyz` never says ready before a write went through.
    await this.#writes.start();
    try {
      await app.listen({ host, port });
    } catch (err) {
      await this.#writes.stop();
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

  protected async onStop(): Promise<void> {
    const app = this.#app;
    this.#app = undefined;
    if (app === undefined) return;
    await this.#writes.stop();
    await app.close();
  }
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
