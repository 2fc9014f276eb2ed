/**
 * The reservation step: the operation reserved through the ledger on the gate's client, so the budgets, the
 * gate's record of the operation and the audit row commit (or roll back) in one transaction.
 */
import type { Queryable } from '../db/index.js';
import type { JsonObject } from '../core/json.js';
import type { Ledger, Reservation } from '../ledger/index.js';
import type { Budgets } from './budgets.js';
import type { Value } from './checks.js';
import type { gateQueries } from './queries.js';
import { refuse } from './refusal.js';

export interface ReservingContext {
  tenant_id: string;
  principal_id: string;
  task_id: string;
  workflow_step_id: string;
  role: string;
}

export class ReservationStep {
  readonly #ledger: Ledger;
  readonly #q: Readonly<typeof gateQueries>;
  readonly #budgets: Budgets;

  constructor(ledger: Ledger, q: Readonly<typeof gateQueries>, budgets: Budgets) {
    this.#ledger = ledger;
    this.#q = q;
    this.#budgets = budgets;
  }

  /**
   * Reserves the operation through the ledger on the gate's client (one transaction with the budgets and the
   * audit row), records the gate's view of it, and moves the subject's holds to it. A replayed step
   * (`created: false`) gives back what this call took: the effect exists once, so it is counted once.
   * Throws the ledger's coded errors (`operation_conflict` for the caller's own step reserved with other
   * arguments; the identity includes the tenant, so another tenant's steps never conflict); a replay of a step
   * reserved outside the gate is refused `operation_conflict`.
   */
  async reserve(
    db: Queryable,
    ctx: ReservingContext,
    tool: string,
    args: JsonObject,
    approval: { kind: 'auto' | 'proposal' | 'approval'; id: string; policyVersion: string },
    taken: { counters: string[]; value: Value | null; subject?: { proposal?: string; approval?: string } },
  ): Promise<Reservation> {
    const r = await this.#ledger.reserve(
      {
        tenant_id: ctx.tenant_id,
        principal_id: ctx.principal_id,
        task_id: ctx.task_id,
        workflow_step_id: ctx.workflow_step_id,
        approval_id: approval.id,
        policy_version: approval.policyVersion,
      },
      tool,
      args,
      // The gate's caller wakes the dispatchers once the decision has committed (GateCore.wakeIfReserved).
      { client: db, actor: `gate:${ctx.principal_id}`, notifyOnCommit: false },
    );
    const recorded = await db.query(this.#q.gateOperationInsert, [
      r.operation_id,
      ctx.tenant_id,
      ctx.principal_id,
      ctx.role,
      approval.kind,
    ]);
    // A replay whose operation the gate never recorded was reserved straight through the ledger (the trusted
    // path, no gate checks): taking it over would make it dispatchable under `direct_reservations: deny`
    // without its caps. Refused; the caller's transaction rolls back whatever the ledger's replay rebound.
    if (!r.created && recorded.rowCount === 1) {
      throw refuse(
        'operation_conflict',
        'this workflow step was reserved outside the gate (a direct reservation); use another workflow_step_id',
      );
    }
    const subject = taken.subject;
    if (r.created) {
      if (subject !== undefined) await this.#budgets.transferHolds(db, subject, r.operation_id);
      else await this.#budgets.hold(db, taken.counters, taken.value, { operation: r.operation_id });
    } else if (subject !== undefined) {
      await this.#budgets.releaseHolds(db, subject, 'replayed_step');
    } else {
      await this.#budgets.giveBack(db, taken.counters, taken.value);
    }
    return r;
  }
}
