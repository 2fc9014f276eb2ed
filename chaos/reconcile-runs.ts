/**
 * The chaos run's `reconcile --once` processes during the fault phase, one after another, each in one of
 * three seeded modes (mid-readback until the first such kill succeeded, so even a short run has one):
 *
 *   crash point  -> SIGKILLs itself at `reconcile_after_readback` or `reconcile_after_commit` (the Nth time)
 *   mid-readback -> the readback relay is paused first, so the run's first readback hangs; the moment the relay
 *                   accepts that readback's connection the pass is provably in progress (it holds the pass lock
 *                   and the operation's row lock inside its transaction), and the run SIGKILLs it there
 *   plain        -> runs to its end
 *
 * Only the reconciler reads back (the dispatchers never do), and the run's own reconciler starts after the
 * fault phase, so a connection to the relay while a mid-readback run is alive is that run's.
 */
import { spawn } from 'node:child_process';
import type { Rng } from './rng.js';
import type { TcpProxy } from './tcp-proxy.js';

export interface ReconcileRunStats {
  runs: number;
  /** SIGKILLed, by a crash point or by the run. */
  killed: number;
  /** Of those, SIGKILLed by the run while a readback of the pass was in progress. */
  killedMidPass: number;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

export async function reconcileRuns(o: {
  bin: string;
  env: NodeJS.ProcessEnv;
  rng: Rng;
  relay: TcpProxy;
  active: () => boolean;
  stats: ReconcileRunStats;
}): Promise<void> {
  const { rng, relay, stats } = o;
  while (o.active()) {
    const env: NodeJS.ProcessEnv = { ...o.env };
    const roll = rng.next();
    const mode =
      stats.killedMidPass === 0 ? 'mid-readback' : roll < 0.25 ? 'crash point' : roll < 0.65 ? 'mid-readback' : 'plain';
    if (mode === 'crash point') {
      env.ACTIONLEDGER_CRASH_POINTS_ENABLED = '1';
      env.ACTIONLEDGER_CRASH_AT = `${rng.pick(['reconcile_after_readback', 'reconcile_after_commit'])}:${rng.int(1, 5)}`;
    }
    const before = relay.stats.connections;
    if (mode === 'mid-readback') relay.pause();
    const child = spawn(process.execPath, [o.bin, 'reconcile', '--once', '--json'], {
      env,
      stdio: ['ignore', 'ignore', 'ignore'],
    });
    const exited = new Promise<string | null>((r) => child.once('exit', (_c, s) => r(s)));
    let killedHere = false;
    if (mode === 'mid-readback') {
      // A pass with nothing to read back ends on its own: no timer, which a loaded machine would outrun.
      let done = false;
      void exited.then(() => (done = true));
      while (!done && relay.stats.connections === before) await sleep(10);
      if (!done && relay.stats.connections > before) {
        killedHere = child.kill('SIGKILL');
      }
      relay.resume();
    }
    const signal = await exited;
    stats.runs++;
    if (signal === 'SIGKILL') stats.killed++;
    if (signal === 'SIGKILL' && killedHere) stats.killedMidPass++;
    await sleep(rng.int(500, 1500));
  }
}
