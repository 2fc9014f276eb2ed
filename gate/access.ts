/**
 * Who may act on a tool right now: the role table (default deny), the tenant's provider route, the role
 * revocations, and the kill switches. Read in the caller's transaction (or on the pool, for the
 * authorization service), so a revocation or a switch is seen by the next decision.
 */
import type { Config, GateTool } from '../core/config.js';
import type { Queryable } from '../core/db.js';
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
    if (!tool.roles.has(role)) return false;
    const route = this.#config.tools.get(tool.name);
    if (route === undefined || !route.allowedTenants.has(tenant)) return false;
    return !(await this.roleRevoked(db, tenant, principal, role));
  }

  /** Whether the principal's role in the tenant is revoked. */
  async roleRevoked(db: Queryable, tenant: string, principal: string, role: string): Promise<boolean> {
    return (await db.query(this.#q.roleRevoked, [tenant, principal, role])).rowCount !== 0;
  }

  /** The kill switch covering the tenant and tool ('*' in either matches), or null. */
  async killSwitch(db: Queryable, tenant: string, tool: string): Promise<KillSwitchRow | null> {
    const { rows } = await db.query<KillSwitchRow>(this.#q.killSwitchEngaged, [tenant, tool]);
    return rows[0] ?? null;
  }
}
