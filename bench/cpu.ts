/**
 * Where the machine's CPU went during a benchmark cell, from Linux procfs: the whole machine, this Node
 * process (all threads), and the PostgreSQL server's process tree (postmaster, live backends, and reaped ones
 * through the postmaster's cutime). What is left is load from other processes sharing the machine (interrupt
 * and softirq time, which procfs charges to no process, is left out of every figure). Every
 * figure is in cores (1.0 = one core busy for the whole cell); NaN where procfs or the server is not visible.
 */
import { readFileSync, readdirSync } from 'node:fs';
import { cpus } from 'node:os';
import pg from 'pg';

interface ProcTicks {
  ppid: number;
  /** utime + stime + cutime + cstime, clock ticks. */
  ticks: number;
}

function procTicks(pid: number | string): ProcTicks | null {
  try {
    const raw = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = raw.slice(raw.lastIndexOf(')') + 2).split(' ');
    // After the command: state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17); index = field - 3.
    return { ppid: Number(f[1]), ticks: Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14]) };
  } catch {
    return null;
  }
}

/** Busy (user, nice, system: time charged to processes) and total ticks over all CPUs. */
function machineTicks(): { busy: number; total: number } | null {
  try {
    // user nice system idle iowait irq softirq steal (guest time is already inside user)
    const f = (readFileSync('/proc/stat', 'utf8').split('\n')[0] ?? '').trim().split(/\s+/).slice(1, 9).map(Number);
    const total = f.reduce((a, b) => a + b, 0);
    return { busy: (f[0] ?? 0) + (f[1] ?? 0) + (f[2] ?? 0), total };
  } catch {
    return null;
  }
}

function treeTicks(root: number): number {
  let sum = procTicks(root)?.ticks ?? NaN;
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const p = procTicks(Number(name));
    if (p !== null && p.ppid === root) sum += p.ticks;
  }
  return sum;
}

/** The postmaster's pid when the server runs on this machine and its processes are visible, else null. */
export async function findPostmaster(url: string): Promise<number | null> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    const { rows } = await c.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
    const backend = rows[0]?.pid;
    const me = backend === undefined ? null : procTicks(backend);
    return me === null ? null : me.ppid;
  } finally {
    await c.end();
  }
}

export interface CpuSplit {
  machineCores: number;
  /** This Node process, all threads (the sandbox thread included). */
  nodeCores: number;
  /** The one thread `cpuSplit` was given (the sandbox servers'), inside nodeCores; NaN without one. */
  threadCores: number;
  postgresCores: number;
  otherCores: number;
}

/** Starts measuring; the returned function gives the split since then. */
export function cpuSplit(postmaster: number | null, thread: number | null = null): () => CpuSplit {
  const n = cpus().length;
  const threadTicks = (): number => (thread === null ? NaN : (procTicks(`self/task/${thread}`)?.ticks ?? NaN));
  const m0 = machineTicks();
  const node0 = procTicks('self')?.ticks ?? NaN;
  const thread0 = threadTicks();
  const pg0 = postmaster === null ? NaN : treeTicks(postmaster);
  return () => {
    const m1 = machineTicks();
    if (m0 === null || m1 === null || m1.total === m0.total)
      return { machineCores: NaN, nodeCores: NaN, threadCores: NaN, postgresCores: NaN, otherCores: NaN };
    const perCore = (m1.total - m0.total) / n; // elapsed ticks of one core
    const machineCores = (m1.busy - m0.busy) / perCore;
    const nodeCores = ((procTicks('self')?.ticks ?? NaN) - node0) / perCore;
    const threadCores = (threadTicks() - thread0) / perCore;
    const postgresCores = postmaster === null ? NaN : (treeTicks(postmaster) - pg0) / perCore;
    return {
      machineCores,
      nodeCores,
      threadCores,
      postgresCores,
      otherCores: machineCores - nodeCores - (Number.isNaN(postgresCores) ? 0 : postgresCores),
    };
  };
}

/**
 * Waits (at most `maxMs`) for a half-second window in which other processes use less than `threshold`
 * cores; returns the other load of the last window. The machines are shared: this keeps a neighbour's test
 * run out of the measurement when it can, and says so when it cannot.
 */
export async function waitForQuiet(postmaster: number | null, maxMs: number, threshold = 0.3): Promise<number> {
  const deadline = Date.now() + maxMs;
  for (;;) {
    const split = cpuSplit(postmaster);
    await new Promise((r) => setTimeout(r, 500));
    const other = split().otherCores;
    if (!(other >= threshold) || Date.now() >= deadline) return other;
  }
}
