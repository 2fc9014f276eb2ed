/** The engaged kill switches, read without a gate: what `gate kill-switch list` shows under a read-only role. */
import { bindQueries, type Queryable } from '../db/index.js';
import { gateQueries } from './queries.js';

export interface KillSwitchRow {
  tenant_id: string;
  /** A configured tool, or `*` for every tool of the tenant. */
  tool_name: string;
  engaged_at: Date;
  engaged_by: string;
  reason: string;
}

/** Every engaged switch, oldest first. Throws only what PostgreSQL throws. */
export async function listKillSwitches(db: Queryable, schemaQuoted: string): Promise<KillSwitchRow[]> {
  const { rows } = await db.query<KillSwitchRow>(bindQueries(gateQueries, schemaQuoted).killSwitchList);
  return rows;
}
