/**
 * The embedded PostgreSQL supervisor's waits between restart tries, what the probes say while it restarts, and
 * the configuration that sets the waits. The supervisor itself, with a real postmaster killed again and again,
 * is test/bin/embedded-supervisor.test.ts.
 */
import t from 'tap';
import { compileConfig } from '../../config/index.js';
import { embeddedProbeError, restartDelay, RESTART_INITIAL_MS, RESTART_MAX_MS } from '../../embedded/cluster.js';
import { isActionLedgerError } from '../../core/errors.js';

t.test('the wait doubles from the first, is capped, and its jitter takes at most a quarter off', (t) => {
  const backoff = { initialMs: 500, maxMs: 60_000 };
  const none = [1, 2, 3, 4, 5, 6, 7, 8, 9, 50].map((n) => restartDelay(n, backoff, 0));
  t.same(none, [500, 1000, 2000, 4000, 8000, 16_000, 32_000, 60_000, 60_000, 60_000], 'without jitter');
  const most = [1, 2, 8].map((n) => restartDelay(n, backoff, 0.999_999));
  t.same(most, [375, 750, 45_000], 'the most jitter takes a quarter off');
  // Below the cap, the shortest wait of a try is longer than the longest of the one before: the waits grow
  // whatever the jitter draws.
  for (let n = 1; n < 7; n++)
    t.ok(restartDelay(n + 1, backoff, 0.999_999) > restartDelay(n, backoff, 0), `try ${n + 1} waits longer than ${n}`);
  t.end();
});

t.test('the probes say database_restarting only while the cluster is down and being restarted', (t) => {
  t.equal(embeddedProbeError('restarting'), 'database_restarting');
  t.equal(embeddedProbeError('running'), null);
  t.equal(embeddedProbeError('stopped'), null, 'stopping is the service’s to say');
  t.equal(embeddedProbeError(undefined), null, 'a configured database: the probe asks it');
  t.end();
});

t.test('database.embedded_restart_initial_ms and _max_ms: defaults, compiled, and the cap not below the first', (t) => {
  const defaults = compileConfig({ tools: {} }, {});
  t.equal(defaults.database.embeddedRestartInitialMs, RESTART_INITIAL_MS);
  t.equal(defaults.database.embeddedRestartMaxMs, RESTART_MAX_MS);
  const set = compileConfig(
    { tools: {}, database: { embedded_restart_initial_ms: 100, embedded_restart_max_ms: 3200 } },
    {},
  );
  t.match(set.database, { embeddedRestartInitialMs: 100, embeddedRestartMaxMs: 3200 });
  try {
    compileConfig({ tools: {}, database: { embedded_restart_initial_ms: 5000, embedded_restart_max_ms: 1000 } }, {});
    t.fail('compiled');
  } catch (err) {
    t.ok(isActionLedgerError(err, 'config_invalid'));
    t.match((err as { details?: { issues?: unknown } }).details?.issues, [
      { path: '/database/embedded_restart_max_ms', message: /at least embedded_restart_initial_ms/ },
    ]);
  }
  t.end();
});
