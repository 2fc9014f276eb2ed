import t from 'tap';
import { leastWriter } from '../../bench/cells.js';
import { percentiles } from '../../bench/harness.js';

/** A write that records each call's ids and settles when the test says so. */
function controlledWrite() {
  const calls: { ids: string[]; answer: (ids: string[]) => void; fail: (err: Error) => void }[] = [];
  const write = (items: { id: string }[]): Promise<string[]> =>
    new Promise((answer, fail) => calls.push({ ids: items.map((i) => i.id), answer, fail }));
  return { calls, write };
}

const tick = (): Promise<void> => new Promise((r) => setImmediate(r));

t.test('single: one write per item, each told whether its id came back', async (t) => {
  const { calls, write } = controlledWrite();
  const put = leastWriter('single', write);
  const a = put({ id: 'a' });
  const b = put({ id: 'b' });
  t.same(
    calls.map((c) => c.ids),
    [['a'], ['b']],
    'both writes are out at once',
  );
  calls[0]!.answer(['a']);
  calls[1]!.answer([]);
  t.equal(await a, true);
  t.equal(await b, false, 'an id the write did not return is reported as not taken');
});

t.test('batched: one write in flight; what arrives meanwhile goes in the next one', async (t) => {
  const { calls, write } = controlledWrite();
  const put = leastWriter('batched', write);
  const a = put({ id: 'a' });
  const b = put({ id: 'b' });
  await tick();
  t.same(
    calls.map((c) => c.ids),
    [['a', 'b']],
    'items of the same tick share the first write',
  );
  const c = put({ id: 'c' });
  const d = put({ id: 'd' });
  await tick();
  t.equal(calls.length, 1, 'no second write while the first is in flight');
  calls[0]!.answer(['a']);
  t.equal(await a, true);
  t.equal(await b, false);
  await tick();
  t.same(calls[1]?.ids, ['c', 'd'], 'the queued items go together once the first write settled');
  calls[1]!.fail(new Error('disk full'));
  await t.rejects(c, /disk full/, 'a failed write rejects every item of its batch');
  await t.rejects(d, /disk full/);
  const e = put({ id: 'e' });
  await tick();
  t.same(calls[2]?.ids, ['e'], 'and the writer goes on after a failure');
  calls[2]!.answer(['e']);
  t.equal(await e, true);
});

t.test('percentiles of nothing are NaN, not 0', (t) => {
  const p = percentiles([]);
  t.ok(Number.isNaN(p.p50Ms) && Number.isNaN(p.p99Ms), JSON.stringify(p));
  t.same(percentiles([5]), { p50Ms: 5, p99Ms: 5 });
  t.end();
});
