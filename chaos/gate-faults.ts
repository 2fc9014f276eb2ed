/**
 * The gate's part of the chaos run's fault phase, through the library's own calls (never SQL): an agent
 * reserving operations with `Gate.call`, and an operator engaging and lifting kill switches (per tenant, per
 * tool and `*`) and revoking and restoring the agent's role.
 *
 * The agent's loop, per workflow step (several steps at once, as an agent's parallel tool calls): call -> accepted (the operation is the run's) | refused (a switch, the
 * revoked role, the database restarting) -> wait -> call again with the same step and arguments. A call whose
 * COMMIT was cut comes back as a refusal although it reserved: the next call is then the gate's replay of the
 * same step and answers with the same operation.
 *
 * The operator's loop: idle -> switch engaged (tenant | tool | `*`) -> lifted -> idle, or idle -> role revoked ->
 * restored -> idle; one change at a time, each held a seeded few hundred milliseconds. The first four changes
 * are one of each kind (in a seeded order), so even a short run does every kind. A call that throws (the
 * database restarting, a connection cut mid-COMMIT) is repeated until it returns: engaging, lifting, revoking
 * and restoring are all idempotent, and the run never leaves a switch engaged or a role revoked. Only a call
 * that returned counts as a change the gate decided; the checker then looks for its audit row.
 */
import type { Gate } from '../gate/index.js';
import type { GateChange } from './checker.js';
import type { Rng } from './rng.js';

export const AGENT = { tenant: 'tenant-a', principal: 'chaos-agent', role: 'agent' } as const;

type ChangeKind = 'tenant' | 'tool' | 'all' | 'role';

export interface GateFaultStats {
  accepted: number;
  refused: Record<string, number>;
  switchesEngaged: Record<'tenant' | 'tool' | 'all', number>;
  switchesLifted: number;
  rolesRevoked: number;
  rolesRestored: number;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

export class GateFaults {
  readonly stats: GateFaultStats = {
    accepted: 0,
    refused: {},
    switchesEngaged: { tenant: 0, tool: 0, all: 0 },
    switchesLifted: 0,
    rolesRevoked: 0,
    rolesRestored: 0,
  };
  /** Every change a gate call returned from: what the audit must hold. */
  readonly changes: GateChange[] = [];
  /** The operations the agent's accepted calls reserved, in the order they were accepted. */
  readonly reserved: { operation_id: string; effect_key: string }[] = [];
  readonly #gate: Gate;
  readonly #rng: Rng;
  readonly #tool: string;
  readonly #first: ChangeKind[];

  constructor(gate: Gate, rng: Rng, tool: string) {
    this.#gate = gate;
    this.#rng = rng;
    this.#tool = tool;
    const kinds: ChangeKind[] = ['tenant', 'tool', 'all', 'role'];
    this.#first = kinds
      .map((k) => [rng.next(), k] as const)
      .sort((a, b) => a[0] - b[0])
      .map(([, k]) => k);
  }

  /** True once every kind of change has been made at least once. */
  get everyKindDone(): boolean {
    return this.#first.length === 0;
  }

  /**
   * Makes `calls` agent calls over `lanes` concurrent callers (an agent's parallel tool calls), each call repeated
   * until accepted; `onReserved` sees each operation as it is accepted. Returns when all are accepted, or at
   * `deadline` (ms since the epoch) with the rest not made.
   */
  async agent(calls: number, lanes: number, deadline: number, onReserved: (effectKey: string) => void): Promise<void> {
    await Promise.all(
      Array.from({ length: lanes }, async (_, lane) => {
        for (let i = lane; i < calls && Date.now() < deadline; i += lanes) await this.#call(i, deadline, onReserved);
      }),
    );
  }

  async #call(i: number, deadline: number, onReserved: (effectKey: string) => void): Promise<void> {
    const context = {
      tenant_id: AGENT.tenant,
      principal_id: AGENT.principal,
      role: AGENT.role,
      account_id: 'account-1',
      conversation_id: `conversation-${i}`,
      turn_id: `turn-${i}`,
      trace_id: `trace-${i}`,
      task_id: `gate-task-${i}`,
      workflow_step_id: '1',
    };
    const args = { order_id: `g-${i}`, amount: 1 + (i % 997), currency: 'EUR' };
    while (Date.now() < deadline) {
      const r = await this.#gate.call(context, this.#tool, args);
      if (r.ok && r.status === 'reserved' && r.operation_id !== undefined && r.effect_key !== undefined) {
        this.stats.accepted++;
        this.reserved.push({ operation_id: r.operation_id, effect_key: r.effect_key });
        onReserved(r.effect_key);
        break;
      }
      const code = r.ok ? `unexpected ${r.status}` : r.error;
      this.stats.refused[code] = (this.stats.refused[code] ?? 0) + 1;
      await sleep(this.#rng.int(50, 250));
    }
    await sleep(this.#rng.int(5, 60));
  }

  /** Engages and lifts switches and revokes and restores the role until `active()` is false; ends with none held. */
  async operator(active: () => boolean): Promise<void> {
    while (active()) {
      await sleep(this.#rng.int(600, 2000));
      if (!active()) break;
      const kind = this.#first.shift() ?? this.#rng.pick(['tenant', 'tool', 'all', 'role'] as const);
      const holdMs = this.#rng.int(200, 900);
      if (kind === 'role') {
        await this.#revoke();
        await sleep(holdMs);
        await this.#restore();
      } else {
        const [tenant, tool] =
          kind === 'tenant' ? [AGENT.tenant, '*'] : kind === 'tool' ? ['*', this.#tool] : ['*', '*'];
        await this.#engage(kind, tenant, tool);
        await sleep(holdMs);
        await this.#lift(tenant, tool);
      }
    }
  }

  async #engage(kind: 'tenant' | 'tool' | 'all', tenant: string, tool: string): Promise<void> {
    // Engaging commits the switch (and its audit row) first, then waits for the covered operations at the
    // provider. A cut connection during that wait throws although the switch is engaged: engaging again then
    // would wait again, and under the proxy's faults with a hundred executing operations it never returned
    // (400 engagements audited for one switch, seed 1, 2000 operations). So a failure is followed by a look at
    // the switch table, and only a switch not there is engaged again.
    await untilDone(async () => {
      try {
        await this.#gate.engageKillSwitch(tenant, tool, 'chaos-operator', `chaos ${kind} switch`);
      } catch (err) {
        if (!(await this.#engaged(tenant, tool))) throw err;
      }
    });
    this.stats.switchesEngaged[kind]++;
    this.changes.push({ action: 'kill_switch', outcome: 'engaged', tenant_id: tenant, key: tool });
  }

  async #engaged(tenant: string, tool: string): Promise<boolean> {
    const rows = await this.#gate.killSwitches();
    return rows.some((r) => r.tenant_id === tenant && r.tool_name === tool);
  }

  async #lift(tenant: string, tool: string): Promise<void> {
    // A lift whose COMMIT was cut returns false when repeated: the switch is gone (lifted), but that return is
    // not the decision an audit row records, so it is no change the checker looks for.
    const lifted = await untilDone(() => this.#gate.liftKillSwitch(tenant, tool, 'chaos-operator'));
    this.stats.switchesLifted++;
    if (lifted) this.changes.push({ action: 'kill_switch', outcome: 'lifted', tenant_id: tenant, key: tool });
  }

  async #revoke(): Promise<void> {
    await untilDone(() => this.#gate.revokeRole(AGENT.tenant, AGENT.principal, AGENT.role, 'chaos-operator'));
    this.stats.rolesRevoked++;
    this.changes.push({
      action: 'role',
      outcome: 'revoked',
      tenant_id: AGENT.tenant,
      key: `${AGENT.principal}/${AGENT.role}`,
    });
  }

  async #restore(): Promise<void> {
    await untilDone(() => this.#gate.restoreRole(AGENT.tenant, AGENT.principal, AGENT.role, 'chaos-operator'));
    this.stats.rolesRestored++;
    this.changes.push({
      action: 'role',
      outcome: 'restored',
      tenant_id: AGENT.tenant,
      key: `${AGENT.principal}/${AGENT.role}`,
    });
  }
}

/** Repeats `call` until it returns (the database may be restarting or the connection cut); gives up after 3 min. */
async function untilDone<T>(call: () => Promise<T>): Promise<T> {
  const until = Date.now() + 180_000;
  for (;;) {
    try {
      return await call();
    } catch (err) {
      if (Date.now() > until) throw err;
      await sleep(200);
    }
  }
}
