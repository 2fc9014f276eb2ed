/**
 * The OpenAPI 3.1 document, generated from the very schemas the routes validate with: each route registered
 * is recorded (an `onRoute` hook) and turned into its operation. A route without a schema is still listed.
 */
import type { RouteOptions } from 'fastify';
import { errorSchema } from './errors.js';

type Schema = Record<string, unknown>;

/** The statuses every authenticated route can answer with, besides its own. */
const AUTHENTICATED_ERRORS = [401, 403, 422, 429, 503];

const REASONS: Record<number, string> = {
  400: 'the body is not strict JSON',
  401: 'no credential, or one that is malformed, unknown, expired or revoked',
  403: 'none of your roles may do this',
  404: 'no such resource in your tenant',
  409: 'the resource is not in a state that allows this',
  413: 'the body is over the cap',
  415: 'the body is not application/json',
  422: 'invalid request',
  429: 'over the request rate; see Retry-After',
  500: 'internal error',
  503: 'the database is unavailable or not migrated; retry',
};

export class OpenApiCollector {
  readonly #routes: RouteOptions[] = [];

  /** The `onRoute` hook. */
  readonly onRoute = (route: RouteOptions): void => {
    const methods = Array.isArray(route.method) ? route.method : [route.method];
    if (methods.every((m) => m === 'HEAD')) return;
    // The operator console's pages are HTML for people, not part of the JSON API.
    if (route.url.startsWith('/console')) return;
    this.#routes.push(route);
  };

  /** Every method and path registered, as `GET /v1/x/{id}` (for the test that every route is documented). */
  routes(): string[] {
    return this.#routes.flatMap((r) =>
      (Array.isArray(r.method) ? r.method : [r.method]).map((m) => `${m} ${openApiPath(r.url)}`),
    );
  }

  document(info: { title: string; version: string }): Schema {
    const paths: Record<string, Record<string, unknown>> = {};
    for (const route of this.#routes) {
      const path = openApiPath(route.url);
      for (const method of Array.isArray(route.method) ? route.method : [route.method]) {
        if (method === 'HEAD') continue;
        (paths[path] ??= {})[method.toLowerCase()] = operation(route, method);
      }
    }
    const { $id: _id, ...error } = errorSchema;
    return {
      openapi: '3.1.0',
      info: { ...info, description: 'actionledger: at-most-once, freshly authorized side effects' },
      servers: [{ url: '/' }],
      paths,
      components: {
        schemas: { Error: error },
        securitySchemes: { bearer: { type: 'http', scheme: 'bearer', description: 'an API token (`token create`)' } },
      },
    };
  }
}

function openApiPath(url: string): string {
  return url.replace(/:([A-Za-z0-9_]+)/g, '{$1}');
}

function operation(route: RouteOptions, method: string): Schema {
  const schema = (route.schema ?? {}) as Schema;
  const config = (route.config ?? {}) as { public?: boolean; operationId?: string; errors?: readonly number[] };
  const op: Schema = {
    operationId:
      config.operationId ??
      `${method.toLowerCase()}${route.url.replace(/[^A-Za-z0-9]+(.)?/g, (_m, c: string | undefined) => (c ?? '').toUpperCase())}`,
    summary: schema.summary ?? `${method} ${route.url}`,
    ...(schema.description === undefined ? {} : { description: schema.description }),
    ...(schema.tags === undefined ? {} : { tags: schema.tags }),
  };
  const parameters = [
    ...parametersOf(schema.params as Schema | undefined, 'path'),
    ...parametersOf(schema.querystring as Schema | undefined, 'query'),
  ];
  if (parameters.length > 0) op.parameters = parameters;
  if (schema.body !== undefined)
    op.requestBody = { required: true, content: { 'application/json': { schema: schema.body } } };
  const responses: Record<string, unknown> = {};
  for (const [status, body] of Object.entries((schema.response ?? {}) as Record<string, Schema>)) {
    const { description, ...rest } = body;
    responses[status] = {
      description: typeof description === 'string' ? description : 'success',
      content: { 'application/json': { schema: rest } },
    };
  }
  if (Object.keys(responses).length === 0) responses['200'] = { description: 'success' };
  const errors = new Set([...(config.public === true ? [] : AUTHENTICATED_ERRORS), ...(config.errors ?? [])]);
  if (schema.body !== undefined) for (const s of [400, 413, 415]) errors.add(s);
  for (const status of [...errors].sort()) {
    responses[String(status)] = {
      description: REASONS[status] ?? 'error',
      content: { 'application/json': { schema: { $ref: '#/components/schemas/Error' } } },
    };
  }
  op.responses = responses;
  op.security = config.public === true ? [] : [{ bearer: [] }];
  return op;
}

function parametersOf(schema: Schema | undefined, where: 'path' | 'query'): Schema[] {
  if (schema === undefined) return [];
  const properties = (schema.properties ?? {}) as Record<string, Schema>;
  const required = new Set((schema.required ?? []) as string[]);
  return Object.entries(properties).map(([name, s]) => {
    const { description, ...rest } = s;
    return {
      name,
      in: where,
      required: where === 'path' || required.has(name),
      schema: rest,
      ...(typeof description === 'string' ? { description } : {}),
    };
  });
}
