/**
 * What the `principal`, `principal slack` and `token` commands share: the principal store opened on the
 * configured database, either with whoever acts established and audited, or read-only, and one-ID parsing.
 */
import type { Runtime } from '../../runtime/index.js';
import type { PrincipalStore } from '../../principals/index.js';
import { EXIT, printRefusal, readOnlyRuntime, stderrLog, usageError, type Command, type Parsed } from '../cli-util.js';
import { load } from './load.js';
import { actingAudit, authenticateActing, type Acting, type ActingRequest } from './acting.js';

export const PRINCIPAL_EXITS = [EXIT.ok, EXIT.refused, EXIT.usage];

/**
 * Opens the configured database (migrated; no effect-key secret needed), establishes who acts and runs `fn`
 * with a principal store whose audit rows name them; a failure is printed as a refusal.
 */
export async function withStore(
  req: ActingRequest,
  fn: (store: PrincipalStore, acting: Acting, rt: Runtime) => Promise<number>,
): Promise<number> {
  try {
    const [{ openRuntime }, { PrincipalStore }] = await Promise.all([load.runtime(), load.principals()]);
    const rt = await openRuntime({
      name: 'principal',
      migrate: true,
      effectKeys: false,
      defaultMetrics: false,
      logDestination: stderrLog(),
    });
    try {
      const acting = await authenticateActing(rt, req);
      return await fn(new PrincipalStore(rt.config, rt.pool, await actingAudit(rt, acting)), acting, rt);
    } finally {
      await rt.close();
    }
  } catch (err) {
    return printRefusal(err);
  }
}

/** Opens the configured database read-only (no migrations, no secrets) and runs `fn` with a principal store. */
export async function withReadStore(json: boolean, fn: (store: PrincipalStore) => Promise<number>): Promise<number> {
  try {
    const [{ openRuntime }, { PrincipalStore }] = await Promise.all([load.runtime(), load.principals()]);
    const rt = await openRuntime({ name: 'principal', ...readOnlyRuntime() });
    try {
      return await fn(new PrincipalStore(rt.config, rt.pool));
    } finally {
      await rt.close();
    }
  } catch (err) {
    return printRefusal(err, { json });
  }
}

/** The one ID of a parsed invocation, or the usage error's exit code. */
export function oneId(cmd: Command, parsed: Parsed, what: string): string | number {
  const [id, ...extra] = parsed.positionals;
  if (id === undefined || extra.length > 0) return usageError(cmd, `expected one ${what}`);
  return id;
}
