/**
 * The one place SQLSTATE codes and pg's connection failures are read. `db/db.ts` re-exports these for the
 * components; `core/errors.ts` uses {@link databaseErrorCode} to turn a raw database failure into a coded
 * error, so no caller ever sees `internal` (or a stack) for a database that is down, full or slow.
 *
 * Imports nothing, so both of those modules can depend on it.
 */

/** SQLSTATE values the code acts on. */
export const SQLSTATE = {
  foreignKeyViolation: '23503',
  uniqueViolation: '23505',
  readOnlyTransaction: '25006',
  /** A named statement the session does not hold (reset by DISCARD or DEALLOCATE, or a pooler moved the session). */
  invalidStatementName: '26000',
  /** Among others: a cached plan whose result columns a migration changed ("cached plan must not change result type"). */
  featureNotSupported: '0A000',
  serializationFailure: '40001',
  deadlockDetected: '40P01',
  diskFull: '53100',
  outOfMemory: '53200',
  tooManyConnections: '53300',
  configurationLimitExceeded: '53400',
  queryCanceled: '57014',
  adminShutdown: '57P01',
  crashShutdown: '57P02',
  cannotConnectNow: '57P03',
  ioError: '58030',
  duplicateDatabase: '42P04',
  duplicateSchema: '42P06',
  raiseException: 'P0001',
  /** Raised by the operations trigger of migration 0007 for a status change the legal table does not hold. */
  illegalTransition: 'P0T01',
} as const;

/** The SQLSTATE of a pg error, or undefined for anything else. */
export function sqlState(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code) ? code : undefined;
}

/** Serialization failure or deadlock: the transaction did nothing and may be run again as it was. */
export function isRetryable(err: unknown): boolean {
  const state = sqlState(err);
  return state === SQLSTATE.serializationFailure || state === SQLSTATE.deadlockDetected;
}

const SOCKET_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'EPIPE',
  'ETIMEDOUT',
  'ENOTFOUND',
  'EHOSTUNREACH',
  'EAI_AGAIN',
]);

/** Connection-level failures: the statement's outcome may be unknown, so callers re-read, never assume. */
export function isConnectionError(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code === 'string' && SOCKET_CODES.has(code)) return true;
  const state = sqlState(err);
  if (
    state !== undefined &&
    (state.startsWith('08') ||
      state === SQLSTATE.adminShutdown ||
      state === SQLSTATE.crashShutdown ||
      state === SQLSTATE.cannotConnectNow)
  )
    return true;
  const message = (err as Error | null)?.message ?? '';
  return /Connection terminated|connection timeout|Client has encountered a connection error|timeout exceeded when trying to connect/.test(
    message,
  );
}

/**
 * Failures that pass by themselves: a lost connection, a serialization failure or deadlock, a statement
 * timeout, or the server out of a resource (disk, memory, connections). A write that failed with one of these
 * is worth repeating later; what it must not be is assumed to have failed (for a lost connection it may have
 * committed) or treated as a verdict on the operation.
 *
 * This is the one definition of a transient failure; core/retry.ts retries on it, and a policy may only narrow
 * it. 57014 (`query_canceled`: statement_timeout, or an operator's pg_cancel_backend) is transient on purpose: the
 * canceled statement was rolled back with certainty, so repeating it is safe, and what makes a statement run
 * past the timeout (lock waits, an overloaded server) passes. A statement that always times out is a bug that
 * the policies' bounds and the repeated-failure log surface; it must not be mistaken for a verdict on an
 * operation (a refusal or a review).
 */
export function isTransient(err: unknown): boolean {
  if (isConnectionError(err) || isRetryable(err)) return true;
  const state = sqlState(err);
  return (
    state === SQLSTATE.queryCanceled ||
    state === SQLSTATE.readOnlyTransaction ||
    state === SQLSTATE.ioError ||
    (state !== undefined && state.startsWith('53'))
  );
}

/** The coded error a database failure becomes; see docs/errors.md. */
export type DatabaseErrorCode =
  | 'database_unavailable'
  | 'storage_full'
  | 'statement_timeout'
  | 'database_overloaded'
  | 'database_conflict'
  | 'database_read_only'
  | 'illegal_transition'
  | 'database_error';

/**
 * Names a database failure by what an operator does about it, or undefined when `err` is not one (not a pg
 * error and not a connection failure).
 */
export function databaseErrorCode(err: unknown): DatabaseErrorCode | undefined {
  if (isConnectionError(err)) return 'database_unavailable';
  const state = sqlState(err);
  if (state === undefined) return undefined;
  if (state === SQLSTATE.diskFull || state === SQLSTATE.ioError) return 'storage_full';
  if (state === SQLSTATE.queryCanceled) return 'statement_timeout';
  if (state.startsWith('53')) return 'database_overloaded';
  if (isRetryable(err)) return 'database_conflict';
  if (state === SQLSTATE.readOnlyTransaction) return 'database_read_only';
  if (state === SQLSTATE.illegalTransition) return 'illegal_transition';
  return 'database_error';
}
