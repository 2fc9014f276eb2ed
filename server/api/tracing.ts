/**
 * The API's server spans, registered only while tracing is on (core/tracing.ts): each request continues the
 * trace its `traceparent` names (a new one without it; a caller's `tracestate` is dropped), as a SERVER span named by the HTTP
 * conventions (`POST /v1/calls`: the route pattern, never the raw path), active for the route's handler so the
 * gate's decision and the reservation are its children. Its attributes are the method, route, scheme and status;
 * never a header, the query string or the body.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { context, trace } from '@opentelemetry/api';
import { extractCallerContext, failSpan, SpanKind, startSpan, type Context, type Span } from '../../core/tracing.js';

const spans = new WeakMap<FastifyRequest, { span: Span; parent: Context }>();

export function registerTracing(app: FastifyInstance, https: boolean): void {
  app.addHook('onRequest', (request: FastifyRequest, _reply: FastifyReply, done: () => void) => {
    const route = request.routeOptions.url;
    const parent = extractCallerContext(request.headers);
    const span = startSpan(
      route === undefined ? request.method : `${request.method} ${route}`,
      SpanKind.SERVER,
      () => ({
        'http.request.method': request.method,
        ...(route === undefined ? {} : { 'http.route': route }),
        'url.scheme': https ? 'https' : 'http',
        'network.protocol.version': request.raw.httpVersion,
      }),
      { parent },
    );
    if (span !== undefined) spans.set(request, { span, parent });
    done();
  });
  // The handler runs in the span's context: everything it awaits (the gate, the ledger) starts its spans there.
  app.addHook('preHandler', (request: FastifyRequest, _reply: FastifyReply, done: () => void) => {
    const held = spans.get(request);
    if (held === undefined) return done();
    context.with(trace.setSpan(held.parent, held.span), done);
  });
  app.addHook('onResponse', (request: FastifyRequest, reply: FastifyReply, done: () => void) => {
    const held = spans.get(request);
    if (held !== undefined) {
      held.span.setAttribute('http.response.status_code', reply.statusCode);
      if (reply.statusCode >= 500) failSpan(held.span, String(reply.statusCode));
      held.span.end();
      spans.delete(request);
    }
    done();
  });
}
