/**
 * PostgreSQL access: the pool, transactions, the SQLSTATE mapping, and schema binding of query text.
 *
 * Runtime SQL lives as fixed constants in each component's `queries.ts`, written with the placeholder
 * `@schema.` before every object name. {@link bindQueries} replaces it once, at start, with the validated and
 * quoted schema name: the only dynamic part of any SQL text. Values always travel as `$n` parameters.
 */
import { createHash } from 'node:crypto';
import pg from 'pg';
import { ActionLedgerError, asActionLedgerError } from '../core/errors.js';
import { isConnectionError } from '../core/sqlstate.js';

export type Queryable = Pick<pg.ClientBase, 'query'>;
export type Pool = pg.Pool;
export type PoolClient = pg.PoolClient;

export {
  CommitFailed,
  inOneWrite,
  parseConnectionString,
  PG_ADAPTER,
  queryThenCommit,
  type PgAdapterMode,
} from './pg-adapter.js';
export {
  SQLSTATE,
  sqlState,
  isRetryable,
  isConnectionError,
  isTransient,
  databaseErrorCode,
  type DatabaseErrorCode,
} from '../core/sqlstate.js';

export function createPool(
  url: string,
  options: {
    max: number;
    /**
     * Idle connections kept open however long they wait (pg-pool's `min`; above it they close after 10 s idle).
     * A dispatcher worker's pool keeps `dispatcherPoolFloor` of them: a connection opened in the middle of a
     * burst costs tens of milliseconds, and the operation that asked for it waits that long.
     */
    min?: number;
    statementTimeoutMs: number;
    applicationName: string;
    /**
     * False: this process's configuration names no notification destination, so its sessions write no
     * notification events (sql/0014). Left out: events are written.
     */
    notifications?: boolean;
  },
): pg.Pool {
  const pool = new pg.Pool({
    connectionString: url,
    ...(options.notifications === false ? { options: '-c actionledger.notifications=off' } : {}),
    max: options.max,
    ...(options.min === undefined ? {} : { min: Math.min(options.min, options.max) }),
    statement_timeout: options.statementTimeoutMs,
    application_name: options.applicationName,
    connectionTimeoutMillis: 10_000,
    // A statement issued while the one before it is still out is written at once instead of after its reply
    // (pg's pipeline mode): the server runs them in order, each with its own snapshot, so a caller that awaits
    // each statement sees no change, and one that issues several together (a dispatch batch's BEGIN, locks,
    // final check and savepoint) pays one round trip for them.
    pipeline: true,
    keepAlive: true,
    // The floor a pool keeps (`min`) may sit idle for hours: probe it long before a NAT or balancer forgets it.
    keepAliveInitialDelayMillis: 30_000,
  });
  // An idle client's error (server restart, network) must not crash the process; the pool discards it.
  pool.on('error', () => undefined);
  // Nor may a client's error while it is checked out with no listener of its own (between `connect()` and the
  // caller's listener, or held across awaits like a lock connection): it is then not queryable, its next
  // statement fails with a connection error, and pg-pool discards it on release.
  pool.on('connect', (client: pg.PoolClient) => client.on('error', () => undefined));
  return pool;
}

/**
 * Opens new connections so that `pool` has about `count` (never past its `max`): clients are checked out at once,
 * up to `count` counting those others hold, and then given back; the pool's other free slots stay free for its
 * callers. It never waits for another user's client: it does nothing while callers wait for one, and gives up
 * after `waitMs` (a client that arrives later is given back at once). Connections that fail to open are not
 * retried: the pool opens them on demand. Resolves with the pool's connections.
 */
export async function warmPool(pool: pg.Pool, count: number, waitMs = 2_000): Promise<number> {
  const max = (pool.options as { max?: number }).max ?? 10;
  const want = Math.min(count, max) - (pool.totalCount - pool.idleCount);
  if (want <= 0 || pool.waitingCount > 0) return pool.totalCount;
  let late = false;
  const held: pg.PoolClient[] = [];
  const each = Array.from({ length: want }, () =>
    pool.connect().then(
      (client) => {
        if (late) client.release();
        else held.push(client);
      },
      () => undefined,
    ),
  );
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    Promise.all(each),
    new Promise<void>((resolve) => {
      timer = setTimeout(resolve, waitMs);
    }),
  ]);
  clearTimeout(timer);
  late = true;
  for (const client of held) client.release();
  return pool.totalCount;
}

/**
 * Runs `fn` in a transaction on a client from the pool: COMMIT when it resolves, ROLLBACK when it throws.
 * A client whose connection broke is destroyed, not returned to the pool. While the transaction holds the
 * client, an 'error' listener is attached (pg-pool listens only while a client is idle in the pool): a
 * connection cut mid-transaction then rejects the call with `database_unavailable` instead of ending the
 * process with an unhandled 'error' event. Other failures are thrown as they came (`fn`'s own errors, SQLSTATEs).
 */
export async function withTransaction<T>(pool: pg.Pool, fn: (client: pg.PoolClient) => Promise<T>): Promise<T> {
  const client = await pool.connect();
  let broken: unknown;
  const onError = (err: Error): void => {
    broken ??= err;
  };
  client.on('error', onError);
  try {
    await client.query('BEGIN');
    try {
      const result = await fn(client);
      await client.query('COMMIT');
      return result;
    } catch (err) {
      await client.query('ROLLBACK').catch((rollbackErr: unknown) => {
        broken ??= rollbackErr;
      });
      throw err;
    }
  } catch (err) {
    if (isConnectionError(err)) broken ??= err;
    if (broken !== undefined && isConnectionError(err)) throw asActionLedgerError(err);
    throw err;
  } finally {
    client.off('error', onError);
    client.release(broken instanceof Error ? broken : undefined);
  }
}

/**
 * A named (prepared) form of a bound query: each connection parses and plans it once, then only executes it.
 * For statements whose plan does not depend on table sizes (key lookups, `unnest` batches): PostgreSQL may
 * switch a prepared statement to a generic plan, which for a claim over a queue that swings in size can be a
 * sequential scan (measured; docs/performance.md "Where an operation's database time goes" has the plan built
 * over a near-empty queue), so the claim is named only on a connection of its own whose planner settings rule
 * such plans out (dispatcher/claim-session.ts). The name is the text's hash, so two schemas' texts on one
 * connection never collide.
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
  return new ActionLedgerError(
    'database_unavailable',
    `cannot reach PostgreSQL (${what}): ${(cause as Error).message}`,
    { cause },
  );
}
