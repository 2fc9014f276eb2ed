/**
 * Everything that reaches into node-postgres beyond its public API, in one place, each with a plain fallback:
 *
 * - `inOneWrite` corks the connection's socket (node-postgres's private `connection.stream`), so statements
 *   issued together leave in one write; plain: one write each.
 * - `queryThenCommit` subclasses `pg.Query` and holds back its Sync (a stand-in for the private
 *   `connection.sync`), so a statement and its COMMIT travel under one Sync; plain: the statement, then COMMIT,
 *   two round trips with the same outcomes (the COMMIT never runs after a failed statement).
 * - `parseConnectionString` is the copy of `pg-connection-string` that `pg` itself loads, so a second session
 *   reads `DATABASE_URL` exactly as the pool's connections do.
 *
 * The shortcuts were written against node-postgres {@link PG_PINNED} (package.json pins it exactly): with any
 * other version installed, or without the internals they use, the plain paths run ({@link PG_ADAPTER} says
 * which, and the runtime logs it once). Each shortcut has its own test against the pinned version, and the same
 * tests run the plain path.
 */
import type { EventEmitter } from 'node:events';
import { createRequire } from 'node:module';
import pg from 'pg';
import type { parse as Parse } from 'pg-connection-string';
import { isConnectionError } from '../core/sqlstate.js';

/** The node-postgres version the shortcuts were written and tested against. */
export const PG_PINNED = '8.23.1';

/** `tricks`: the shortcuts; `plain`: node-postgres's public API only. */
export type PgAdapterMode = 'tricks' | 'plain';

const requirePg = createRequire(createRequire(import.meta.url).resolve('pg'));

function installedPgVersion(): string {
  try {
    return (requirePg('pg/package.json') as { version: string }).version;
  } catch {
    return 'unknown';
  }
}

/**
 * Calls `issue`, which issues statements on `client` without awaiting between them (the pool pipelines them,
 * {@link createPool}), with the connection's socket corked: their messages leave in one write instead of one
 * write each. A socket write is a system call that also carries the segment through the server's TCP stack on
 * loopback and wakes it, about 0.2-0.3 ms of CPU each on these machines (docs/performance.md "Where the
 * dispatcher's CPU goes"). Returns what `issue` returns. Plain: one write each.
 */
export function inOneWrite<T>(client: pg.ClientBase, issue: () => T, mode: PgAdapterMode = PG_ADAPTER.mode): T {
  const stream =
    mode === 'tricks'
      ? (client as unknown as { connection?: { stream?: { cork?: () => void; uncork?: () => void } } }).connection
          ?.stream
      : undefined;
  // A stream without cork (a custom one node-postgres was given) writes as it did.
  const corks = typeof stream?.cork === 'function' && typeof stream.uncork === 'function';
  if (corks) stream.cork!();
  try {
    return issue();
  } finally {
    if (corks) stream.uncork!();
  }
}

/**
 * The statement of {@link queryThenCommit} ran and then its COMMIT failed (or its rows could not be read after the
 * COMMIT): the transaction is over, and whether it committed is for a fenced rewrite to settle.
 */
export class CommitFailed extends Error {
  constructor(cause: unknown) {
    super(`COMMIT failed: ${(cause as Error).message}`, { cause });
    this.name = 'CommitFailed';
  }
}

/** What {@link queryThenCommit} needs of node-postgres's connection and query: its extended-protocol steps. */
interface ProtocolConnection {
  parse(o: { text: string }): void;
  bind(o: object): void;
  execute(o: object): void;
  sync(): void;
}
interface QueryInternals {
  prepare(connection: ProtocolConnection): void;
  handleCommandComplete(msg: unknown, connection: ProtocolConnection): void;
  handleError(err: unknown, connection: ProtocolConnection): void;
  handleReadyForQuery(connection: ProtocolConnection): void;
}
const QueryWithInternals = pg.Query as unknown as new (
  config: pg.QueryConfig,
  callback: (err: Error | undefined, results: pg.QueryResult | pg.QueryResult[]) => void,
) => QueryInternals;

/**
 * A statement followed by COMMIT under one Sync: node-postgres writes a statement's Parse, Bind, Describe and
 * Execute, then COMMIT's Parse, Bind and Execute, then a single Sync. The server runs the COMMIT only after the
 * statement succeeded; after a failure it skips everything up to the Sync.
 */
class StatementThenCommit extends QueryWithInternals {
  /** Marks the query for observers of a client's `query` calls (the benchmark's probe): it also commits. */
  readonly thenCommit = true;
  /** The statement's CommandComplete arrived: a failure after it is the COMMIT's. */
  statementDone = false;
  /** The Sync's ReadyForQuery arrived: the client knows the transaction's state. */
  ready = false;
  /** Its messages were written: a Sync went, and its ReadyForQuery will come. */
  submitted = false;
  #failed = false;

  /** Always the extended protocol: without a name or values node-postgres would send the text alone, no COMMIT. */
  requiresPreparation(): boolean {
    return true;
  }

  override prepare(connection: ProtocolConnection): void {
    this.submitted = true;
    // The statement's own Sync is held back (the prototype's method is restored by deleting the stand-in).
    Object.assign(connection, { sync: () => undefined });
    try {
      super.prepare(connection);
    } finally {
      delete (connection as { sync?: unknown }).sync;
    }
    if (!this.#failed) {
      connection.parse({ text: 'COMMIT' });
      connection.bind({});
      connection.execute({});
    }
    // After a value that could not be bound, node-postgres closed the statement and failed the query: its Sync
    // still goes.
    connection.sync();
  }

  override handleCommandComplete(msg: unknown, connection: ProtocolConnection): void {
    super.handleCommandComplete(msg, connection);
    this.statementDone = true;
  }

  override handleError(err: unknown, connection: ProtocolConnection): void {
    this.#failed = true;
    super.handleError(err, connection);
  }

  override handleReadyForQuery(connection: ProtocolConnection): void {
    this.ready = true;
    super.handleReadyForQuery(connection);
  }
}

/**
 * Runs `statement` in the open transaction on `client` and COMMITs it, in one round trip. If the statement
 * fails, the COMMIT never runs and the transaction stays open, failed, with its locks: the caller can roll back
 * to a savepoint and go on under them (two statements pipelined would not do: the COMMIT of a failed transaction
 * rolls it back and lets the locks go). Resolves with the statement's result. Rejects with the statement's error
 * (the transaction open), with {@link CommitFailed} when the statement succeeded and the COMMIT did not (the
 * transaction over), or with a lost connection's error as it came. Plain: the statement, then COMMIT, in two round
 * trips with the same outcomes (the client's `getTransactionStatus()` is the transaction's once the server's next
 * ReadyForQuery has arrived, which the shortcut waits for and the plain path does not).
 */
export function queryThenCommit<R extends pg.QueryResultRow>(
  client: pg.ClientBase,
  statement: { name?: string; text: string; values: unknown[] },
  mode: PgAdapterMode = PG_ADAPTER.mode,
): Promise<pg.QueryResult<R>> {
  if (mode === 'plain') return plainQueryThenCommit<R>(client, statement);
  return new Promise((resolve, reject) => {
    let failed = false;
    const query = new StatementThenCommit(statement, (err, results) => {
      if (err === undefined || err === null) {
        // After a value that could not be bound, node-postgres calls back once more at the ReadyForQuery.
        if (!failed) resolve((Array.isArray(results) ? results[0] : results) as pg.QueryResult<R>);
        return;
      }
      failed = true;
      if (isConnectionError(err)) {
        reject(err);
        return;
      }
      const failure = query.statementDone ? new CommitFailed(err) : err;
      // An error arrives before the Sync's ReadyForQuery: settled after it (or after the connection closed, when
      // none will come), the client's transaction status (`getTransactionStatus`) is the transaction's.
      if (query.ready || !query.submitted) {
        reject(failure);
        return;
      }
      const connection = (client as unknown as { connection: EventEmitter }).connection;
      const settle = (): void => {
        connection.off('readyForQuery', settle);
        connection.off('end', settle);
        reject(failure);
      };
      connection.once('readyForQuery', settle);
      connection.once('end', settle);
    });
    client.query(query as unknown as pg.Submittable);
  });
}

async function plainQueryThenCommit<R extends pg.QueryResultRow>(
  client: pg.ClientBase,
  statement: { name?: string; text: string; values: unknown[] },
): Promise<pg.QueryResult<R>> {
  const result = await client.query<R>(statement);
  try {
    await client.query('COMMIT');
  } catch (err) {
    throw isConnectionError(err) ? err : new CommitFailed(err);
  }
  return result;
}

/** Whether node-postgres still has what the shortcuts use, by name (their behaviour is what the tests check). */
function internalsPresent(): boolean {
  const proto = (pg.Query as unknown as { prototype: Record<string, unknown> }).prototype;
  return ['prepare', 'handleCommandComplete', 'handleError', 'handleReadyForQuery'].every(
    (m) => typeof proto[m] === 'function',
  );
}

/** Which paths run in this process, and why. */
export const PG_ADAPTER: Readonly<{ mode: PgAdapterMode; installed: string; pinned: string }> = (() => {
  const installed = installedPgVersion();
  return Object.freeze({
    mode: installed === PG_PINNED && internalsPresent() ? 'tricks' : 'plain',
    installed,
    pinned: PG_PINNED,
  });
})();

/**
 * node-postgres's own reader of connection strings: the copy `pg` loads (not another version beside it), so a
 * connection of one's own reads `DATABASE_URL` exactly as the pool's connections do.
 */
export const parseConnectionString = (requirePg('pg-connection-string') as { parse: typeof Parse }).parse;
