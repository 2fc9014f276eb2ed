/**
 * `Gate.call` with tracing on (gate/gate.ts) behaves as with it off: whatever the context, it returns a promise
 * and never throws, a malformed context refused as `invalid_context`; its span names the tenant only from a
 * context that passed the gate's check. Real PostgreSQL, the example gate configuration.
 */
import t from 'tap';
import type { GateContext } from '../../gate/index.js';
import { gateFixture, gctx } from '../helpers/gate.js';
import { traceInMemory } from '../helpers/tracing.js';

const transfer = { to_account: 'ACC0000000002', amount: 10 };

t.test('tracing on: a malformed context is refused, never thrown, and its tenant never recorded', async (t) => {
  const exporter = traceInMemory(t);
  const { gate } = await gateFixture(t);

  for (const [name, context] of [
    ['null', null],
    ['a string', 'tenant-a'],
    ['a tenant id that is an object', { ...gctx(), tenant_id: { toString: () => 'x' } }],
    ['a tenant id with a zero-width space', gctx({ tenant_id: 'tenant\u200b-a' })],
  ] as const) {
    let returned: Promise<unknown> | undefined;
    t.doesNotThrow(() => {
      returned = gate.call(context as unknown as GateContext, 'transfer_funds', transfer);
    }, `${name}: no synchronous throw`);
    t.match(await returned, { ok: false, error: 'invalid_context' }, `${name}: refused as invalid_context`);
  }
  const refused = exporter.getFinishedSpans().filter((s) => s.name.startsWith('gate '));
  t.equal(refused.length, 4, 'a span for each call');
  t.ok(
    refused.every((s) => s.attributes['actionledger.tenant'] === undefined),
    'no tenant recorded from an unchecked context',
  );
  t.ok(refused.every((s) => s.attributes['actionledger.decision'] === 'invalid_context'));

  exporter.reset();
  const ok = await gate.call(gctx(), 'transfer_funds', transfer);
  t.match(ok, { ok: true });
  const [span] = exporter.getFinishedSpans().filter((s) => s.name.startsWith('gate '));
  t.equal(span?.attributes['actionledger.tenant'], 'tenant-a', 'a checked context names its tenant');
});
