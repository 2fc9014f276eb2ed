/**
 * The service lock: `<data dir>/service.pid`, a JSON file naming the pid and address of the one
 * `actionledger start` that owns this data folder (and so its embedded cluster). It is created with `wx`
 * (atomic: one of two starts wins), checked for liveness by whoever finds it, and taken over when its holder
 * is gone. CLI commands only read it: a cluster they started is left running for a live service that adopted it.
 */
import { existsSync, mkdirSync, readFileSync, renameSync, unlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ActionLedgerError } from '../core/errors.js';

export interface ServiceLockHolder {
  pid: number;
  address: string | null;
}

export interface ServiceLock {
  /** Records the address the service listens on, for the `already_running` message of a second start. */
  setAddress(address: string): void;
  /** Removes the lock if this process still holds it; safe to repeat. */
  release(): void;
}

const FILE = 'service.pid';

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EPERM') return false;
  }
  // After a reboot the pid may belong to anything: where /proc tells, it must be a node process of ours.
  const cmdline = `/proc/${pid}/cmdline`;
  if (!existsSync(cmdline)) return true;
  try {
    return /actionledger/.test(readFileSync(cmdline, 'utf8'));
  } catch {
    return true;
  }
}

function read(path: string): ServiceLockHolder | null {
  try {
    const value = JSON.parse(readFileSync(path, 'utf8')) as { pid?: unknown; address?: unknown };
    if (typeof value.pid !== 'number') return null;
    return { pid: value.pid, address: typeof value.address === 'string' ? value.address : null };
  } catch {
    return null;
  }
}

/** The live service holding `dataDir`, or null (no lock file, or its holder is gone). */
export function runningService(dataDir: string): ServiceLockHolder | null {
  const holder = read(join(dataDir, FILE));
  return holder !== null && holder.pid !== process.pid && isAlive(holder.pid) ? holder : null;
}

/**
 * Takes the service lock of `dataDir` for this process. A stale lock (its pid gone) is taken over: renamed
 * aside first, so of two starts that found the same stale file only one removes it, and the other's `wx`
 * create then loses to the winner's file.
 *
 * @throws ActionLedgerError `already_running` (details: pid, address) when a live service holds it.
 */
export function acquireServiceLock(dataDir: string): ServiceLock {
  mkdirSync(dataDir, { recursive: true, mode: 0o711 });
  const path = join(dataDir, FILE);
  let address: string | null = null;
  const write = (flag: 'wx' | 'w'): void =>
    writeFileSync(path, JSON.stringify({ pid: process.pid, address, started_at: new Date().toISOString() }) + '\n', {
      flag,
      mode: 0o644,
    });
  for (let attempt = 0; ; attempt++) {
    try {
      write('wx');
      break;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST' || attempt >= 3) throw err;
    }
    const holder = read(path);
    if (holder !== null && holder.pid !== process.pid && isAlive(holder.pid)) {
      const where = holder.address === null ? 'still starting' : `listening on ${holder.address}`;
      throw new ActionLedgerError(
        'already_running',
        `actionledger is already running on data folder ${dataDir} (pid ${holder.pid}, ${where})`,
        {
          details: { pid: holder.pid, address: holder.address, data_dir: dataDir },
        },
      );
    }
    try {
      renameSync(path, `${path}.stale-${process.pid}`);
      unlinkSync(`${path}.stale-${process.pid}`);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    }
  }
  let held = true;
  return {
    setAddress(a) {
      address = a;
      if (held) write('w');
    },
    release() {
      if (!held) return;
      held = false;
      if (read(path)?.pid === process.pid) unlinkSync(path);
    },
  };
}
