/** What every change to the principal store shares: one transaction with its audit row, and the principal check. */
import { withTransaction, type Pool, type Queryable } from '../db/index.js';
import { ActionLedgerError, asActionLedgerError } from '../core/errors.js';
import { identifier } from '../core/identifier.js';
import type { AuditEntry, AuditWriter } from '../gate/index.js';
import type { principalQueries } from './queries.js';

/**
 * Runs `fn` in a transaction with its audit row (the actor in `detail.by`, and `detail()`'s fields, read after
 * `fn`); committed together or not at all. Throws coded errors (`audit_unavailable`, `storage_full`, ...).
 */
export async function audited<T>(
  pool: Pool,
  audit: AuditWriter,
  entry: AuditEntry,
  actor: string,
  fn: (c: Queryable) => Promise<T>,
  detail: () => Record<string, unknown> = () => ({}),
): Promise<T> {
  const by = identifier('actor', actor);
  try {
    return await withTransaction(pool, async (c) => {
      const out = await fn(c);
      await audit.decision(c, { ...entry, detail: { ...entry.detail, ...detail(), by } });
      return out;
    });
  } catch (err) {
    throw asActionLedgerError(err);
  }
}

/** Throws `not_found` unless the principal exists. */
export async function mustExist(c: Queryable, q: Readonly<typeof principalQueries>, id: string): Promise<void> {
  if ((await c.query(q.principalSelect, [id])).rowCount === 0)
    throw new ActionLedgerError('not_found', `there is no principal ${JSON.stringify(id)}: add it first`, {
      details: { principal_id: id },
    });
}
