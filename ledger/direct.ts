/**
 * The trusted-service path from outside the process (the HTTP API's `POST /v1/operations`): a reservation
 * straight in the ledger, with no gate checks. The built-in authorization service allows such an operation at
 * dispatch only when `gate.direct_reservations` is `allow`; the reservation itself is accepted either way.
 *
 * One thing the ledger's own replay would allow is refused here, in the replay's transaction (so nothing
 * of it is kept): a replay of a step the gate reserved. The ledger would rebind that operation's approval id
 * and policy version to the ones given here, taking over an operation whose authorization rests on the gate's
 * record (the mirror of the gate refusing to take over a direct reservation, gate/reservation.ts). Another
 * tenant's step is another operation: the identity includes the tenant.
 */
import { bindQueries, withTransaction, type Pool } from '../db/index.js';
import { ActionLedgerError, asActionLedgerError } from '../core/errors.js';
import type { TrustedContext } from '../core/types.js';
import { ledgerTenantQueries } from './queries.js';
import type { Ledger, Reservation } from './reserve.js';

export class DirectReservations {
  readonly #pool: Pool;
  readonly #ledger: Ledger;
  readonly #q: Readonly<typeof ledgerTenantQueries>;

  constructor(pool: Pool, schemaQuoted: string, ledger: Ledger) {
    this.#pool = pool;
    this.#ledger = ledger;
    this.#q = bindQueries(ledgerTenantQueries, schemaQuoted);
  }

  /**
   * Reserves like {@link Ledger.reserve} (the same step with the same arguments again is the same operation,
   * `created: false`; other arguments are `operation_conflict`), and throws `operation_conflict` for a step the
   * gate reserved. Every failure is a coded {@link ActionLedgerError}.
   */
  async reserve(
    context: TrustedContext,
    tool: string,
    args: unknown,
    options: { actor: string },
  ): Promise<Reservation> {
    // A new step is one statement on the pool, its own commit; a step reserved before is replayed in a
    // transaction that also reads whether the gate reserved it. Once the step's row is visible, so is its
    // gate record: the gate writes both in one transaction.
    const fresh = await this.#ledger.reserveIfNew(context, tool, args, { actor: options.actor });
    if (fresh !== null) return fresh;
    try {
      const reserved = await withTransaction(this.#pool, async (client) => {
        const r = await this.#ledger.reserve(context, tool, args, {
          client,
          actor: options.actor,
          notifyOnCommit: false,
        });
        if (!r.created && (await client.query(this.#q.gateRecordedOperation, [r.operation_id])).rowCount !== 0)
          throw new ActionLedgerError(
            'operation_conflict',
            'this workflow step was reserved through the gate; a direct reservation cannot take it over: use another workflow_step_id',
          );
        return r;
      });
      if (reserved.created) this.#ledger.wake(reserved.operation_id);
      return reserved;
    } catch (err) {
      throw asActionLedgerError(err);
    }
  }
}
