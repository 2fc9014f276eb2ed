import t from 'tap';
import { setTimeout as delay } from 'node:timers/promises';
import { isActionLedgerError } from '../../core/errors.js';
import {
  assertExternalWriteAllowed,
  externalWritesAllowed,
  guardExternalWrite,
  openExternalWriteScopeCount,
  withExternalWrites,
} from '../../transport/external-writes.js';

/** A stand-in provider client that counts the calls that actually reached it, and the refusals. */
function provider(): { call: (body: string) => Promise<string>; sent: string[]; refused: () => number } {
  const sent: string[] = [];
  let refusals = 0;
  const call = guardExternalWrite(
    (body: string) => {
      sent.push(body);
      return Promise.resolve(`receipt-${body}`);
    },
    () => {
      refusals++;
    },
  );
  return { call, sent, refused: () => refusals };
}

t.test('inside the scope the call goes through; outside it is refused and counted', async (t) => {
  const p = provider();
  t.equal(await withExternalWrites(() => p.call('a')), 'receipt-a');
  t.equal(
    await withExternalWrites(async () => {
      await delay(5);
      await Promise.resolve();
      return p.call('b');
    }),
    'receipt-b',
    'awaited async work inside the scope is allowed',
  );
  const err = await p.call('c').catch((e: unknown) => e);
  t.ok(isActionLedgerError(err, 'ungated_external_write'), 'outside: ungated_external_write');
  t.match((err as { details: unknown }).details, { scope: 'none' });
  t.equal(p.refused(), 1, 'the counter increments');
  t.same(p.sent, ['a', 'b'], 'the refused call never reached the provider');
  t.notOk(externalWritesAllowed());
  t.throws(() => assertExternalWriteAllowed(), { code: 'ungated_external_write' });
  t.equal(openExternalWriteScopeCount(), 0);
});

t.test('a throwing counter callback does not replace the refusal', async (t) => {
  const call = guardExternalWrite(
    () => Promise.resolve('x'),
    () => {
      throw new Error('metrics down');
    },
  );
  const err = await call().catch((e: unknown) => e);
  t.ok(isActionLedgerError(err, 'ungated_external_write'));
});

t.test('the create_task escape: a timer or detached promise started inside runs after the scope closed', async (t) => {
  const p = provider();
  const outcomes: Promise<unknown>[] = [];
  let timerOutcome!: Promise<unknown>;
  const timerFired = new Promise<void>((resolve) => {
    void withExternalWrites(() => {
      setTimeout(() => {
        timerOutcome = p.call('from-timer').catch((e: unknown) => e);
        resolve();
      }, 50);
      // a detached chain: not awaited by the scope, so it outlives it
      outcomes.push(
        (async () => {
          await delay(50);
          return p.call('from-detached');
        })().catch((e: unknown) => e),
      );
      setImmediate(() => {
        outcomes.push(p.call('from-immediate').catch((e: unknown) => e));
      });
      return 'closed';
    }, 'op-123');
  });
  await timerFired;
  outcomes.push(timerOutcome);
  await delay(10);
  const results = await Promise.all(outcomes);
  t.equal(results.length, 3);
  for (const r of results) {
    t.ok(isActionLedgerError(r, 'ungated_external_write'), 'refused after the scope closed');
    t.match((r as { details: unknown }).details, { scope: 'closed', label: 'op-123' });
  }
  t.same(p.sent, [], 'nothing reached the provider');
  t.equal(p.refused(), 3);
});

t.test('concurrent scopes do not leak into each other', async (t) => {
  const p = provider();
  let releaseA!: () => void;
  const aMayClose = new Promise<void>((r) => (releaseA = r));
  let aClosed!: () => void;
  const aHasClosed = new Promise<void>((r) => (aClosed = r));
  let leaked: Promise<unknown> | undefined;

  const a = withExternalWrites(async () => {
    await p.call('a1');
    setTimeout(() => {
      leaked = p.call('a-late').catch((e: unknown) => e);
    }, 20);
    await aMayClose;
  }).then(() => aClosed());
  const b = withExternalWrites(async () => {
    await p.call('b1');
    releaseA();
    await aHasClosed;
    t.ok(externalWritesAllowed(), 'B is still open after A closed');
    await delay(40); // A's late timer fires while B is open
    return p.call('b2');
  });
  t.equal(await b, 'receipt-b2', 'closing A does not break B');
  await a;
  t.ok(isActionLedgerError(await leaked, 'ungated_external_write'), "A's timer is refused although B is open");
  t.same(p.sent.sort(), ['a1', 'b1', 'b2']);
  t.equal(openExternalWriteScopeCount(), 0);
});

t.test('nested scopes: the inner closing leaves the outer open, and an inner leftover is refused', async (t) => {
  const p = provider();
  let innerLeftover: Promise<unknown> | undefined;
  await withExternalWrites(async () => {
    await withExternalWrites(() => {
      innerLeftover = delay(20)
        .then(() => p.call('inner-late'))
        .catch((e: unknown) => e);
    });
    t.ok(externalWritesAllowed(), 'outer still open after inner closed');
    await delay(40);
    await p.call('outer');
  });
  t.ok(isActionLedgerError(await innerLeftover, 'ungated_external_write'));
  t.same(p.sent, ['outer']);
});

t.test('a scope closes when its function throws', async (t) => {
  let leftover: Promise<unknown> | undefined;
  const p = provider();
  await t.rejects(
    withExternalWrites(() => {
      leftover = delay(10)
        .then(() => p.call('x'))
        .catch((e: unknown) => e);
      throw new Error('boom');
    }),
    { message: 'boom' },
  );
  t.equal(openExternalWriteScopeCount(), 0);
  t.ok(isActionLedgerError(await leftover, 'ungated_external_write'));
});
