/**
 * Wake-ups within one process: a reservation committed by this process reaches a dispatcher of this process
 * without the NOTIFY round trip through PostgreSQL (a query to send it, the server's signal to the listening
 * backend, and that backend's message back). Measured: reservation commit -> claim at one in flight, see
 * docs/architecture.md "Waking the dispatchers".
 *
 * Channels are the outbox NOTIFY channels (`<schema>_outbox`). A subscriber of another database with the same
 * schema name gets a wake-up that is not its own: it claims, finds nothing, and that costs one claim statement.
 * NOTIFY stays the wake-up across processes, and the dispatchers' poll covers both being lost.
 *
 * A listener answers whether it takes the wake-up: it will claim the operation that caused it, with a slot no
 * earlier wake-up took. When one does, the ledger leaves the NOTIFY out (ledger/notifier.ts): every dispatcher
 * of every other process would wake for it, claim, and find nothing this one did not take first.
 */
import { randomBytes } from 'node:crypto';

/** Called on each wake-up of its channel; true when it takes it (see the module comment). */
type Listener = () => boolean | void;

/**
 * This process's mark, sent as the payload of the NOTIFY it sends after waking its own listeners: a listener
 * of this process that hears it has been woken already and skips the claim the NOTIFY would repeat.
 */
export const localWakeId = randomBytes(8).toString('hex');

const listeners = new Map<string, Set<Listener>>();

/**
 * Calls every listener of `channel` in this process, synchronously; a listener that throws is skipped. Returns
 * true when one of them took the wake-up.
 */
export function wakeLocal(channel: string): boolean {
  const set = listeners.get(channel);
  if (set === undefined) return false;
  let taken = false;
  for (const fn of set) {
    try {
      if (fn() === true) taken = true;
    } catch {
      // A wake-up is a hint: the poll and NOTIFY still reach the listener.
    }
  }
  return taken;
}

/** Subscribes `fn` to `channel`; returns the unsubscribe. */
export function onLocalWake(channel: string, fn: Listener): () => void {
  let set = listeners.get(channel);
  if (set === undefined) {
    set = new Set();
    listeners.set(channel, set);
  }
  set.add(fn);
  return () => {
    const current = listeners.get(channel);
    if (current === undefined) return;
    current.delete(fn);
    if (current.size === 0) listeners.delete(channel);
  };
}
