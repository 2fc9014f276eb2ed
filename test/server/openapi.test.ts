/**
 * The OpenAPI document served at /v1/openapi.json: valid OpenAPI 3.1 by the specification's own JSON Schema
 * (@seriousme/openapi-schema-validator), every `$ref` resolving, lint rules a reviewer would apply (unique
 * operation ids, a summary and a success response for each operation, declared path parameters, security on
 * every authenticated route), and every route fastify actually serves listed in it, read from fastify's own
 * route table rather than from the collector that wrote the document.
 */
import t from 'tap';
import { Validator } from '@seriousme/openapi-schema-validator';
import { apiFixture } from '../helpers/api.js';

type Operation = {
  operationId?: string;
  summary?: string;
  parameters?: { name: string; in: string }[];
  responses?: Record<string, unknown>;
  security?: unknown[];
};

/** `METHOD /path` for every route in fastify's printed tree (HEAD, added for each GET, left out). */
function servedRoutes(tree: string): string[] {
  const out: string[] = [];
  const stack: { depth: number; path: string }[] = [];
  for (const line of tree.split('\n')) {
    const m = /^([│ ]*)[├└]── (\S+)(?: \(([^)]*)\))?/u.exec(line);
    if (m === null) continue;
    const depth = (m[1] ?? '').length;
    while (stack.length > 0 && (stack.at(-1)?.depth ?? -1) >= depth) stack.pop();
    const path = `${stack.at(-1)?.path ?? ''}${m[2] ?? ''}`;
    stack.push({ depth, path });
    for (const method of (m[3] ?? '').split(',').map((s) => s.trim()))
      if (method !== '' && method !== 'HEAD') out.push(`${method} ${path.replace(/:([A-Za-z0-9_]+)/g, '{$1}')}`);
  }
  return out.sort();
}

t.test('the served document is valid OpenAPI 3.1 and lists every route', async (t) => {
  const f = await apiFixture(t);
  const res = await f.call('GET', '/v1/openapi.json');
  t.equal(res.status, 200);
  const doc = res.body as { openapi: string; paths: Record<string, Record<string, Operation>> };
  t.equal(doc.openapi, '3.1.0');

  const validator = new Validator();
  const result = await validator.validate(structuredClone(doc));
  t.ok(result.valid, `valid against the OpenAPI 3.1 schema: ${JSON.stringify(result.errors ?? []).slice(0, 2000)}`);
  t.doesNotThrow(() => validator.resolveRefs(), 'every $ref resolves');
  const broken = await new Validator().validate({
    ...structuredClone(doc),
    paths: { '/x': { get: { responses: 5 } } },
  });
  t.notOk(broken.valid, 'the validator does refuse a broken document');

  const documented: string[] = [];
  const ids = new Set<string>();
  for (const [path, item] of Object.entries(doc.paths)) {
    const templated = [...path.matchAll(/\{([^}]+)\}/g)].map((m) => m[1]);
    for (const [method, op] of Object.entries(item)) {
      const where = `${method.toUpperCase()} ${path}`;
      documented.push(where);
      t.ok(op.operationId !== undefined && !ids.has(op.operationId), `${where}: a unique operationId`);
      ids.add(op.operationId ?? '');
      t.ok(typeof op.summary === 'string' && op.summary.length > 0, `${where}: a summary`);
      t.ok(
        Object.keys(op.responses ?? {}).some((s) => s.startsWith('2')),
        `${where}: a success response`,
      );
      const declared = (op.parameters ?? []).filter((p) => p.in === 'path').map((p) => p.name);
      t.same(declared.sort(), [...templated].sort(), `${where}: path parameters declared`);
      if (path.startsWith('/v1/') && path !== '/v1/openapi.json') {
        t.same(op.security, [{ bearer: [] }], `${where}: needs a bearer token`);
        t.ok(op.responses?.['401'] !== undefined, `${where}: documents 401`);
      }
    }
  }
  // The operator console's HTML pages (/console) are not part of the JSON API's document, nor `/`, which only
  // redirects a browser there, nor the console's favicon.
  const served = servedRoutes(f.api.app.printRoutes({ commonPrefix: false })).filter(
    (r) => !r.includes(' /console') && r !== 'GET /' && r !== 'GET /favicon.ico',
  );
  t.ok(served.length >= 6, `fastify serves ${served.length} routes`);
  t.same(documented.sort(), served, 'the document lists exactly the routes fastify serves');
});

t.test('the route tree reader reads nested routes (so the comparison above can fail)', (t) => {
  const tree = ['├── /v1/a (GET, HEAD)', '│   └── /:tool (PUT, DELETE)', '└── /healthz (GET, HEAD)'].join('\n');
  t.same(servedRoutes(tree), ['DELETE /v1/a/{tool}', 'GET /healthz', 'GET /v1/a', 'PUT /v1/a/{tool}']);
  t.end();
});
