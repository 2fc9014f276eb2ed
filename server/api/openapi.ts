/**
 * The OpenAPI 3.1 document, generated from the very schemas the routes validate with: each route registered
 * is recorded (an `onRoute` hook) and turned into its operation. A route without a schema is still listed.
 */
import type { RouteOptions } from 'fastify';
import type { ErrorCode } from '../../core/errors.js';
import { errorSchema } from './errors.js';
import { codesByStatus, routeErrorCodes } from './route-errors.js';

type Schema = Record<string, unknown>;

const REASONS: Record<number, string> = {
  400: 'the body is not strict JSON',
  401: 'no credential, or one that is malformed, unknown, expired or revoked',
  403: 'none of your roles may do this',
  404: 'no such resource in your tenant',
  409: 'the resource is not in a state that allows this',
  413: 'the body is over the cap',
  415: 'the body is not in the media type the route takes',
  421: 'the tenant is served by another cluster',
  422: 'invalid request',
  429: 'over the request rate; see Retry-After',
  500: 'internal error',
  501: 'this process cannot do it as configured',
  503: 'the database is unavailable or not migrated; retry',
};

export class OpenApiCollector {
  readonly #routes: RouteOptions[] = [];

  /** The `onRoute` hook. */
  readonly onRoute = (route: RouteOptions): void => {
    const methods = Array.isArray(route.method) ? route.method : [route.method];
    if (methods.every((m) => m === 'HEAD')) return;
    // The operator console's pages (and `/`, which leads there) are HTML for people, not part of the JSON API.
    if (route.url.startsWith('/console') || route.config?.console !== undefined) return;
    this.#routes.push(route);
  };

  /** Every method and path registered, as `GET /v1/x/{id}` (for the test that every route is documented). */
  routes(): string[] {
    return this.#routes.flatMap((r) =>
      (Array.isArray(r.method) ? r.method : [r.method]).map((m) => `${m} ${openApiPath(r.url)}`),
    );
  }

  /** Each documented operation with the codes it declares itself (for the test that checks its statuses). */
  declared(): { operation: string; public: boolean; body: boolean; errors: readonly ErrorCode[] | undefined }[] {
    return this.#routes.flatMap((r) =>
      (Array.isArray(r.method) ? r.method : [r.method])
        .filter((m) => m !== 'HEAD')
        .map((m) => ({
          operation: `${m} ${openApiPath(r.url)}`,
          public: r.config?.public === true,
          body: (r.schema as Schema | undefined)?.body !== undefined,
          errors: r.config?.errors,
        })),
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
  const config = (route.config ?? {}) as { public?: boolean; operationId?: string; errors?: readonly ErrorCode[] };
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
  // Each error status from the codes the route can answer (route-errors.ts), through the one code->status table;
  // a status the route's own response schema describes keeps that schema.
  for (const [status, codes] of codesByStatus(routeErrorCodes({ config, schema }))) {
    responses[String(status)] ??= {
      description: `${REASONS[status] ?? 'error'}: ${codes.join(', ')}`,
      content: {
        'application/json': {
          schema: { allOf: [{ $ref: '#/components/schemas/Error' }, { properties: { error: { enum: codes } } }] },
        },
      },
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
