/** What the `gate` subcommands share: their options and a gate over the configured database. */
import type { Runtime } from '../../runtime/index.js';
import type { AuditWriter, Gate } from '../../gate/index.js';
import { load } from './load.js';
import { EXIT, printRefusal, stderrLog, type OptionSpec } from '../cli-util.js';
import { actingAudit, authenticateActing, type Acting, type ActingRequest } from './acting.js';

export const GATE_EXITS = [EXIT.ok, EXIT.refused, EXIT.usage];

export const TENANT: OptionSpec = { type: 'string', value: 'T', required: true, description: 'tenant of the approval' };
/** The tenant of an action taken as someone: the token's, or named with --break-glass. */
export const ACTING_TENANT: OptionSpec = {
  type: 'string',
  value: 'T',
  description: 'tenant of the approval (with a token, its tenant: another one is refused)',
  default: "the token's tenant; required with --break-glass",
};
export const APPROVER: OptionSpec = {
  type: 'string',
  value: 'WHO',
  description: "a check: the reviewing principal, which must be the token's (or break-glass:NAME)",
  default: 'who acts',
};
export const ROLE: OptionSpec = {
  type: 'string',
  value: 'ROLE',
  required: true,
  description: "the reviewer's role (must be allowed to approve this tool)",
};
export const APPROVER_ROLE: OptionSpec = {
  type: 'string',
  value: 'ROLE',
  description: "the role to decide with: one the token's principal holds (with --break-glass, an approver role)",
  default: "the token principal's only role; required with --break-glass",
};
export const ACTOR: OptionSpec = {
  type: 'string',
  value: 'WHO',
  description: "a check: who acts, which must be the token's principal (or break-glass:NAME)",
  default: 'who acts',
};

/** Opens a gate over the configured database (migrated), writing its audit rows through `audit` when given. */
async function openGate<T>(
  fn: (gate: Gate, rt: Runtime) => Promise<T>,
  audit?: (rt: Runtime) => Promise<AuditWriter | undefined>,
): Promise<T> {
  const [{ openRuntime }, { EffectKeyer, Ledger }, { Gate }] = await Promise.all([
    load.runtime(),
    load.ledger(),
    load.gate(),
  ]);
  const rt = await openRuntime({ name: 'gate', migrate: true, defaultMetrics: false, logDestination: stderrLog() });
  const ledger = new Ledger(rt.config, rt.pool, new EffectKeyer(rt.effectKeys));
  try {
    const writer = audit === undefined ? undefined : await audit(rt);
    const gate = new Gate({
      config: rt.config,
      pool: rt.pool,
      ledger,
      withoutValidators: true,
      withoutResolvers: true,
      ...(writer === undefined ? {} : { audit: writer }),
    });
    return await fn(gate, rt);
  } finally {
    ledger.stop();
    await rt.close();
  }
}

/**
 * Runs `fn` with a gate over the configured database (migrated), then closes it; a refusal becomes one JSON
 * line on stdout and the exit code 1.
 */
export async function withGate(fn: (gate: Gate, rt: Runtime) => Promise<number>): Promise<number> {
  try {
    return await openGate(fn);
  } catch (err) {
    return printRefusal(err);
  }
}

/**
 * {@link withGate} acting as someone: the token is authenticated first (a refusal, `unauthenticated`, runs
 * nothing); a break-glass operator's audit rows say `break_glass: true`.
 */
export async function withActingGate(
  req: ActingRequest,
  fn: (gate: Gate, rt: Runtime, acting: Acting) => Promise<number>,
): Promise<number> {
  let acting: Acting | undefined;
  try {
    return await openGate(
      (gate, rt) => fn(gate, rt, acting as Acting),
      async (rt) => {
        acting = await authenticateActing(rt, req);
        return actingAudit(rt, acting);
      },
    );
  } catch (err) {
    return printRefusal(err);
  }
}
