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
  /** Holds onStop alone, and tells when onStop was entered. */
  stopGate: Promise<void> = Promise.resolve();
  stopEntered: Promise<void> = new Promise(() => undefined);
  #entered: () => void = () => undefined;

  hold(): void {
    this.#gate = new Promise((resolve) => (this.#open = resolve));
  }
  release(): void {
    this.#open();
  }
  armStopEntered(): void {
    this.stopEntered = new Promise((resolve) => (this.#entered = resolve));
  }
  protected async onStart(): Promise<void> {
    this.starts++;
    const fail = this.failStart;
    await this.#gate;
    if (fail !== null) throw fail;
  }
  protected async onStop(reason?: string): Promise<void> {
    this.stops.push(reason);
    this.#entered();
    await this.stopGate;
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

t.test('the last call wins: stop, start, stop in a row ends stopped, each run in order', async (t) => {
  const s = new Probe();
  await s.start();
  s.hold();
  const a = s.stop('a');
  const b = s.start();
  const c = s.stop('c');
  t.equal(s.lifecycle, 'stopping');
  s.release();
  await Promise.all([a, b, c]);
  t.equal(s.starts, 2, 'the start between the stops ran');
  t.same(s.stops, ['a', 'c'], 'and the last stop after it');
  t.equal(s.lifecycle, 'idle');
});

t.test(
  'a start asked for while a failed start cleans up is that start: it fails with it, never runs beside it',
  async (t) => {
    const s = new Probe();
    s.failStart = new Error('no');
    let letStop!: () => void;
    s.stopGate = new Promise((resolve) => (letStop = resolve));
    s.armStopEntered();
    const first = s.start();
    await s.stopEntered;
    // The failed start's onStop is running when the second start is asked for.
    s.failStart = null;
    const second = s.start();
    t.equal(second, first, 'the start in progress');
    t.equal(s.starts, 1, 'nothing started beside the cleanup');
    s.stopGate = Promise.resolve();
    letStop();
    await t.rejects(second, { message: 'no' });
    t.equal(s.lifecycle, 'idle');
    t.equal(s.stops.length, 1, 'one cleanup, for the failed start');
    await s.start();
    t.equal(s.starts, 2, 'a start after it runs');
    t.equal(s.lifecycle, 'running');
    await s.stop('end');
    t.same(s.stops.slice(1), ['end'], 'and stops');
    t.equal(s.lifecycle, 'idle');
  },
);
