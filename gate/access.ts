/**
 * Who may act on a tool right now: the role table (default deny), the tenant's provider route, the role
 * revocations, and the kill switches. Read in the caller's transaction (or on the pool, for the
 * authorization service), so a revocation or a switch is seen by the next decision.
 */
import type { Config, GateTool } from '../config/index.js';
import type { Queryable } from '../db/index.js';
import { ActionLedgerError } from '../core/errors.js';
import type { gateQueries } from './queries.js';

export interface KillSwitchRow {
  tenant_id: string;
  tool_name: string;
  reason: string;
}

export class AccessChecks {
  readonly #config: Config;
  readonly #q: Readonly<typeof gateQueries>;

  constructor(config: Config, q: Readonly<typeof gateQueries>) {
    this.#config = config;
    this.#q = q;
  }

  /** Permission from the role table (default deny), the tenant's route, and the revocation list. */
  async permitted(db: Queryable, tool: GateTool, tenant: string, principal: string, role: string): Promise<boolean> {
    return this.granted(tool, tenant, role) && !(await this.roleRevoked(db, tenant, principal, role));
  }

  /**
   * The part of {@link permitted} that needs no database: the role table (default deny) and the tenant's route.
   * A call's revocation is read in its admission statement (gate/admission.ts).
   */
  granted(tool: GateTool, tenant: string, role: string): boolean {
    if (!tool.roles.has(role)) return false;
    const route = this.#config.tools.get(tool.name);
    return route !== undefined && route.allowedTenants.has(tenant);
  }

  /** Whether the principal's role in the tenant is revoked. */
  async roleRevoked(db: Queryable, tenant: string, principal: string, role: string): Promise<boolean> {
    return (await db.query(this.#q.roleRevoked, [tenant, principal, role])).rowCount !== 0;
  }

  /**
   * A kill switch may name only what the configuration knows, or '*': a misspelt tool or tenant would stop
   * nothing while looking like success. Throws `unknown_tool` or `unknown_tenant`, listing what is configured.
   */
  checkSwitchTarget(tenant: string, tool: string): void {
    const tools = new Set([...this.#config.tools.keys(), ...this.#config.gate.tools.keys()]);
    if (tool !== '*' && !tools.has(tool))
      throw new ActionLedgerError(
        'unknown_tool',
        `there is no tool named ${JSON.stringify(tool)}; configured: ${[...tools].sort().join(', ') || 'none'} (or * for every tool)`,
      );
    const tenants = new Set([...this.#config.tools.values()].flatMap((r) => [...r.allowedTenants]));
    if (tenant !== '*' && !tenants.has(tenant))
      throw new ActionLedgerError(
        'unknown_tenant',
        `no tool is routed for tenant ${JSON.stringify(tenant)}; configured: ${[...tenants].sort().join(', ') || 'none'} (or * for every tenant)`,
      );
  }

  /** The kill switch covering the tenant and tool ('*' in either matches), or null. */
  async killSwitch(db: Queryable, tenant: string, tool: string): Promise<KillSwitchRow | null> {
    const { rows } = await db.query<KillSwitchRow>(this.#q.killSwitchEngaged, [tenant, tool]);
    return rows[0] ?? null;
  }
}
