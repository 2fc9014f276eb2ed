/**
 * Wake-ups within one process: a reservation committed by this process reaches a dispatcher of this process
 * without the NOTIFY round trip through PostgreSQL (a query to send it, the server's signal to the listening
 * backend, and that backend's message back). Measured: reservation commit -> claim at one in flight, see
 * docs/performance.md "Waking the dispatchers".
 *
 * Channels are the outbox NOTIFY channels (`<schema>_outbox`). A subscriber of another database with the same
 * schema name gets a wake-up that is not its own: it claims, finds nothing, and that costs one claim statement.
 * NOTIFY stays the wake-up across processes, and the dispatchers' poll covers both being lost.
 *
 * A listener answers whether it takes the wake-up: it will claim the operation that caused it, with a slot no
 * earlier wake-up took. When one of the same database does, the ledger leaves the NOTIFY out
 * (ledger/notifier.ts): every dispatcher of every other process would wake for it, claim, and find nothing this
 * one did not take first. The database is told by the pools' connection settings ({@link databaseKey}): two
 * pools that reach one database by different settings never suppress each other's NOTIFY, they only send it.
 */
import { createHash, randomBytes } from 'node:crypto';
import type pg from 'pg';

/**
 * Called on each wake-up of its channel, with the operation that caused it when there is exactly one; true when
 * it takes that operation (see the module comment).
 */
type Listener = (operationId?: string) => boolean | void;

/** Which database a pool's connections reach, as far as its settings tell (a hash: URLs may hold passwords). */
export function databaseKey(pool: pg.Pool): string {
  const o = pool.options as { connectionString?: string; host?: string; port?: number; database?: string };
  const settings = JSON.stringify([o.connectionString ?? null, o.host ?? null, o.port ?? null, o.database ?? null]);
  return createHash('sha256').update(settings).digest('hex');
}

/**
 * This process's mark, sent as the payload of the NOTIFY it sends after waking its own listeners: a listener
 * of this process that hears it has been woken already and skips the claim the NOTIFY would repeat.
 */
export const localWakeId = randomBytes(8).toString('hex');

/**
 * The NOTIFY on `channel` that wakes the other processes' dispatchers, with this process's mark, on `pool`.
 * Best effort by design: the dispatchers' poll covers a NOTIFY that never arrives.
 */
export function notifyOtherProcesses(pool: pg.Pool, channel: string): void {
  pool.query('SELECT pg_notify($1, $2)', [channel, localWakeId]).catch(() => undefined);
}

const listeners = new Map<string, Map<Listener, string>>();

/**
 * Calls every listener of `channel` in this process, synchronously; a listener that throws is skipped. Returns
 * true when a listener of `database` (a {@link databaseKey}) took `operationId` (never without one: a wake-up
 * for any number of operations cannot be taken).
 */
export function wakeLocal(channel: string, database: string, operationId?: string): boolean {
  const set = listeners.get(channel);
  if (set === undefined) return false;
  let taken = false;
  for (const [fn, db] of set) {
    try {
      // Only a listener of the same database is told the operation: it may take it.
      if (db !== database) fn();
      else if (fn(operationId) === true && operationId !== undefined) taken = true;
    } catch {
      // A wake-up is a hint: the poll and NOTIFY still reach the listener.
    }
  }
  return taken;
}

/** Subscribes `fn` to `channel`, for the dispatcher of `database` (a {@link databaseKey}); returns the unsubscribe. */
export function onLocalWake(channel: string, database: string, fn: Listener): () => void {
  let set = listeners.get(channel);
  if (set === undefined) {
    set = new Map();
    listeners.set(channel, set);
  }
  set.set(fn, database);
  return () => {
    const current = listeners.get(channel);
    if (current === undefined) return;
    current.delete(fn);
    if (current.size === 0) listeners.delete(channel);
  };
}
