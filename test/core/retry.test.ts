/**
 * retry(fn, policy): how many tries, how long it waits between them, which failures it gives up on at once,
 * and the abort signal. Real timers; the waits asserted are lower bounds and the upper bounds generous.
 */
import t from 'tap';
import { backoffMs, jitteredBackoffMs, retry, sleep } from '../../core/retry.js';
import { isTransient } from '../../core/sqlstate.js';

const pgError = (code: string): Error => Object.assign(new Error(`server says ${code}`), { code });

t.test('a transient failure is retried until the call succeeds, and its result returned', async (t) => {
  const seen: number[] = [];
  const result = await retry(
    (attempt) => {
      seen.push(attempt);
      if (attempt < 3) return Promise.reject(pgError('40001'));
      return Promise.resolve('done');
    },
    { tries: 5, baseDelayMs: 1, maxDelayMs: 2 },
  );
  t.equal(result, 'done');
  t.same(seen, [1, 2, 3], 'called with the attempt number, once per try');
});

t.test('the tries are a bound: the last failure is thrown after exactly `tries` calls', async (t) => {
  let calls = 0;
  const last = pgError('53100');
  await t.rejects(
    retry(
      () => {
        calls++;
        return Promise.reject(last);
      },
      { tries: 4, baseDelayMs: 1, maxDelayMs: 1 },
    ),
    last,
  );
  t.equal(calls, 4);
});

t.test('a failure that is not transient is thrown at once, without a retry', async (t) => {
  let calls = 0;
  const retried: unknown[] = [];
  const refused = pgError('23505');
  await t.rejects(
    retry(
      () => {
        calls++;
        return Promise.reject(refused);
      },
      { tries: 10, baseDelayMs: 1, maxDelayMs: 1, onRetry: (err) => retried.push(err) },
    ),
    refused,
  );
  t.equal(calls, 1);
  t.same(retried, [], 'onRetry is told only about failures that will be retried');
});

t.test('a policy can narrow what is retried', async (t) => {
  let calls = 0;
  await t.rejects(
    retry(
      () => {
        calls++;
        return Promise.reject(Object.assign(new Error('Connection terminated unexpectedly'), {}));
      },
      { tries: 5, baseDelayMs: 1, maxDelayMs: 1, retryOn: (err) => isTransient(err) && calls > 99 },
    ),
  );
  t.equal(calls, 1);
});

t.test(
  'the one definition of transient: connection, conflicts, timeouts and exhausted resources; not refusals',
  (t) => {
    for (const code of ['40001', '40P01', '57014', '57P01', '08006', '53100', '53300', '25006', '58030'])
      t.ok(isTransient(pgError(code)), code);
    t.ok(isTransient(new Error('Connection terminated unexpectedly')), 'a lost connection');
    for (const code of ['23505', '42P01', 'P0001', '22P02']) t.notOk(isTransient(pgError(code)), code);
    t.notOk(isTransient(new Error('a bug')));
    t.end();
  },
);

t.test('a jittered wait takes at most its share off, never below 1 ms, and the share 0 is no jitter', (t) => {
  const policy = { baseDelayMs: 100, maxDelayMs: 800, jitter: 0.25 };
  t.same(
    [1, 2, 3, 4].map((a) => backoffMs(policy, a, () => 0)),
    [100, 200, 400, 800],
    'random 0 takes nothing off',
  );
  t.same(
    [1, 2, 3, 4].map((a) => backoffMs(policy, a, () => 0.999_999)),
    [75, 150, 300, 600],
    'at most a quarter off',
  );
  t.equal(
    backoffMs({ baseDelayMs: 1, maxDelayMs: 1, jitter: 1 }, 1, () => 0.999_999),
    1,
    'never 0',
  );
  t.equal(
    backoffMs({ baseDelayMs: 100, maxDelayMs: 800, jitter: 0 }, 2, () => 0.9),
    200,
    'jitter 0',
  );
  for (let i = 0; i < 200; i++) {
    const half = jitteredBackoffMs({ baseDelayMs: 100, maxDelayMs: 800 }, 3);
    if (half < 200 || half > 400) t.fail(`jitteredBackoffMs gave ${half}, outside [200, 400]`);
  }
  t.end();
});

t.test('waits double from the base and are capped', async (t) => {
  const policy = { baseDelayMs: 100, maxDelayMs: 800 };
  t.same(
    [1, 2, 3, 4, 5, 6, 100].map((a) => backoffMs(policy, a)),
    [100, 200, 400, 800, 800, 800, 800],
  );
  // Observed: three failures with a 30 ms base wait at least 30 + 60 + 60 (capped) ms in all.
  const started = performance.now();
  let calls = 0;
  await retry(
    () => {
      if (++calls <= 3) return Promise.reject(pgError('40P01'));
      return Promise.resolve();
    },
    { tries: 5, baseDelayMs: 30, maxDelayMs: 60 },
  );
  const elapsed = performance.now() - started;
  t.ok(elapsed >= 145, `waited ${elapsed.toFixed(0)} ms, at least the three backoffs`);
  t.ok(elapsed < 5_000, 'and not unboundedly more');
});

t.test('an abort ends the retries during a wait and rejects with the signal reason', async (t) => {
  const halt = new AbortController();
  class Halted extends Error {}
  let calls = 0;
  const running = retry(
    () => {
      calls++;
      if (calls === 1) setTimeout(() => halt.abort(new Halted('stopped')), 20);
      return Promise.reject(pgError('53100'));
    },
    { tries: Infinity, baseDelayMs: 60_000, maxDelayMs: 60_000, signal: halt.signal },
  );
  const err = await running.then(
    () => undefined,
    (e: unknown) => e,
  );
  t.ok(err instanceof Halted, 'the reason, not the last failure');
  t.equal(calls, 1, 'no call after the abort');
});

t.test('an aborted signal stops retry before the first call, and sleep at once', async (t) => {
  const halt = new AbortController();
  halt.abort(new Error('already stopped'));
  let calls = 0;
  await t.rejects(
    retry(
      () => {
        calls++;
        return Promise.resolve();
      },
      { tries: 3, baseDelayMs: 1, maxDelayMs: 1, signal: halt.signal },
    ),
    { message: 'already stopped' },
  );
  t.equal(calls, 0);
  await t.rejects(sleep(60_000, halt.signal), { message: 'already stopped' });
});
