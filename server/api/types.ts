/** What the API's routes are given, who is calling, and the per-route settings the hooks read. */
import type {
  FastifyBaseLogger,
  FastifyInstance,
  FastifyTypeProvider,
  RawReplyDefaultExpression,
  RawRequestDefaultExpression,
  RawServerDefault,
} from 'fastify';
import type { FromSchema, JSONSchema } from 'json-schema-to-ts';
import type { ApiCapability } from '../../config/index.js';
import type { Config } from '../../config/index.js';
import type { Pool } from '../../db/index.js';
import type { ErrorCode } from '../../core/errors.js';
import type { Logger } from '../../core/log.js';
import type { Metrics } from '../../core/metrics.js';
import type { AuditWriter, Gate } from '../../gate/index.js';
import type { Ledger } from '../../ledger/index.js';
import type { Authenticated, PrincipalStore } from '../../principals/index.js';
import type { Review } from '../../reconciler/index.js';
import type { SlackInteractions } from '../../notifier/index.js';
import type { WriteHealth } from '../write-probe.js';
import type { DeclaredErrorsMode, UndeclaredError } from './route-errors.js';

export interface ApiDeps {
  config: Config;
  pool: Pool;
  log: Logger;
  gate: Gate;
  ledger: Ledger;
  principals: PrincipalStore;
  audit: AuditWriter;
  /** The review actions (retry, resolve, compensate); without it those routes answer `internal`. */
  review?: Review;
  /** Slack's button clicks (notifier); without it the interactivity route answers `not_found`. */
  slack?: SlackInteractions;
  /** Where the secrets the configuration names by variable are read (the console's OIDC client secret). */
  env?: NodeJS.ProcessEnv;
  /** This process's metrics (the audit-lost counter; the API's request counters). */
  metrics?: Metrics;
  /** The exposition `/metrics` serves (the fleet aggregates its workers'); defaults to `metrics`'. */
  exposition?: (o: { openMetrics: boolean }) => Promise<{ contentType: string; body: string }>;
  /** Refreshes the gauges read at scrape time. */
  beforeScrape?: () => Promise<void>;
  /**
   * The service's own view, checked before the database: an error code (`embedded_database_failed` while the
   * embedded cluster restarts or after it failed) makes both probes 503 without a query.
   */
  health?: () => { error: string | null; stopping: boolean };
  /**
   * Whether the database takes writes (server/write-probe.ts): `/readyz` is 503 while it refuses them, and
   * every write the API sees refused (`storage_full`, `database_read_only`, `database_unavailable`) is
   * reported to it. Without it `/readyz` checks reads only.
   */
  writes?: WriteHealth;
  /**
   * What happens to an error answer its route does not declare (server/api/route-errors.ts): `warn` (the
   * default) logs it; `enforce` (the tests) answers 500 `internal` instead, so it cannot go unnoticed.
   */
  declaredErrors?: DeclaredErrorsMode;
  /**
   * The prefix of the MCP session ids this process mints (`w<slot>`, server/mcp/peers.ts): set in a fleet
   * worker, so a request for the session that lands on another worker is forwarded here.
   */
  mcpSessionTag?: string;
  /** Told of each undeclared error answer (the tests collect them). */
  onUndeclaredError?: (undeclared: UndeclaredError) => void;
}

/**
 * The routes' request types, derived from the very JSON Schemas they validate with (json-schema-to-ts): a route
 * registered on `app.withTypeProvider<SchemaTypes>()` reads `request.params`, `query` and `body` as
 * `FromSchema` of its `schema.params`, `querystring` and `body` (each declared `as const`), so the type and the
 * schema cannot drift. A property with a `default` is present (ajv fills it in before the handler runs). Replies
 * are not typed from the response schemas: those document, they do not filter.
 */
export interface SchemaTypes extends FastifyTypeProvider {
  readonly validator: FromRouteSchema<this['schema']>;
  readonly serializer: unknown;
}

/** The app as the route groups register on it: request types from the schemas ({@link SchemaTypes}). */
export type ApiApp = FastifyInstance<
  RawServerDefault,
  RawRequestDefaultExpression,
  RawReplyDefaultExpression,
  FastifyBaseLogger,
  SchemaTypes
>;

/**
 * The request type {@link SchemaTypes} derives from a schema (the compile-time test pins some): distributed over
 * a union, so a route registered with one of several schemas reads the union of their types.
 */
export type FromRouteSchema<S> = S extends JSONSchema ? FromSchema<S> : unknown;

/** An authenticated caller, as the hooks leave it on the request. */
export type Caller = Authenticated;

declare module 'fastify' {
  interface FastifySchema {
    summary?: string;
    description?: string;
    tags?: readonly string[];
  }
  interface FastifyRequest {
    /** Set by the authentication hook on every route that is not public. */
    caller?: Caller;
    /** Refused as malformed HTTP before any route could see it (a repeated Host or Content-Type). */
    refusedMalformed?: boolean;
  }
  interface FastifyContextConfig {
    /** Served without credentials (probes, metrics, the OpenAPI document). */
    public?: boolean;
    /**
     * An operator console route (server/console/): not authenticated by the API's bearer hook but by the
     * console's own session, except `public` console routes (sign-in, static files).
     */
    console?: 'session' | 'public';
    /** The capability (`api.permissions`) one of the caller's roles must be granted. */
    capability?: ApiCapability;
    /**
     * The route's answers (200) are the gate's decisions, each audited by the gate with the caller's principal
     * and the request id as its trace id: the API's own `api` row is written only for its other answers.
     */
    gateAudited?: boolean;
    /** The OpenAPI operationId. */
    operationId?: string;
    /**
     * The error codes this route answers besides those of its kind (server/api/route-errors.ts): the OpenAPI
     * document lists their statuses, and every error answer is checked against them.
     */
    errors?: readonly ErrorCode[];
  }
}
