/**
 * The batcher on its own (dispatcher/batcher.ts): how many batches are in their opening phase at once, which
 * items form each batch, how a failed opening settles its items, and the rule a worker's batchers follow
 * (`batchOpenings`: two openings while at most half its slots are taken, one above). Their database behaviour
 * is in batching.test.ts and busy-rows.test.ts.
 */
import t from 'tap';
import { Batcher, BATCH_OPENINGS, batchOpenings, submit } from '../../dispatcher/batcher.js';

interface Item {
  id: string;
  resolve: (value: never) => void;
  reject: (reason: unknown) => void;
}

/** An opening that records its items and ends when the test says so (settling them, or failing). */
function controlledOpen() {
  const opened: { ids: string[]; end: () => void; fail: (err: Error) => void }[] = [];
  const open = (items: Item[]): Promise<void> =>
    new Promise((done, fail) =>
      opened.push({
        ids: items.map((i) => i.id),
        end: () => {
          for (const i of items) i.resolve(undefined as never);
          done();
        },
        fail,
      }),
    );
  return { opened, open };
}

const tick = (): Promise<void> => new Promise((r) => setImmediate(r));
const ids = (opened: { ids: string[] }[]) => opened.map((o) => o.ids);

t.test('by default two batches open at once; what arrives while both are open forms the next', async (t) => {
  t.equal(BATCH_OPENINGS, 2);
  const { opened, open } = controlledOpen();
  const b = new Batcher<Item>(16, open);
  const a = submit(b, { id: 'a' });
  await tick();
  t.same(ids(opened), [['a']], 'a lone item opens a batch of one at once');
  const second = submit(b, { id: 'b' });
  await tick();
  t.same(ids(opened), [['a'], ['b']], 'an item arriving during the first opening opens a second batch at once');
  const rest = ['c', 'd', 'e'].map((id) => submit(b, { id }));
  await tick();
  t.equal(opened.length, 2, 'no third opening while two are open');
  opened[1]!.end();
  await second;
  await tick();
  t.same(opened[2]?.ids, ['c', 'd', 'e'], 'the items that queued meanwhile open together when a slot frees');
  opened[0]!.end();
  opened[2]!.end();
  await Promise.all([a, ...rest]);
});

t.test('one opening: an item waits for the batch in its opening phase', async (t) => {
  const { opened, open } = controlledOpen();
  const b = new Batcher<Item>(16, open, 1);
  const a = submit(b, { id: 'a' });
  const c = submit(b, { id: 'b' });
  const d = submit(b, { id: 'c' });
  await tick();
  t.same(ids(opened), [['a']], 'the first item opens at once, alone');
  opened[0]!.end();
  await a;
  await tick();
  t.same(opened[1]?.ids, ['b', 'c'], 'the items that waited open together');
  opened[1]!.end();
  await Promise.all([c, d]);
});

t.test("a worker's batchers open a second batch only while at most half its slots are taken", (t) => {
  t.equal(batchOpenings(0, 32), 2, 'idle');
  t.equal(batchOpenings(16, 32), 2, 'half the slots taken');
  t.equal(batchOpenings(17, 32), 1, 'more than half');
  t.equal(batchOpenings(32, 32), 1, 'every slot');
  t.equal(batchOpenings(1, 2), 2, 'one of two');
  t.equal(batchOpenings(2, 2), 1, 'two of two');
  t.equal(batchOpenings(1, 1), 1, 'a worker of one slot never has a second item to open for');
  t.end();
});

t.test('openings given as a function are asked each time a batch could open', async (t) => {
  const { opened, open } = controlledOpen();
  let openings = 1;
  const b = new Batcher<Item>(16, open, () => openings);
  const a = submit(b, { id: 'a' });
  const bb = submit(b, { id: 'b' });
  await tick();
  t.same(ids(opened), [['a']], 'with one opening allowed, the second item waits');
  openings = 2;
  const c = submit(b, { id: 'c' });
  await tick();
  t.same(ids(opened), [['a'], ['b', 'c']], 'allowed two, the next arrival opens a second batch with what waited');
  openings = 1;
  const d = submit(b, { id: 'd' });
  opened[1]!.end();
  await Promise.all([bb, c]);
  await tick();
  t.equal(opened.length, 2, 'back to one: with the first batch still open, nothing else opens');
  openings = 0;
  opened[0]!.end();
  await a;
  await tick();
  t.same(opened[2]?.ids, ['d'], 'an answer below one counts as one: the queue never stalls');
  opened[2]!.end();
  await d;
});

t.test('poke opens what the openings allow now; an answer that is not a number counts as one', async (t) => {
  const { opened, open } = controlledOpen();
  let openings: () => number = () => 1;
  const b = new Batcher<Item>(1, open, () => openings());
  const items = ['a', 'b', 'c', 'd'].map((id) => submit(b, { id }));
  await tick();
  t.same(ids(opened), [['a']], 'one opening: one batch of one (max 1)');
  openings = () => 3;
  b.poke();
  await tick();
  t.same(ids(opened), [['a'], ['b'], ['c']], 'allowed three, a poke opens two more at once');
  for (const o of opened) o.end();
  await Promise.all(items.slice(0, 3));
  await tick();
  t.same(opened[3]?.ids, ['d'], 'the last one opens as a batch ends');
  openings = () => NaN;
  const e = submit(b, { id: 'e' });
  const f = submit(b, { id: 'f' });
  await tick();
  t.equal(opened.length, 4, 'NaN counts as one: with d open, e waits');
  openings = () => {
    throw new Error('no answer');
  };
  b.poke();
  await tick();
  t.equal(opened.length, 4, 'a throw counts as one too');
  opened[3]!.end();
  await tick();
  t.same(opened[4]?.ids, ['e'], 'and the queue moves on');
  opened[4]!.end();
  await tick();
  opened[5]!.end();
  await Promise.all([...items, e, f]);
});

t.test('a batch holds at most max items; the rest wait for the next slot', async (t) => {
  const { opened, open } = controlledOpen();
  const b = new Batcher<Item>(3, open);
  const all = Array.from({ length: 9 }, (_, n) => submit(b, { id: String(n) }));
  await tick();
  t.same(ids(opened), [['0'], ['1']], 'the first two items take the two openings');
  opened[0]!.end();
  await tick();
  t.same(opened[2]?.ids, ['2', '3', '4'], 'a freed slot takes max of the waiting items');
  opened[1]!.end();
  await tick();
  t.same(opened[3]?.ids, ['5', '6', '7']);
  opened[2]!.end();
  await tick();
  t.same(opened[4]?.ids, ['8']);
  opened[3]!.end();
  opened[4]!.end();
  await Promise.all(all);
});

t.test('a failed opening rejects each of its items, frees its slot, and leaves the other batch alone', async (t) => {
  const { opened, open } = controlledOpen();
  const b = new Batcher<Item>(16, open);
  const a = submit(b, { id: 'a' });
  const c = submit(b, { id: 'c' });
  const x = submit(b, { id: 'x' });
  const y = submit(b, { id: 'y' });
  await tick();
  opened[0]!.end();
  await a;
  await tick();
  t.same(ids(opened), [['a'], ['c'], ['x', 'y']], 'x and y open together beside c');
  const waiting = submit(b, { id: 'w' });
  await tick();
  t.equal(opened.length, 3, 'w waits: both openings are busy');
  opened[2]!.fail(new Error('disk full'));
  await t.rejects(x, /disk full/, 'every item of the failed batch is rejected');
  await t.rejects(y, /disk full/);
  await tick();
  t.same(opened[3]?.ids, ['w'], 'its slot went to the waiting item');
  opened[1]!.end();
  opened[3]!.end();
  await Promise.all([c, waiting]);
  t.pass('the other batch and the next one settle normally');
});

t.test('under a random load: never more openings than allowed, every item opened exactly once', async (t) => {
  let seed = 7;
  const random = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
  for (const openings of [1, 2, 3]) {
    let open = 0;
    let most = 0;
    const seen = new Map<string, number>();
    const b = new Batcher<Item>(
      4,
      async (items) => {
        open += 1;
        most = Math.max(most, open);
        for (const i of items) seen.set(i.id, (seen.get(i.id) ?? 0) + 1);
        await new Promise((r) => setTimeout(r, Math.floor(random() * 3)));
        open -= 1;
        for (const i of items) i.resolve(undefined as never);
      },
      openings,
    );
    const all: Promise<void>[] = [];
    for (let n = 0; n < 200; n++) {
      all.push(submit(b, { id: String(n) }));
      if (random() < 0.3) await new Promise((r) => setTimeout(r, Math.floor(random() * 2)));
    }
    await Promise.all(all);
    t.equal(most, openings, `${openings} opening(s): reached, never exceeded`);
    t.equal(seen.size, 200);
    t.ok(
      [...seen.values()].every((n) => n === 1),
      'each item in exactly one batch',
    );
  }
});
