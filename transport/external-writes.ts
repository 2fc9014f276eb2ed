/**
 * The external-write scope (shared by the dispatcher's provider call and the reconciler's readback). A provider
 * call is only legitimate as the last step of the dispatch pipeline (claimed, route re-resolved, freshly
 * authorized, evidence recorded), so the provider HTTP client is handed out only as a
 * {@link guardExternalWrite}-wrapped function, and that function refuses to run outside a scope opened by
 * {@link withExternalWrites}. A refusal throws `ungated_external_write` and calls the caller's counter callback,
 * so a stray call site shows up on a dashboard instead of quietly sending a refund.
 *
 * How: AsyncLocalStorage carries a per-open token (a fresh object each time a scope opens), and a module-level
 * set holds the tokens of the scopes open right now. A call is allowed only when the token it sees is still in
 * the set. A bare "inside the scope" flag in the async context would not do: a timer, `setImmediate` or a
 * detached promise chain started inside the scope inherits that context and would keep the flag for its whole
 * life, long after the scope closed (the same escape as a Python contextvar inherited by `asyncio.create_task`). Such a
 * continuation still sees its token here, but the token has left the open set, so it is refused.
 *
 * Limits (what this does not prove):
 * - It is a guard against accidental and indirect calls, not a sandbox. Code that holds the raw undici Agent
 *   or Dispatcher, or calls `fetch`/`undici.request` itself, is not wrapped and not checked; keeping the raw
 *   client out of reach is the job of the module that builds it (hand out only guarded wrappers).
 * - Anyone who can import {@link withExternalWrites} can open a scope. It marks "this is a provider call site"
 *   (the dispatcher's send, the reconciler's readback); it does not prove the operation was claimed or
 *   authorized. Those are checked by the dispatcher pipeline.
 * - Work started inside a scope that runs while that scope is still open is allowed, even if it was detached
 *   (a fire-and-forget call that happens to run before the scope returns). Awaiting every call is the
 *   dispatcher's discipline, which the `no-floating-promises` lint rule enforces.
 * - Nested scopes: a continuation started in an inner scope is refused once the inner scope closes, even
 *   while the outer one is still open (stricter, never looser).
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import { ActionLedgerError } from '../core/errors.js';

/** An opaque, unforgeable scope identity: only this module creates them, and only this module's ALS holds them. */
interface ScopeToken {
  readonly id: number;
  readonly label: string | undefined;
}

const storage = new AsyncLocalStorage<ScopeToken>();
const openTokens = new Set<ScopeToken>();
let nextId = 0;

/**
 * Runs `fn` inside a new external-write scope and closes the scope when `fn` settles (returns, throws or rejects).
 * While open, guarded functions called from `fn`'s synchronous and awaited asynchronous work are allowed; once
 * closed, every continuation that carried the scope is refused. Concurrent scopes are independent: closing one
 * leaves the others open. `label` (for example the operation id) appears in refusal details. Never throws by
 * itself; rethrows whatever `fn` throws.
 */
export async function withExternalWrites<T>(fn: () => T | Promise<T>, label?: string): Promise<T> {
  const token: ScopeToken = Object.freeze({ id: ++nextId, label });
  openTokens.add(token);
  try {
    return await storage.run(token, fn);
  } finally {
    openTokens.delete(token);
  }
}

/** True when the current async context belongs to an external-write scope that is still open. */
export function externalWritesAllowed(): boolean {
  const token = storage.getStore();
  return token !== undefined && openTokens.has(token);
}

/**
 * Throws `ungated_external_write` unless called from inside an open external-write scope; calls `onRefused` (a metrics
 * counter, an alert) first. An exception from `onRefused` is swallowed so it cannot replace the refusal.
 */
export function assertExternalWriteAllowed(onRefused?: () => void): void {
  const token = storage.getStore();
  if (token !== undefined && openTokens.has(token)) return;
  try {
    onRefused?.();
  } catch {
    // the counter is best effort; the refusal below is what matters
  }
  const message =
    token === undefined
      ? 'external write outside the dispatcher gated scope'
      : 'external write from work that outlived its gated scope (a timer or detached promise started inside it)';
  throw new ActionLedgerError('ungated_external_write', message, {
    details:
      token === undefined
        ? { scope: 'none' }
        : { scope: 'closed', ...(token.label === undefined ? {} : { label: token.label }) },
  });
}

/**
 * Wraps a function (typically the provider HTTP call) so that every call first checks
 * {@link assertExternalWriteAllowed}. A refused call returns a rejected promise with `ungated_external_write` and never invokes `fn`.
 */
export function guardExternalWrite<TArgs extends unknown[], TResult>(
  fn: (...args: TArgs) => Promise<TResult>,
  onRefused?: () => void,
): (...args: TArgs) => Promise<TResult> {
  return async (...args: TArgs): Promise<TResult> => {
    assertExternalWriteAllowed(onRefused);
    return fn(...args);
  };
}

/** How many scopes are open right now (for tests and a debug gauge). */
export function openExternalWriteScopeCount(): number {
  return openTokens.size;
}
