/**
 * PostgreSQL access: the pool, transactions, the SQLSTATE mapping, and schema binding of query text.
 *
 * Runtime SQL lives as fixed constants in each component's `queries.ts`, written with the placeholder
 * `@schema.` before every object name. {@link bindQueries} replaces it once, at start, with the validated and
 * quoted schema name: the only dynamic part of any SQL text. Values always travel as `$n` parameters.
 */
import { createHash } from 'node:crypto';
import pg from 'pg';
import { ActionLedgerError } from './errors.js';

export type Queryable = Pick<pg.ClientBase, 'query'>;
export type Pool = pg.Pool;
export type PoolClient = pg.PoolClient;

/** SQLSTATE classes the code acts on; mapped here and nowhere else. */
export const SQLSTATE = {
  uniqueViolation: '23505',
  serializationFailure: '40001',
  deadlockDetected: '40P01',
  queryCanceled: '57014',
  adminShutdown: '57P01',
  duplicateDatabase: '42P04',
  duplicateSchema: '42P06',
  raiseException: 'P0001',
} as const;

export function sqlState(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code) ? code : undefined;
}

export function isRetryable(err: unknown): boolean {
  const state = sqlState(err);
  return state === SQLSTATE.serializationFailure || state === SQLSTATE.deadlockDetected;
}

/** Connection-level failures: the statement's outcome may be unknown, so callers re-read, never assume. */
export function isConnectionError(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code === 'string' && ['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'ENOTFOUND', 'EHOSTUNREACH'].includes(code)) return true;
  const state = sqlState(err);
  if (state !== undefined && (state.startsWith('08') || state === SQLSTATE.adminShutdown || state === '57P02' || state === '57P03')) return true;
  const message = (err as Error | null)?.message ?? '';
  return /Connection terminated|connection timeout|Client has encountered a connection error/.test(message);
}

export function createPool(url: string, options: { max: number; statementTimeoutMs: number; applicationName: string }): pg.Pool {
  const pool = new pg.Pool({
    connectionString: url,
    max: options.max,
    statement_timeout: options.statementTimeoutMs,
    application_name: options.applicationName,
    connectionTimeoutMillis: 10_000,
    keepAlive: true,
  });
  // An idle client's error (server restart, network) must not crash the process; the pool discards it.
  pool.on('error', () => undefined);
  return pool;
}

/**
 * Runs `fn` in a transaction on a client from the pool: COMMIT when it resolves, ROLLBACK when it throws.
 * A client whose connection broke is destroyed, not returned to the pool.
 */
export async function withTransaction<T>(pool: pg.Pool, fn: (client: pg.PoolClient) => Promise<T>): Promise<T> {
  const client = await pool.connect();
  let broken: unknown;
  try {
    await client.query('BEGIN');
    try {
      const result = await fn(client);
      await client.query('COMMIT');
      return result;
    } catch (err) {
      await client.query('ROLLBACK').catch((rollbackErr: unknown) => {
        broken = rollbackErr;
      });
      throw err;
    }
  } catch (err) {
    if (isConnectionError(err)) broken = err;
    throw err;
  } finally {
    client.release(broken instanceof Error ? broken : undefined);
  }
}

/**
 * A named (prepared) form of a bound query: each connection parses and plans it once, then only executes it.
 * For statements whose plan does not depend on table sizes (key lookups, `unnest` batches): PostgreSQL may
 * switch a prepared statement to a generic plan, which for a claim over a queue that swings in size can be a
 * sequential scan (PERFORMANCE.md), so claims stay unnamed. The name is the text's hash, so two schemas'
 * texts on one connection never collide.
 */
export function prepared(text: string): { name: string; text: string } {
  return { name: `al_${createHash('sha256').update(text).digest('hex').slice(0, 24)}`, text };
}

/** Replaces `@schema.` in every query text with the quoted schema name; see the module comment. */
export function bindQueries<T extends Record<string, string>>(queries: T, schemaQuoted: string): Readonly<T> {
  const out: Record<string, string> = {};
  for (const [name, text] of Object.entries(queries)) out[name] = text.replaceAll('@schema.', `${schemaQuoted}.`);
  return Object.freeze(out) as Readonly<T>;
}

/** Wraps a failure to reach the database in `database_unavailable`. */
export function databaseUnavailable(cause: unknown, what: string): ActionLedgerError {
  return new ActionLedgerError('database_unavailable', `cannot reach PostgreSQL (${what}): ${(cause as Error).message}`, { cause });
}
