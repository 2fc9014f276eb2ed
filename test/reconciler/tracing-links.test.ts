/**
 * With tracing on, the work done about an operation after its dispatch links to the trace it was reserved under:
 * a provider answers 500 (outcome unknown), the reconciler's readback span and a review action's span each carry a
 * link to the stored context (the reservation's span), while being traces of their own; the readback request is
 * the reconcile span's child and carries its `traceparent`. Spans are recorded in this process by the SDK's
 * in-memory exporter.
 */
import t from 'tap';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import {
  InMemorySpanExporter,
  NodeTracerProvider,
  SimpleSpanProcessor,
  type ReadableSpan,
} from '@opentelemetry/sdk-trace-node';
import { disableTracing, enableTracing, inSpan, SpanKind } from '../../core/tracing.js';
import { ctx, dispatchEnv, passUntilResolved, patchProvider, statusOf } from '../helpers/fleet.js';

t.test('reconciliation and review actions link to the operation’s trace', async (t) => {
  const exporter = new InMemorySpanExporter();
  const provider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  provider.register({ propagator: new W3CTraceContextPropagator() });
  enableTracing();
  t.teardown(async () => {
    disableTracing();
    await provider.shutdown();
  });

  const e = await dispatchEnv(t);
  const readbackParents: (string | undefined)[] = [];
  patchProvider(e.provider, (orig) => async (req, res) => {
    if (req.method === 'POST') {
      // Not applied, and an answer that proves nothing: the outcome is unknown, for the reconciler.
      for await (const _ of req as AsyncIterable<Buffer>) void _;
      res.writeHead(500, { 'content-type': 'application/json' }).end('{}');
      return;
    }
    readbackParents.push(req.headers.traceparent as string | undefined);
    return orig(req, res);
  });
  const r = await inSpan('caller', SpanKind.SERVER, undefined, () =>
    e.ledger.reserve(ctx('traced-unknown'), 'issue_refund', { order_id: 'o-9', amount: 100, currency: 'EUR' }),
  );
  await e.dispatcher();
  const deadline = Date.now() + 15_000;
  while ((await statusOf(e.pool, r.operation_id)) !== 'unknown') {
    if (Date.now() > deadline) throw new Error('the operation never became unknown');
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  const kit = await e.reconciler();
  await passUntilResolved(e.pool, kit, r.operation_id);
  t.equal(await statusOf(e.pool, r.operation_id), 'needs_review', 'no effect found: to review');
  await kit.review.resolveFailed(r.operation_id, { actor: 'operator-1', reason: 'confirmed by the provider' });

  const spans = exporter.getFinishedSpans();
  const named = (name: string): ReadableSpan[] => spans.filter((s) => s.name === name);
  const reserve = named('reserve').find((s) => s.attributes['actionledger.operation_id'] === r.operation_id);
  if (reserve === undefined) throw new Error('no reservation span');
  const traceId = reserve.spanContext().traceId;
  const dispatch = named('process outbox').find((s) => s.attributes['actionledger.operation_id'] === r.operation_id);
  t.equal(dispatch?.spanContext().traceId, traceId, 'the dispatch continues the reservation’s trace');

  const reconcile = named('reconcile operation').filter(
    (s) => s.attributes['actionledger.operation_id'] === r.operation_id,
  );
  t.ok(reconcile.length >= 1, 'the reconciler examined it in a span');
  for (const s of reconcile) {
    t.same(
      s.links.map((l) => l.context.spanId),
      [reserve.spanContext().spanId],
      'linked to the reservation’s span',
    );
    t.not(s.spanContext().traceId, traceId, 'a trace of its own');
  }
  const readback = spans.filter(
    (s) => s.name === 'GET readback' && reconcile.some((c) => c.spanContext().spanId === s.parentSpanContext?.spanId),
  );
  t.ok(readback.length >= 1, 'the readback request is a reconcile span’s child');
  t.ok(
    readbackParents.some((p) =>
      readback.some((s) => p === `00-${s.spanContext().traceId}-${s.spanContext().spanId}-01`),
    ),
    'the provider received its traceparent',
  );

  const review = named('review resolve_failed');
  t.equal(review.length, 1, 'the review action’s span');
  t.same(
    review[0]?.links.map((l) => l.context.spanId),
    [reserve.spanContext().spanId],
    'linked to the operation’s trace',
  );
});
