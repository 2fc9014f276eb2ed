/** The one start/stop life (core/service.ts): start once, stop waits and is idempotent, errors surface. */
import t from 'tap';
import { Service } from '../../core/service.js';

/** A service whose start and stop each wait for the test to let them go, and count their calls. */
class Probe extends Service<[reason?: string]> {
  starts = 0;
  stops: (string | undefined)[] = [];
  failStart: Error | null = null;
  failStop: Error | null = null;
  #gate: Promise<void> = Promise.resolve();
  #open: () => void = () => undefined;

  hold(): void {
    this.#gate = new Promise((resolve) => (this.#open = resolve));
  }
  release(): void {
    this.#open();
  }
  protected async onStart(): Promise<void> {
    this.starts++;
    await this.#gate;
    if (this.failStart !== null) throw this.failStart;
  }
  protected async onStop(reason?: string): Promise<void> {
    this.stops.push(reason);
    await this.#gate;
    if (this.failStop !== null) throw this.failStop;
  }
}

t.test('start starts once: a second call while starting or running is the same promise', async (t) => {
  const s = new Probe();
  s.hold();
  const a = s.start();
  const b = s.start();
  t.equal(a, b);
  t.equal(s.lifecycle, 'starting');
  s.release();
  await a;
  t.equal(s.lifecycle, 'running');
  t.ok(s.running);
  await s.start();
  t.equal(s.starts, 1);
});

t.test('stop before any start resolves at once and stops nothing', async (t) => {
  const s = new Probe();
  await s.stop();
  t.same(s.stops, []);
  t.equal(s.lifecycle, 'idle');
});

t.test('stop waits for onStop, runs it once however often it is asked, and passes its arguments', async (t) => {
  const s = new Probe();
  await s.start();
  s.hold();
  let done = false;
  const a = s.stop('first').then(() => (done = true));
  const b = s.stop('second');
  await new Promise((r) => setTimeout(r, 20));
  t.notOk(done, 'not done while onStop runs');
  t.equal(s.lifecycle, 'stopping');
  s.release();
  await Promise.all([a, b]);
  t.same(s.stops, ['first'], 'once, with the first call arguments');
  t.equal(s.lifecycle, 'idle');
  await s.stop();
  t.same(s.stops, ['first'], 'a stop after the stop does nothing');
});

t.test('a stop asked for while starting waits for the start, then stops', async (t) => {
  const s = new Probe();
  s.hold();
  const started = s.start();
  const stopped = s.stop('early');
  t.equal(s.lifecycle, 'stopping');
  s.release();
  await started;
  await stopped;
  t.equal(s.starts, 1);
  t.same(s.stops, ['early']);
  t.equal(s.lifecycle, 'idle', 'never counted as running');
});

t.test('a failed start rejects with its failure, after onStop released what it took; it can start again', async (t) => {
  const s = new Probe();
  s.failStart = new Error('port taken');
  await t.rejects(s.start(), { message: 'port taken' });
  t.equal(s.stops.length, 1, 'onStop ran once for the failed start');
  t.equal(s.lifecycle, 'idle');
  await s.stop();
  t.equal(s.stops.length, 1, 'stopping a failed service stops nothing more');
  s.failStart = null;
  await s.start();
  t.equal(s.lifecycle, 'running');
  t.equal(s.starts, 2);
});

t.test('a failing stop rejects with its failure, and the service counts as stopped', async (t) => {
  const s = new Probe();
  await s.start();
  s.failStop = new Error('could not close');
  await t.rejects(s.stop(), { message: 'could not close' });
  t.equal(s.lifecycle, 'idle');
});

t.test('a stopped service starts again; a start asked for while stopping waits for that stop', async (t) => {
  const s = new Probe();
  await s.start();
  s.hold();
  const stopped = s.stop();
  const restarted = s.start();
  t.equal(s.starts, 1, 'not started before the stop is done');
  s.release();
  await stopped;
  await restarted;
  t.equal(s.starts, 2);
  t.equal(s.lifecycle, 'running');
  await s.stop();
});
