/**
 * With tracing on, the work done about an operation after its dispatch links to the trace it was reserved under:
 * a provider answers 500 (outcome unknown), the reconciler's readback span and a review action's span each carry a
 * link to the stored context (the reservation's span), while being traces of their own; the readback request is
 * the reconcile span's child and carries its `traceparent`. A compensation of a succeeded operation links to that
 * operation's trace, and the operation it mints is reserved and dispatched in the compensation's trace. Spans are
 * recorded in this process by the SDK's in-memory exporter.
 */
import t from 'tap';
import type { ReadableSpan } from '@opentelemetry/sdk-trace-node';
import { inSpan, SpanKind } from '../../core/tracing.js';
import { ctx, dispatchEnv, passUntilResolved, patchProvider, statusOf } from '../helpers/fleet.js';
import { traceInMemory } from '../helpers/tracing.js';

async function until(e: Awaited<ReturnType<typeof dispatchEnv>>, id: string, status: string): Promise<void> {
  const deadline = Date.now() + 15_000;
  while ((await statusOf(e.pool, id)) !== status) {
    if (Date.now() > deadline) throw new Error(`operation ${id} never became ${status}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

t.test('reconciliation and review actions link to the operation’s trace', async (t) => {
  const exporter = traceInMemory(t);

  const e = await dispatchEnv(t);
  const readbackParents: (string | undefined)[] = [];
  let failKey = '';
  patchProvider(e.provider, (orig) => async (req, res) => {
    if (req.method === 'POST' && req.headers['idempotency-key'] === failKey) {
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
  failKey = r.effect_key;
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
  const caller = named('caller').find((s) => s.spanContext().traceId === traceId);
  t.equal(reserve.parentSpanContext?.spanId, caller?.spanContext().spanId, 'reserved under the caller’s span');
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
  // The readback URL holds the effect key in its path: the span records the configured template instead.
  for (const s of readback) {
    t.match(s.attributes['url.template'], /\{effect_key\}/, 'the readback span records the template');
    t.notMatch(String(s.attributes['url.full']), /\/v1\//, 'and its URL without a path');
  }
  const everything = JSON.stringify(
    spans.map((s) => ({ name: s.name, attributes: s.attributes, events: s.events, links: s.links })),
  );
  t.notOk(everything.includes(r.effect_key), 'no span, attribute, event or link carries the effect key');
  t.notOk(everything.includes(encodeURIComponent(r.effect_key)), 'nor its URL-encoded form');

  // A compensation: its span links to the original's trace, and the operation it mints is reserved and
  // dispatched in the compensation's own trace.
  const original = await inSpan('caller', SpanKind.SERVER, undefined, () =>
    e.ledger.reserve(ctx('traced-compensated'), 'issue_refund', { order_id: 'o-10', amount: 100, currency: 'EUR' }),
  );
  await until(e, original.operation_id, 'succeeded');
  await kit.review.compensate(original.operation_id, { actor: 'operator-1', reason: 'refunded twice' });
  const { rows } = await e.pool.query<{ compensation_operation_id: string }>(
    'SELECT compensation_operation_id FROM actionledger.compensations WHERE original_operation_id = $1',
    [original.operation_id],
  );
  const minted = rows[0]?.compensation_operation_id ?? '';
  await until(e, minted, 'succeeded');
  const later = exporter.getFinishedSpans();
  const originalReserve = later.find(
    (s) => s.name === 'reserve' && s.attributes['actionledger.operation_id'] === original.operation_id,
  );
  const compensate = later.find((s) => s.name === 'compensate');
  t.same(
    compensate?.links.map((l) => l.context.spanId),
    [originalReserve?.spanContext().spanId],
    'the compensation links to the original’s trace',
  );
  const mintedReserve = later.find((s) => s.name === 'reserve' && s.attributes['actionledger.operation_id'] === minted);
  t.equal(mintedReserve?.parentSpanContext?.spanId, compensate?.spanContext().spanId, 'minted in its span');
  const mintedDispatch = later.find(
    (s) => s.name === 'process outbox' && s.attributes['actionledger.operation_id'] === minted,
  );
  t.equal(mintedDispatch?.spanContext().traceId, compensate?.spanContext().traceId, 'and dispatched in its trace');

  const review = named('review resolve_failed');
  t.equal(review.length, 1, 'the review action’s span');
  t.same(
    review[0]?.links.map((l) => l.context.spanId),
    [reserve.spanContext().spanId],
    'linked to the operation’s trace',
  );
});
